"""What a landed file and a micro-batch cost, on one engine: the figures for sizing ``max_batch_rows``.

A user picks ``max_batch_rows`` (arrivals per micro-batch, every relation's together; default 1,000,000) and how often
files land. Both trade a fixed cost (per ingested file, per batch: Spark jobs and Delta commits) against a cost per
row. This measures them on the peers benchmark's stream (two relations, an equi-join on the key, unbounded state):

1. ingest: ``--rows`` records per relation, out of order, land as ``--files`` Parquet files per relation, ingested one
   at a time as they would land (the relations alternating); each ``Pipeline.ingest`` call is timed;
2. batches: the ingested warehouse is copied once per batch size before any run, so every run starts from the same
   bronze, and each copy is joined by one timed ``Pipeline.run`` with ``max_batch_rows`` 10,000, 100,000
   (``--max-batch-rows``) and every arrival (one batch). Every run must give the same pairs. A least-squares fit over
   the runs, ``run seconds = batches x per_batch + arrivals x per_row``, gives the cost of a batch and of a million
   arrivals.

Every run joins the same arrivals, so ``arrivals x per_row`` is the fit's intercept: it also holds what a run costs
once (opening the warehouse, its lock), and ``per_batch`` the mean cost of a batch over a state that grows along the
stream. One engine per process (``--engine``; spark needs ``LAKEJOIN_DELTA_JARS``). Run it alone: timings on a shared
machine are noisy.

    .venv/bin/python -m benchmarks.sizing [--engine delta-rs|spark] [--rows 200000] [--keys 50000] [--files 20]
        [--max-batch-rows 10000 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
from pyspark.sql import SparkSession

from benchmarks.peers import landed_batches, phase_medians, same_pairs
from benchmarks.report import machine, write_json
from pipelines import Pipeline
from pipelines.commands.demo import DemoOptions
from pipelines.spark import DELTA_JARS, get_spark
from state.engines import session_has_delta
from state.errors import LakejoinError


def ingest(spark: SparkSession, warehouse: str, config: dict, batches: list[dict[str, str]]) -> list[tuple[float, int]]:
    """Every landed file, in landing order, one timed ``ingest`` call each: each call's seconds and rows landed. The
    first ingest records ``config``, which the runs then use."""
    pipeline = Pipeline(warehouse, config=config, spark=spark)
    ingested = []
    for files in batches:
        for name, path in files.items():
            started = time.perf_counter()
            (result,) = pipeline.ingest(name, [path])
            ingested.append((time.perf_counter() - started, result.landed))
    return ingested


def join(spark: SparkSession, warehouse: str, max_batch_rows: int) -> dict:
    """One timed ``run`` of a copy of the ingested warehouse, joining every arrival in batches of ``max_batch_rows``."""
    started = time.perf_counter()
    report = Pipeline(warehouse, spark=spark).run(max_batch_rows=max_batch_rows)
    seconds = time.perf_counter() - started
    return {
        "max_batch_rows": max_batch_rows,
        "seconds": seconds,
        "batches": len(report.batches),
        "arrivals": report.arrivals,
        "pairs": report.pairs,
        "seconds_per_batch": seconds / len(report.batches),
        "batch_s": [batch.seconds for batch in report.batches],  # each batch's own, without the run's opening
        "batch_phase_p50_s": phase_medians([batch.phases for batch in report.batches]),
    }


def fit(runs: list[dict]) -> dict:
    """Least squares of ``seconds = batches x per_batch + arrivals x per_row`` over the runs, and each run's residual."""
    design = np.array([[run["batches"], run["arrivals"]] for run in runs], dtype=float)
    seconds = np.array([run["seconds"] for run in runs])
    (per_batch, per_row), *_ = np.linalg.lstsq(design, seconds, rcond=None)
    return {
        "per_batch_s": float(per_batch),
        "per_million_arrivals_s": float(per_row * 1e6),
        "residuals_s": [float(r) for r in seconds - design @ np.array([per_batch, per_row])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine", choices=["delta-rs", "spark"], default="delta-rs", help="spark needs LAKEJOIN_DELTA_JARS"
    )
    parser.add_argument("--rows", type=int, default=200_000, help="records per relation (default 200000)")
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--disorder", type=int, default=2_000)
    parser.add_argument("--files", type=int, default=20, help="Parquet files per relation (default 20)")
    parser.add_argument(
        "--max-batch-rows",
        type=int,
        nargs="+",
        default=[10_000, 100_000],
        help="the runs' batch sizes, below 2 x rows; a run with every arrival in one batch is added (default 10000 100000)",
    )
    parser.add_argument("--out", help="default benchmarks/results/sizing.json, with --engine spark sizing_spark.json")
    args = parser.parse_args()
    args.out = args.out or f"benchmarks/results/{'sizing_spark' if args.engine == 'spark' else 'sizing'}.json"

    began, load_before = time.perf_counter(), os.getloadavg()[0]
    spark = get_spark()
    if args.engine == "spark" and not session_has_delta(spark):
        raise LakejoinError(f"the Spark engine needs Delta Lake's JVM jars: set {DELTA_JARS} to their folder")
    root = tempfile.mkdtemp(prefix="lakejoin-sizing-")
    options = DemoOptions(rows=args.rows, keys=args.keys, skew=0.0, disorder=args.disorder, seed=7)
    batches = landed_batches(options, args.rows // args.files, os.path.join(root, "landing"))

    bronze = os.path.join(root, "bronze")
    ingested = ingest(spark, bronze, {"engine": args.engine}, batches)
    ingest_s, rows = [seconds for seconds, _ in ingested], sum(landed for _, landed in ingested)
    sizes = (*args.max_batch_rows, 2 * args.rows)
    copies = [shutil.copytree(bronze, os.path.join(root, f"run-{number}")) for number in range(len(sizes))]
    runs = [join(spark, copy, size) for copy, size in zip(copies, sizes)]
    golds = [Pipeline(copy, spark=spark).table("gold").select("r_id", "s_id") for copy in copies]
    if len({run["pairs"] for run in runs}) > 1 or not all(same_pairs(gold, golds[0]) for gold in golds[1:]):
        raise SystemExit(f"the runs gave different pairs: {[run['pairs'] for run in runs]}")
    fitted = fit(runs)
    figures = {
        "ingest": {
            "files": len(ingest_s),
            "rows": rows,
            "seconds": ingest_s,
            "per_file_p50_s": statistics.median(ingest_s),
            "per_million_rows_p50_s": statistics.median(seconds / landed for seconds, landed in ingested) * 1e6,
        },
        "runs": runs,
        "fit": fitted,
    }
    where = (
        f"{machine()}, Spark {spark.version}, local[2]; "
        f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )

    print(
        f"\nlakejoin on {args.engine}; {args.rows:,} records per relation, {args.keys:,} keys, disorder {args.disorder}, "
        f"{args.files} Parquet files per relation, unbounded state; {where}"
    )
    print(
        f"ingest: {len(ingest_s)} files, {rows:,} rows: median {figures['ingest']['per_file_p50_s']:.2f} s a file, "
        f"{figures['ingest']['per_million_rows_p50_s']:.1f} s per million rows (medians)"
    )
    print(
        f"{'max_batch_rows':>14} {'batches':>8} {'arrivals':>9} {'pairs':>9} {'run s':>7} {'s / batch':>10} {'residual s':>11}"
    )
    for run, residual in zip(runs, fitted["residuals_s"]):
        print(
            f"{run['max_batch_rows']:>14,} {run['batches']:>8} {run['arrivals']:>9,} {run['pairs']:>9,} {run['seconds']:>7.1f} "
            f"{run['seconds_per_batch']:>10.2f} {residual:>11.2f}"
        )
    print(f"same pairs in every run: yes ({runs[0]['pairs']:,})")
    print(
        f"fit: run s = batches x {fitted['per_batch_s']:.2f} s + arrivals x {fitted['per_million_arrivals_s']:.1f} s per million"
    )
    for run in runs:
        print(
            f"batch phases at {run['max_batch_rows']:,} (median s): "
            + ", ".join(f"{phase} {s:.2f}" for phase, s in list(run["batch_phase_p50_s"].items())[:6])
        )
    wall_s = time.perf_counter() - began
    write_json(args.out, {"config": vars(args), "machine": where, "wall_s": wall_s, **figures})
    print(f"written: {args.out} ({wall_s:.0f} s in all)")
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
