"""A batch's steps, one module each, in the order pipelines/silver.py runs them: plan, land, read, measure, emit,
write."""
