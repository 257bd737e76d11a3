"""Two Structured Streaming queries, one per relation, land JSON files in one warehouse through
``Pipeline.foreach_batch``; then the pipeline joins what landed. Run as a process of its own by tests/test_api.py,
which kills it at random moments and starts it again from the same checkpoints.

Usage: python -m tests.stream_feeder WAREHOUSE LANDING CHECKPOINTS (LANDING holds a folder per relation, r and s).
"""

from __future__ import annotations

import os
import sys

from pipelines import Pipeline
from pipelines.spark import get_spark

SCHEMA = "id STRING, ts BIGINT, key STRING"


def main(warehouse: str, landing: str, checkpoints: str) -> None:
    spark = get_spark()
    pipeline = Pipeline(warehouse, {"engine": "auto"}, spark=spark)
    queries = [
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(os.path.join(landing, name))
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
