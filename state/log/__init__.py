"""What a warehouse remembers between runs and who may write it: the batch log, progress, the source tables' pointers,
the lock and its lease, the consistency checks."""
