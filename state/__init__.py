"""The bottom layer: the config every layer reads, relations, the store/probe joiner, the state tables, the batch log
and the Delta engines."""
