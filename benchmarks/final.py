"""What outer, semi and anti joins cost against the inner join, and how long an unmatched row waits.

Streams the demo's orders and payments (``lakejoin demo``: a payment within the hour after its customer's order)
through ingest + run, chunk by chunk, on delta-rs, once per join kind and round, the kinds interleaved within a
round so that drift on a shared machine hits them alike. Every kind has the same window and lateness, so
the inner join's state and batches are the baseline. Per kind: the median and p95 seconds of a batch (after a
warm-up, over every round), the ratio of the median to the inner join's, gold's rows, and for the rows of one
record (unmatched for outer and anti joins, the first match for semi) how long each waited from its record's
arrival: in arrivals after it,
in batches, and in seconds of this replay (bronze ``_ingested_at`` to gold ``produced_at``). Run it alone:
timings on a shared machine are noisy.

    .venv/bin/python -m benchmarks.final [--rows N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from benchmarks.report import write_json
from benchmarks.stream import replay
from pipelines.config import Config
from pipelines.demo import DEMO_SETTINGS, DemoOptions, generate_stream, orders_and_payments, write_chunks
from pipelines.spark import get_spark
from state.engines import DeltaEngine, make_engine
from state.layout import Warehouse

KINDS = ("inner", "left", "full", "semi", "anti")


def unmatched_delays(engine: DeltaEngine, warehouse: Warehouse) -> dict[str, float] | None:
    """Median and p95 of the wait of gold's rows of one record (an outer or anti join's unmatched rows, a semi
    join's first matches), from their record's arrival: in later arrivals, in batches, in seconds. None when gold
    has none."""
    gold, batches = engine.read(warehouse.gold), engine.read(warehouse.batches)
    committed = batches.where(F.col("phase") == "committed").select("batch_id", "seq_to")
    waits: list[DataFrame] = []
    for rel in (rel for rel in warehouse.relations if f"_{rel.name}_id" in gold.columns):
        others = [other for other in warehouse.relations if other != rel]
        alone = gold.where(F.col(f"_{rel.name}_id").isNotNull())
        for other in others:
            if f"_{other.name}_id" in gold.columns:
                alone = alone.where(F.col(f"_{other.name}_id").isNull())
        bronze = engine.read(warehouse.bronze(rel)).select(F.col("_id").alias(f"_{rel.name}_id"), "_arrival_seq", "_ingested_at")
        waits.append(alone.join(bronze, f"_{rel.name}_id").join(committed, "batch_id").select(
            (F.col("seq_to") - F.col("_arrival_seq")).alias("arrivals"),
            (F.col("produced_at").cast("double") - F.col("_ingested_at").cast("double")).alias("seconds"),
            "batch_id",
            "_arrival_seq",
        ))
    rows = waits[0]
    for more in waits[1:]:
        rows = rows.unionByName(more)
    # The batch that took the record in: the first committed batch whose slice reaches its arrival.
    first = rows.join(committed.withColumnRenamed("batch_id", "taken").withColumnRenamed("seq_to", "taken_to"), F.col("taken_to") >= F.col("_arrival_seq"))
    per_row = first.groupBy("batch_id", "_arrival_seq", "arrivals", "seconds").agg(F.min("taken").alias("taken"))
    figures = per_row.agg(
        F.count("*").alias("rows"),
        F.percentile_approx("arrivals", [0.5, 0.95]).alias("arrivals"),
        F.percentile_approx(F.col("batch_id") - F.col("taken"), [0.5, 0.95]).alias("batches"),
        F.percentile_approx("seconds", [0.5, 0.95]).alias("seconds"),
    ).first()
    if not figures["rows"]:
        return None
    return {
        "rows": figures["rows"],
        **{f"{name}_{q}": figures[name][i] for name in ("arrivals", "batches", "seconds") for i, q in enumerate(("median", "p95"))},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_000, help="orders, and as many payments (default 8000)")
    parser.add_argument("--keys", type=int, default=2_000, help="customers (default 2000)")
    parser.add_argument("--disorder", type=int, default=600, help="max arrival delay in seconds (default 600)")
    parser.add_argument("--lateness", default="10 minutes", help="allowed_lateness of both relations (default 10 minutes)")
    parser.add_argument("--window", default="10 minutes", help="the band window (default 10 minutes)")
    parser.add_argument("--chunk-rows", type=int, default=2_000)
    parser.add_argument("--max-batch-rows", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2, help="batches of each run left out of the medians")
    parser.add_argument("--out", default="benchmarks/results/final.json")
    args = parser.parse_args()

    spark = get_spark()
    engine = make_engine(spark, "delta-rs")
    options = DemoOptions(rows=args.rows, keys=args.keys, disorder=args.disorder, chunk_rows=args.chunk_rows, seed=7)
    workdir = tempfile.mkdtemp(prefix="lakejoin-bench-final-")
    chunks = write_chunks(generate_stream(options), workdir, args.chunk_rows, orders_and_payments)
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    measured: dict[str, dict] = {}
    for round_number in range(args.rounds):
        for kind in KINDS:
            settings = {**DEMO_SETTINGS, "join": kind, "window": args.window, "allowed_lateness": args.lateness}
            config = Config(**settings, max_batch_rows=args.max_batch_rows, engine="delta-rs")  # type: ignore[arg-type]
            warehouse = Warehouse(os.path.join(workdir, f"{kind}-{round_number}"), config.joined)
            reports = replay(engine, warehouse, config, chunks)
            seconds[kind] += [report.seconds for report in reports][args.warmup :]
            if round_number == 0:
                measured[kind] = {"batches": len(reports), "gold_rows": engine.read(warehouse.gold).count(), "unmatched": unmatched_delays(engine, warehouse)}
            print(f"round {round_number + 1}, {kind}: {len(reports)} batches, median {statistics.median(seconds[kind]):.2f} s", flush=True)
    for kind, row in measured.items():
        row["median_batch_s"] = statistics.median(seconds[kind])
        row["p95_batch_s"] = statistics.quantiles(seconds[kind], n=20)[-1]
        row["median_over_inner"] = row["median_batch_s"] / statistics.median(seconds["inner"])
        print(f"{kind}: {row}", flush=True)
    write_json(args.out, {"config": vars(args), "by_kind": measured})
    spark.stop()


if __name__ == "__main__":
    main()
