"""The store/probe join and what a batch of each join kind keeps, emits and evicts."""
