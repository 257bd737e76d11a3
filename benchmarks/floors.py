"""The least each phase of a lakejoin micro-batch can cost on this machine, beside what it costs today.

The peers benchmark's default stream is joined for ``--warm`` micro-batches (delta-rs, rules on), so the
warehouse holds the state and bronze of half the stream; then the bare operation each phase cannot do without
is timed on the next micro-batch's files, ``--repeat`` times (medians):

- ingest, per file: read it to the driver (Spark's Parquet reader, ``toArrow``); find its ids in bronze (one
  semi-join job); append its rows to a Delta table (delta-rs);
- join: one Spark job reading every column of the state tables (the pairs need at least that);
- rules: Great Expectations validating the bronze suite on each relation's arrivals (a batch runs 7 validations:
  2 bronze, 4 state, 1 gold; only these 2 are counted, so the figure is a lower bound);
- writes: a one-row Delta commit, three times in a row (plan row, the outputs at once, commit row);
- and an empty Spark job: the fixed cost every Spark job above pays.

lakejoin's own figure per phase is its median over the 5 micro-batches before the floors are timed. The sum is
the floor of a lakejoin micro-batch built from Spark jobs, Delta commits and Great Expectations; the
peers benchmark's target (half Structured Streaming's time) needs a batch under about 0.9 s.

    .venv/bin/python -m benchmarks.floors [--warm 10] [--repeat 7]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import reduce

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from benchmarks.peers import landed_batches, phase_medians, run_lakejoin
from benchmarks.report import write_json
from expectations.batch import bound_rules
from expectations.runner import Validator
from state.config import Config
from pipelines.demo import DemoOptions
from pipelines.spark import get_spark
from state.engines import make_engine
from state.layout import Warehouse
from state.errors import LakejoinError
from state.relations import ID, RELATIONS, TS, Relation

LAST = 5  # lakejoin's own phases: medians over the batches just before the floors are timed


def median_seconds(operation: Callable[[], object], repeat: int) -> float:
    """Median wall seconds of ``operation`` over ``repeat`` calls, after one untimed call."""
    operation()
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        operation()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="records per relation (default 200000, the peers' default)")
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=10_000, help="arrivals per relation per micro-batch")
    parser.add_argument("--warm", type=int, default=10, help="micro-batches joined before the floors are timed")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/floors.json")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="lakejoin-floors-")
    batches = landed_batches(DemoOptions(rows=args.rows, keys=args.keys, disorder=2_000, seed=7), args.batch, os.path.join(root, "landing"))
    if not LAST <= args.warm < len(batches):
        raise LakejoinError(f"--warm must be from {LAST} to {len(batches) - 1}: the stream has {len(batches)} micro-batches")
    spark = get_spark()
    run_lakejoin(spark, batches[:2], os.path.join(root, "warm-up"), args.batch, "delta-rs")  # as the peers benchmark warms up
    measured = run_lakejoin(spark, batches[: args.warm], os.path.join(root, "run"), args.batch, "delta-rs")
    today = phase_medians(measured.phases[-LAST:])  # the last batches: about the state the floors see

    engine = make_engine(spark, "delta-rs")
    warehouse = Warehouse(os.path.join(root, "run", "lakejoin"))
    files = batches[args.warm]
    arrivals = {rel: spark.read.parquet(files[rel.name]).toArrow() for rel in RELATIONS}
    validator = Validator(spark)
    scratch = os.path.join(root, "scratch")

    def id_check(rel: Relation) -> int:
        ids = F.broadcast(spark.read.parquet(files[rel.name]).select(F.col("id").alias(ID)))
        return engine.read(warehouse.bronze(rel)).select(ID).join(ids, ID, "left_semi").count()

    def state_scan() -> None:
        """Every column of every row of the state tables read, and nothing done with them (Spark's ``noop`` sink: a
        count would read Parquet's footers only, an aggregate would add its own work). Each relation's table has its
        own membership columns, so the union fills the others with nulls."""
        tables: list[DataFrame] = [engine.read(path) for path in warehouse.buffers().values()]
        reduce(lambda one, other: one.unionByName(other, allowMissingColumns=True), tables).write.format("noop").mode("overwrite").save()

    def bronze_rules(rel: Relation) -> object:
        rows = arrivals[rel].rename_columns([{"id": ID, "ts": TS}.get(name, name) for name in arrivals[rel].column_names])
        return validator.check(f"bronze/{rel.name}", rows, [ID], bound_rules(Config(), "bronze", rel.name), "pandas")

    commits = itertools.count()
    floors = {
        "spark_job": median_seconds(lambda: spark.range(1).count(), args.repeat),
        "read_file": sum(median_seconds(lambda rel=rel: spark.read.parquet(files[rel.name]).toArrow(), args.repeat) for rel in RELATIONS),
        "id_check": sum(median_seconds(lambda rel=rel: id_check(rel), args.repeat) for rel in RELATIONS),
        "append_rows": sum(median_seconds(lambda rel=rel: engine.append(f"{scratch}/{rel.name}", arrivals[rel]), args.repeat) for rel in RELATIONS),
        "state_scan": median_seconds(state_scan, args.repeat),
        "bronze_rules": sum(median_seconds(lambda rel=rel: bronze_rules(rel), args.repeat) for rel in RELATIONS),
        "commit": median_seconds(lambda: engine.append(f"{scratch}/log", pa.table({"n": [next(commits)]})), args.repeat),
    }
    phases = {
        "ingest": (today.get("ingest", 0.0), floors["read_file"] + floors["id_check"] + floors["append_rows"] + 2 * floors["commit"]),
        "join": (today.get("join", 0.0), floors["state_scan"]),
        "rules": (today.get("rules", 0.0), floors["bronze_rules"]),
        "writes": (sum(today.get(name, 0.0) for name in ("plan", "gold", "commit")), 3 * floors["commit"]),
    }
    state_rows = sum(engine.read(path).count() for path in warehouse.buffers().values())
    print(f"after {args.warm} micro-batches of {args.batch:,} arrivals per relation: {state_rows:,} state rows")
    print(f"{'phase':<8} {'today s':>8} {'floor s':>8}   floor made of")
    made_of = {
        "ingest": "per file: read to the driver, id semi-join on bronze, append, log commit",
        "join": "one read of every column of the state tables (one per relation)",
        "rules": "Great Expectations, bronze suite on each relation (2 of 7 validations)",
        "writes": "three one-row commits in a row",
    }
    for name, (now, floor) in phases.items():
        print(f"{name:<8} {now:>8.2f} {floor:>8.2f}   {made_of[name]}")
    total_today, total_floor = (sum(pair[i] for pair in phases.values()) for i in (0, 1))
    print(f"{'sum':<8} {total_today:>8.2f} {total_floor:>8.2f}   (an empty Spark job: {floors['spark_job']:.3f} s; a one-row commit: {floors['commit']:.3f} s)")
    write_json(args.out, {"config": vars(args), "state_rows": state_rows, "floors_s": floors, "phases_today_and_floor_s": phases, "today_s": today})
    print(f"written: {args.out}")
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
