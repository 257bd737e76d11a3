"""The same batch on an empty warehouse and after ten times its rows already joined: what history costs a batch.

One stream, cut into Parquet files of ``--file-rows`` records per relation in arrival order. Its last ``--batch-files``
files per relation are **the batch**; the ``--history`` times as many files before them are **the history**. Each
round, in one Spark session:

1. an empty warehouse ingests the batch's files (``Pipeline.ingest``), then runs (``Pipeline.run``): one batch;
2. another warehouse ingests the history's files and runs, then ingests the batch's files and runs.

Both warehouses bound their state (a band window and an allowed lateness, as a deployment that runs for months
would), so what the history leaves is bronze, gold, the logs and the state the window keeps. Prints the seconds of the
batch's ingest and run on each warehouse and their ratio (the target: within 1.2×); writes a JSON.

    .venv/bin/python -m benchmarks.history [--engine delta-rs|spark] [--file-rows 20000] [--batch-files 2] [--history 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from pyspark.sql import SparkSession

from benchmarks.peers import RELATIONS, landed_batches
from benchmarks.report import write_json
from pipelines.api import Pipeline
from pipelines.commands.demo import DemoOptions
from pipelines.spark import get_spark

WINDOW = 1_000  # ts units: the band window every warehouse joins within
LATENESS = 2_000  # ts units: the stream's disorder


def join_batch(
    spark: SparkSession, root: str, engine: str, history: list[dict[str, str]], batch: list[dict[str, str]]
) -> dict[str, float]:
    """``history``'s files ingested and joined (untimed), then ``batch``'s: the seconds of its ingest and of its run."""
    config = {
        "relations": {rel.name: {"required": ["key"]} for rel in RELATIONS},
        "engine": engine,
        "window": WINDOW,
        "allowed_lateness": LATENESS,
    }
    pipeline = Pipeline(root, config=config, spark=spark)
    for files in [part for part in (history, batch) if part]:
        started = time.perf_counter()
        for rel in RELATIONS:
            pipeline.ingest(rel.name, [chunk[rel.name] for chunk in files])
        ingested = time.perf_counter()
        report = pipeline.run()
        ran = time.perf_counter()
    return {
        "ingest_s": ingested - started,
        "run_s": ran - ingested,
        "batches": len(report.batches),
        "pairs": sum(b.pairs for b in report.batches),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        choices=["delta-rs", "spark"],
        default="delta-rs",
        help="lakejoin's Delta engine (spark needs LAKEJOIN_DELTA_JARS)",
    )
    parser.add_argument("--file-rows", type=int, default=20_000, help="records per relation in a file (default 20000)")
    parser.add_argument("--batch-files", type=int, default=2, help="files per relation in the batch (default 2)")
    parser.add_argument(
        "--history", type=int, default=10, help="the history's rows as a multiple of the batch's (default 10)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="default benchmarks/results/history[_spark].json")
    args = parser.parse_args()
    args.out = args.out or f"benchmarks/results/history{'_spark' if args.engine == 'spark' else ''}.json"

    files = args.batch_files * (args.history + 1)
    rows = files * args.file_rows
    root = tempfile.mkdtemp(prefix="lakejoin-history-")
    chunks = landed_batches(
        DemoOptions(rows=rows, keys=rows // 4, skew=0.0, disorder=LATENESS, seed=7),
        args.file_rows,
        os.path.join(root, "landing"),
    )
    history, batch = chunks[: -args.batch_files], chunks[-args.batch_files :]
    spark = get_spark()
    join_batch(spark, os.path.join(root, "warm"), args.engine, [], batch)

    rounds: dict[str, list[dict[str, float]]] = {"empty": [], "history": []}
    for number in range(args.rounds):
        for name, before in (("empty", []), ("history", history)):
            rounds[name].append(join_batch(spark, os.path.join(root, f"{name}-{number}"), args.engine, before, batch))
            print(f"round {number + 1}: {name} {rounds[name][-1]}", flush=True)
    figures = {
        name: {key: statistics.median(run[key] for run in runs) for key in ("ingest_s", "run_s")} | {"rounds": runs}
        for name, runs in rounds.items()
    }
    ratios = {
        f"{key}_history_over_empty": figures["history"][key] / figures["empty"][key] for key in ("ingest_s", "run_s")
    }
    print(
        f"\nlakejoin on {args.engine}: a batch of {args.batch_files * args.file_rows} records per relation, after {args.history}× its rows "
        f"joined or on an empty warehouse; medians of {args.rounds} rounds"
    )
    for key in ("ingest_s", "run_s"):
        print(
            f"{key:<10} empty {figures['empty'][key]:6.2f} s   history {figures['history'][key]:6.2f} s   {ratios[f'{key}_history_over_empty']:.2f}×"
        )
    write_json(
        args.out,
        {
            "config": vars(args),
            "history_rows_per_relation": rows - args.batch_files * args.file_rows,
            "systems": figures,
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()
