"""Pipeline stages (bronze ingest, silver join, demo), the CLI and the config."""
