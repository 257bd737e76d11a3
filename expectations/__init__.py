"""Data-quality checks of the pipeline's tables: reconciliation of gold against the batch join."""
