"""What share of a batch goes to data-quality rules, at the demo's batch size, per expectations engine.

Streams the demo's data (20,000 records per relation, chunks of 4,000, batches of at most 2,000) through
ingest + run once per engine (pandas: a batch's rows on the driver; spark: Spark DataFrames), and reports
the seconds spent on rules (building the checked columns, Great Expectations, policies) against the
batches' seconds. Target: at most 25% with the default engine. Writes every figure to JSON.

    .venv/bin/python -m benchmarks.expectations_cost [--rows N] [--engines pandas,spark]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from benchmarks.report import write_json
from benchmarks.stream import replay
from state.config import Config
from pipelines.demo import DemoOptions, generate_stream, write_chunks
from pipelines.spark import get_spark
from state.engines import make_engine
from state.layout import Warehouse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="records per relation (default 20000, the demo's)")
    parser.add_argument("--max-batch-rows", type=int, default=2_000)
    parser.add_argument("--engines", default="pandas,spark", help="comma-separated expectations engines to measure")
    parser.add_argument("--out", default="benchmarks/results/expectations_cost.json")
    args = parser.parse_args()

    options = DemoOptions(rows=args.rows, max_batch_rows=args.max_batch_rows)
    workdir = tempfile.mkdtemp(prefix="lakejoin-bench-dq-")
    chunks = write_chunks(generate_stream(options), workdir, options.chunk_rows)
    spark = get_spark()
    engine = make_engine(spark, "delta-rs")
    results = {}
    for name in args.engines.split(","):
        config = Config(max_batch_rows=args.max_batch_rows, engine="delta-rs", expectations={"engine": name})
        reports = replay(engine, Warehouse(os.path.join(workdir, f"warehouse-{name}")), config, chunks)
        batch, checks = [r.seconds for r in reports], [r.check_seconds for r in reports]
        results[name] = {
            "batches": len(reports),
            "batch_seconds": sum(batch),
            "check_seconds": sum(checks),
            "share": sum(checks) / sum(batch),
            "median_batch_s": statistics.median(batch),
            "median_check_s": statistics.median(checks),
            "per_batch_share_median": statistics.median(c / b for c, b in zip(checks, batch)),
        }
        figures = results[name]
        print(f"{name}: {figures['batches']} batches, rules {figures['check_seconds']:.1f} s of {figures['batch_seconds']:.1f} s "
              f"batch time = {figures['share']:.0%} (median per batch {figures['median_check_s']:.2f} of {figures['median_batch_s']:.2f} s)",
              flush=True)
    write_json(args.out, {"config": vars(args), "engines": results})
    print(f"written: {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()
