"""Two Structured Streaming queries, one per relation, land JSON files in one warehouse through
``Pipeline.foreach_batch``; then the pipeline joins what landed. Run as a process of its own by tests/test_api.py,
which kills it at random moments and starts it again from the same checkpoints (one a kill left while the first
offset was written is removed first, as docs/operations.md says).

Usage: python -m tests.stream_feeder WAREHOUSE LANDING CHECKPOINTS (LANDING holds a folder per relation, r and s).
"""

from __future__ import annotations

import os
import shutil
import sys

from pipelines import Pipeline
from pipelines.spark import get_spark

SCHEMA = "id STRING, ts BIGINT, key STRING"


def never_ran(checkpoint: str) -> bool:
    """A checkpoint whose stream was killed while it wrote its first offset: Spark 4.1 refuses to start from it
    (docs/operations.md), and no micro-batch of it ran, so it can go."""
    offsets = os.path.join(checkpoint, "offsets")
    return os.path.isdir(offsets) and not any(name.isdigit() for name in os.listdir(offsets))


def main(warehouse: str, landing: str, checkpoints: str) -> None:
    spark = get_spark()
    pipeline = Pipeline(warehouse, {"engine": "auto"}, spark=spark)
    for name in ("r", "s"):
        if never_ran(os.path.join(checkpoints, name)):
            shutil.rmtree(os.path.join(checkpoints, name))
    queries = [
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(os.path.join(landing, name))
        .writeStream.foreachBatch(pipeline.foreach_batch(name))
        .option("checkpointLocation", os.path.join(checkpoints, name))
        .trigger(availableNow=True)
        .start()
        for name in ("r", "s")
    ]
    for query in queries:
        query.awaitTermination()
    print(pipeline.run(max_batch_rows=8).describe(), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
