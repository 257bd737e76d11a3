"""The one road into bronze: files found and landed, parsed, typed, classified and appended, and the ingest log."""
