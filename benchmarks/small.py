"""A batch of a few rows: what a scheduled run and the test suite's small batches cost, beside the same work by hand.

Three scenarios, each through the Python API (``Pipeline``) and by hand in plain Spark (benchmarks/by_hand.py), in one
session, medians:

(a) **scheduled**: each run finds one JSON Lines file of 2 records per relation in its landing folder. lakejoin:
    ``Pipeline.run()`` with the landing folders in its config (its batch lands the files and joins them); by hand: the files
    read, bronze appended, the batch joined. ``--runs`` runs after ``--warm`` untimed ones.
(c) **ingested**: each run is given one JSON Lines file of 2 records per relation: ``Pipeline.ingest`` of each file,
    then ``Pipeline.run()``; by hand as (a).
(b) **drain**: 40 records per relation already ingested (alternately, 4 records of a relation per file) are joined in
    batches of 8 arrivals: lakejoin's ``Pipeline.run(max_batch_rows=8)``, 10 batches; by hand, each batch's slice
    read back from bronze, then joined. Per batch: a run's seconds over its batches; ``--rounds`` runs of each after
    one untimed.

    .venv/bin/python -m benchmarks.small [--engine delta-rs|spark] [--runs 15] [--warm 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from pyspark.sql import SparkSession

from benchmarks.by_hand import RELATIONS, ByHand
from benchmarks.report import LOG_READERS, require_engine, use_log_reader, write_json
from pipelines.api import Pipeline
from pipelines.spark import get_spark

SCHEMA = "id string, ts bigint, key bigint, payload string"
DRAIN_FILES, DRAIN_FILE_ROWS, DRAIN_BATCH = 10, 4, 8  # per relation: 40 records, joined 8 arrivals at a time


def records(name: str, start: int, count: int, keys: int | None = 2) -> list[dict[str, object]]:
    """``count`` records of relation ``name`` from place ``start``, on ``keys`` keys, so that every batch has pairs;
    None: a key per place, so that each record pairs with the other relation's at its place alone."""
    return [
        {
            "id": f"{name}{place}",
            "ts": 10 * place + (name == "s"),
            "key": place if keys is None else place % keys,
            "payload": f"{name}-{place}",
        }
        for place in range(start, start + count)
    ]


def write_jsonl(path: str, rows: list[dict[str, object]]) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def scheduled(
    spark: SparkSession, engine: str, root: str, runs: int, warm: int, ingested: bool = False
) -> dict[str, list[float]]:
    """(a), or (c) when ``ingested``: seconds per run, lakejoin's and by hand, runs interleaved (warm-up runs dropped)."""
    scenario = "(c)" if ingested else "(a)"
    root = os.path.join(root, scenario.strip("()"))
    landing = {name: os.path.join(root, "landing", name) for name in RELATIONS}
    relations = {
        name: {"required": ["key"], **({} if ingested else {"landing": folder})} for name, folder in landing.items()
    }
    for folder in landing.values():
        os.makedirs(folder)
    pipeline = Pipeline(os.path.join(root, "lakejoin"), config={"relations": relations, "engine": engine}, spark=spark)
    by_hand = ByHand(spark, engine, os.path.join(root, "by-hand"))
    seconds: dict[str, list[float]] = {"lakejoin": [], "by hand": []}
    for number in range(warm + runs):
        files = {
            name: write_jsonl(os.path.join(landing[name], f"run-{number:03d}.jsonl"), records(name, 2 * number, 2))
            for name in RELATIONS
        }
        started = time.perf_counter()
        if ingested:
            for name, path in files.items():
                pipeline.ingest(name, path)
        pipeline.run()
        lakejoin = time.perf_counter() - started
        started = time.perf_counter()
        arrivals = {name: spark.read.schema(SCHEMA).json(path) for name, path in files.items()}
        by_hand.land(arrivals)
        by_hand.join(arrivals, number + 1)
        done = time.perf_counter() - started
        if number >= warm:
            seconds["lakejoin"].append(lakejoin)
            seconds["by hand"].append(done)
        print(f"{scenario} run {number + 1}: lakejoin {lakejoin:.2f} s, by hand {done:.2f} s", flush=True)
    return seconds


