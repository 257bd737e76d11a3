"""What outer, semi, anti and as-of joins cost against the inner join, and how long their rows wait.

Streams the demo's orders and payments (``lakejoin demo``: a payment within the hour after its customer's order)
through ingest + run, chunk by chunk, on delta-rs, once per join kind and round, and the same stream as trades
and quotes (``demo --join asof``: the same symbol) for the inner and the as-of join, the runs interleaved within
a round so that drift on a shared machine hits them alike. Every run has the same window (the as-of join's
tolerance) and lateness, so each stream's inner join is the baseline. Per run: the median and p95 seconds of a
batch (after a warm-up, over every round), the ratio of the median to its stream's inner join's, gold's rows,
and for the rows that wait (unmatched for outer and anti joins, the first match for semi, every as-of row) how
long each waited from its (left) record's arrival: in arrivals after it, in batches, and in seconds of this
replay (bronze ``_ingested_at`` to gold ``produced_at``). Run it alone: timings on a shared machine are noisy.

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
from pipelines.commands.demo import (
    DEMO_SETTINGS,
    MARKET,
    DemoOptions,
    generate_stream,
    market_events,
    market_settings,
    orders_and_payments,
    without_window,
    write_chunks,
)
from pipelines.spark import get_spark
from state.config import Config
from state.engines import DeltaEngine, make_engine
from state.layout import Warehouse

# (run, stream, join): orders and payments for the outer kinds, trades and quotes for the as-of join
RUNS = (
    ("inner", "orders", "inner"),
    ("left", "orders", "left"),
    ("full", "orders", "full"),
    ("semi", "orders", "semi"),
    ("anti", "orders", "anti"),
    ("market inner", "market", "inner"),
    ("asof", "market", "asof"),
)


def waits(engine: DeltaEngine, warehouse: Warehouse, as_of: bool) -> dict[str, float] | None:
    """Median and p95 of the wait of gold's rows that wait (of one record: an outer or anti join's unmatched rows,
    a semi join's first matches; with ``as_of``, every row), from their (left) record's arrival: in later arrivals,
    in batches, in seconds. None when gold has none."""
    gold, batches = engine.read(warehouse.gold), engine.read(warehouse.batches)
    committed = batches.select("batch_id", "seq_to")
    waits: list[DataFrame] = []
    relations = (
        warehouse.relations[:1] if as_of else [rel for rel in warehouse.relations if f"_{rel.name}_id" in gold.columns]
    )
    for rel in relations:
        alone = gold.where(F.col(f"_{rel.name}_id").isNotNull())
        for other in [] if as_of else [other for other in warehouse.relations if other != rel]:
            if f"_{other.name}_id" in gold.columns:
                alone = alone.where(F.col(f"_{other.name}_id").isNull())
        bronze = engine.read(warehouse.bronze(rel)).select(
            F.col("_id").alias(f"_{rel.name}_id"), "_arrival_seq", "_ingested_at"
        )
        waits.append(
            alone.join(bronze, f"_{rel.name}_id")
            .join(committed, "batch_id")
            .select(
                (F.col("seq_to") - F.col("_arrival_seq")).alias("arrivals"),
                (F.col("produced_at").cast("double") - F.col("_ingested_at").cast("double")).alias("seconds"),
                "batch_id",
                "_arrival_seq",
            )
        )
    rows = waits[0]
    for more in waits[1:]:
        rows = rows.unionByName(more)
    # The batch that took the record in: the first committed batch whose slice reaches its arrival.
    first = rows.join(
        committed.withColumnRenamed("batch_id", "taken").withColumnRenamed("seq_to", "taken_to"),
        F.col("taken_to") >= F.col("_arrival_seq"),
    )
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
        **{
            f"{name}_{q}": figures[name][i]
            for name in ("arrivals", "batches", "seconds")
            for i, q in enumerate(("median", "p95"))
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_000, help="orders, and as many payments (default 8000)")
    parser.add_argument("--keys", type=int, default=2_000, help="customers (default 2000)")
    parser.add_argument("--disorder", type=int, default=600, help="max arrival delay in seconds (default 600)")
    parser.add_argument(
        "--lateness", default="10 minutes", help="allowed_lateness of both relations (default 10 minutes)"
    )
    parser.add_argument(
        "--window", default="10 minutes", help="the band window, and the as-of join's tolerance (default 10 minutes)"
    )
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
    market = list(MARKET)[:2]
    streams = {
        "orders": (
            DEMO_SETTINGS,
            write_chunks(generate_stream(options), workdir, args.chunk_rows, orders_and_payments),
        ),
        "market": (
            market_settings(2),
            write_chunks(generate_stream(options, market), workdir, args.chunk_rows, market_events),
        ),
    }
    seconds: dict[str, list[float]] = {run: [] for run, _, _ in RUNS}
    measured: dict[str, dict] = {}
    for round_number in range(args.rounds):
        for run, stream, kind in RUNS:
            base, chunks = streams[stream]
            bound = "tolerance" if kind == "asof" else "window"
            settings = {**without_window(base), "join": kind, bound: args.window, "allowed_lateness": args.lateness}
            config = Config.of(**settings, max_batch_rows=args.max_batch_rows, engine="delta-rs")  # type: ignore[arg-type]
            warehouse = Warehouse(os.path.join(workdir, f"{run}-{round_number}".replace(" ", "-")), config.joined)
            reports = replay(engine, warehouse, config, chunks)
            seconds[run] += [report.seconds for report in reports][args.warmup :]
            if round_number == 0:
                measured[run] = {
                    "batches": len(reports),
                    "gold_rows": engine.read(warehouse.gold).count(),
                    "waited": waits(engine, warehouse, kind == "asof"),
                }
            print(
                f"round {round_number + 1}, {run}: {len(reports)} batches, median {statistics.median(seconds[run]):.2f} s",
                flush=True,
            )
    for run, stream, _ in RUNS:
        row = measured[run]
        row["median_batch_s"] = statistics.median(seconds[run])
        row["p95_batch_s"] = statistics.quantiles(seconds[run], n=20)[-1]
        row["median_over_inner"] = row["median_batch_s"] / statistics.median(
            seconds["inner" if stream == "orders" else "market inner"]
        )
        print(f"{run}: {row}", flush=True)
    write_json(args.out, {"config": vars(args), "by_kind": measured})
    spark.stop()


if __name__ == "__main__":
    main()
