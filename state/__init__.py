"""Silver-stage state: relations, the store/probe joiner, the batch log and the Delta engines."""