def drain(spark: SparkSession, engine: str, root: str, rounds: int) -> dict[str, list[float]]:
    """(b): seconds per batch of each round (after an untimed one), lakejoin's and by hand."""
    seconds: dict[str, list[float]] = {"lakejoin": [], "by hand": []}
    for number in range(1 + rounds):
        workdir = os.path.join(root, f"drain-{number}")
        files = [
            (
                name,
                write_jsonl(
                    os.path.join(workdir, "files", f"{name}-{part:02d}.jsonl"),
                    records(name, DRAIN_FILE_ROWS * part, DRAIN_FILE_ROWS),
                ),
            )
            for part in range(DRAIN_FILES)
            for name in RELATIONS
        ]
        pipeline = Pipeline(
            os.path.join(workdir, "lakejoin"),
            config={"relations": {name: {"required": ["key"]} for name in RELATIONS}, "engine": engine},
            spark=spark,
        )
        for name, path in files:
            pipeline.ingest(name, path)
        started = time.perf_counter()
        report = pipeline.run(max_batch_rows=DRAIN_BATCH)
        lakejoin = (time.perf_counter() - started) / len(report.batches)

        by_hand = ByHand(spark, engine, os.path.join(workdir, "by-hand"))
        # bronze by hand: the same records, each with its place in the arrival order (2 per place: r's, then s's)
        placed = {
            name: [
                {**row, "seq": 2 * (row["ts"] // 10) + (name == "s")}
                for row in records(name, 0, DRAIN_FILES * DRAIN_FILE_ROWS)
            ]
            for name in RELATIONS
        }
        by_hand.land({name: spark.createDataFrame(rows, f"{SCHEMA}, seq bigint") for name, rows in placed.items()})
        batches = DRAIN_FILES * DRAIN_FILE_ROWS * len(RELATIONS) // DRAIN_BATCH
        started = time.perf_counter()
        for batch in range(batches):
            by_hand.join(
                {
                    name: by_hand.bronze_slice(name, batch * DRAIN_BATCH, (batch + 1) * DRAIN_BATCH)
                    for name in RELATIONS
                },
                batch + 1,
            )
        done = (time.perf_counter() - started) / batches
        if number:
            seconds["lakejoin"].append(lakejoin)
            seconds["by hand"].append(done)
        print(
            f"(b) round {number + 1}: {len(report.batches)} batches, per batch lakejoin {lakejoin:.2f} s, by hand {done:.2f} s",
            flush=True,
        )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        choices=["delta-rs", "spark"],
        default="delta-rs",
        help="lakejoin's Delta engine (spark needs LAKEJOIN_DELTA_JARS)",
    )
    parser.add_argument("--runs", type=int, default=15, help="(a), (c): timed runs (default 15)")
    parser.add_argument("--warm", type=int, default=2, help="(a), (c): untimed runs first (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="(b): timed drains (default 5)")
    parser.add_argument(
        "--log-reader",
        choices=LOG_READERS,
        default="auto",
        help="Delta on Spark's log reader (default: the one lakejoin picks)",
    )
    parser.add_argument("--out", help="default benchmarks/results/small[_spark].json")
    args = parser.parse_args()
    use_log_reader(args.log_reader)
    args.out = args.out or f"benchmarks/results/small{'' if args.engine == 'delta-rs' else '_spark'}.json"
    spark = get_spark()
    require_engine(spark, args.engine)
    root = tempfile.mkdtemp(prefix="lakejoin-small-")
    figures = {
        "scheduled run": scheduled(spark, args.engine, root, args.runs, args.warm),
        "drain, per batch": drain(spark, args.engine, root, args.rounds),
        "ingest + run": scheduled(spark, args.engine, root, args.runs, args.warm, ingested=True),
    }
    medians = {
        scenario: {system: statistics.median(values) for system, values in systems.items()}
        for scenario, systems in figures.items()
    }
    print(f"\na batch of a few rows, lakejoin on {args.engine}, medians (s)")
    print(f"{'scenario':<18} {'lakejoin':>9} {'by hand':>9} {'ratio':>7}")
    for scenario, row in medians.items():
        print(
            f"{scenario:<18} {row['lakejoin']:>9.2f} {row['by hand']:>9.2f} {row['lakejoin'] / row['by hand']:>6.2f}x"
        )
    write_json(args.out, {"config": vars(args), "seconds": figures, "medians": medians})
    print(f"written: {args.out}")
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
