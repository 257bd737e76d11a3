"""A scheduled job draining a backlog: lakejoin against Structured Streaming and the one-shot join, in one session.

A day's arrivals have landed out of order as Parquet files, ``--files`` per relation (default 25 of 20,000 records
each: 500,000 records per relation), in two landing folders. Each system drains them once:

1. lakejoin with its **defaults** (``--route landing``: one ``lakejoin run`` whose config names the landing folders,
   the scheduled job of the Databricks bundle, which ingests each file, then joins; ``--route ingest``:
   ``Pipeline.ingest`` of each relation's files, then ``Pipeline.run``), on ``--engine`` delta-rs or Delta on Spark,
   or with ``--max-batch-rows`` (``all``: the whole backlog in one batch);
2. Structured Streaming with its default trigger sizes (``availableNow``, a stream-stream inner join on the same
   predicate, RocksDB state), writing what lakejoin's gold holds (both records' columns and the owner) to a Delta
   table as the engine writes it: on delta-rs the file streams joined, each micro-batch committed by delta-rs
   (files → join → gold Delta); on Delta on Spark what a Databricks user builds, the files streamed into two bronze
   Delta tables and those joined into a gold Delta table (files → bronze Delta → join → gold Delta), its bronze timed
   as lakejoin's is;
3. the work of that batch by hand in plain Spark (benchmarks/by_hand.py: bronze appended, the join, gold appended
   with both records' columns and the owner, state appended), on the same engine: lakejoin's floor;
4. the one-shot batch join of all files, pairs only, to Parquet (the least any system can do).

Every system's pairs are checked against the one-shot join's. Prints one table with the ratios; writes a JSON.

    .venv/bin/python -m benchmarks.backlog [--engine delta-rs|spark] [--files 25] [--file-rows 20000] [--max-batch-rows N|all]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession

from benchmarks.by_hand import ByHand
from benchmarks.peers import (
    RELATIONS,
    SCHEMA,
    Measured,
    _stream_join,
    landed_batches,
    one_shot,
    phase_medians,
    same_pairs,
)
from benchmarks.report import LOG_READERS, require_engine, use_log_reader, write_json
from pipelines.api import Pipeline
from pipelines.commands.demo import DemoOptions
from pipelines.spark import get_spark


def landed_backlog(files: int, file_rows: int, root: str) -> tuple[int, list[dict[str, str]], dict[str, str]]:
    """The backlog landed under ``root``: its records per relation, its files (one per relation at a time, in arrival
    order) and the relations' landing folders."""
    rows = files * file_rows
    options = DemoOptions(rows=rows, keys=rows // 4, skew=0.0, disorder=2_000, seed=7)
    batches = landed_batches(options, file_rows, os.path.join(root, "landing"))
    return rows, batches, {rel.name: os.path.dirname(batches[0][rel.name]) for rel in RELATIONS}


def median_of(rounds: list[Measured]) -> tuple[Measured, dict[str, object]]:
    """The round of median total, and every round's total with their median."""
    totals = [measured.total_s for measured in rounds]
    return sorted(rounds, key=lambda measured: measured.total_s)[len(rounds) // 2], {
        "total_s_rounds": totals,
        "total_s": statistics.median(totals),
    }


def run_lakejoin(
    spark: SparkSession, folders: dict[str, str], workdir: str, engine: str, route: str, max_batch_rows: int | None
) -> Measured:
    """One scheduled run of lakejoin (its defaults unless ``max_batch_rows``); the ingest of the files (the run's time
    outside its batches, on the landing route) and the batches' phases kept for the report."""
    root = os.path.join(workdir, "lakejoin")
    landing = route == "landing"
    relations = {
        name: ({"landing": folder} if landing else {}) | {"required": ["key"]} for name, folder in folders.items()
    }
    started = time.perf_counter()
    pipeline = Pipeline(root, config={"relations": relations, "engine": engine}, spark=spark)
    if not landing:
        for name, folder in folders.items():
            pipeline.ingest(name, sorted(os.path.join(folder, file) for file in os.listdir(folder)))
    ingested = time.perf_counter()
    report = pipeline.run(max_batch_rows)
    measured = Measured(time.perf_counter() - started, [batch.seconds for batch in report.batches])
    landing_s = time.perf_counter() - ingested - sum(measured.batch_s) if landing else ingested - started
    measured.phases = [{"ingest": landing_s}, phase_medians([batch.phases for batch in report.batches])]
    measured.pairs = pipeline.table("gold").select("r_id", "s_id")
    return measured


def run_streams(spark: SparkSession, folders: dict[str, str], workdir: str, predicate: str, engine: str) -> Measured:
    """Structured Streaming with its default trigger sizes into a gold Delta table written as ``engine`` writes: on
    delta-rs the file streams joined; on Delta on Spark first streamed into bronze Delta tables, timed, then those
    joined."""
    started = time.perf_counter()
    if engine != "spark":
        streams = {rel: spark.readStream.schema(SCHEMA).parquet(folders[rel.name]) for rel in RELATIONS}
        return _stream_join(spark, streams, workdir, predicate, None, engine)
    for rel in RELATIONS:
        bronze = os.path.join(workdir, "bronze", rel.name)
        query = (
            spark.readStream.schema(SCHEMA)
            .parquet(folders[rel.name])
            .writeStream.format("delta")
            .option("checkpointLocation", os.path.join(workdir, "bronze-checkpoint", rel.name))
            .trigger(availableNow=True)
            .start(bronze)
        )
        query.awaitTermination()
    bronze_s = time.perf_counter() - started
    streams = {
        rel: spark.readStream.format("delta").load(os.path.join(workdir, "bronze", rel.name)) for rel in RELATIONS
    }
    measured = _stream_join(spark, streams, workdir, predicate, None, engine, "delta-source")
    measured.total_s += bronze_s
    measured.phases = [{"bronze": bronze_s}]
    return measured


def run_by_hand(spark: SparkSession, folders: dict[str, str], workdir: str, engine: str) -> Measured:
    """The batch's work by hand: the files read, bronze appended, joined, gold and state appended."""
    started = time.perf_counter()
    arrivals = {name: spark.read.schema(SCHEMA).parquet(folder) for name, folder in folders.items()}
    by_hand = ByHand(spark, engine, workdir)
    by_hand.land(arrivals)
    by_hand.join(arrivals, 1)
    measured = Measured(time.perf_counter() - started)
    measured.pairs = by_hand.gold().select("r_id", "s_id")
    measured.phases = [{"ingest": 0.0}, by_hand.phases]
    return measured


def print_steps(lakejoin: dict[str, float], floor: dict[str, float]) -> None:
    """Each step of lakejoin's batch (medians of its batches) beside the by-hand floor's write of the same table; a
    step the floor has no part for (planning, reading, measuring, the log row) stands alone. lakejoin's bronze writes
    run at once, and so do its gold and state writes, where the floor writes one table after another."""
    print(f"{'step':<16} {'lakejoin s':>10} {'by hand s':>10} {'over':>6}")
    for name, seconds in sorted(lakejoin.items(), key=lambda item: -item[1]):
        if seconds < 0.005 and name not in floor:
            continue
        mine = floor.get(name)
        print(
            f"{name:<16} {seconds:>10.2f} {'-' if mine is None else f'{mine:.2f}':>10} {'-' if not mine else f'{seconds / mine:.1f}x':>6}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        choices=["delta-rs", "spark"],
        default="delta-rs",
        help="lakejoin's Delta engine (spark needs LAKEJOIN_DELTA_JARS)",
    )
    parser.add_argument("--files", type=int, default=25, help="Parquet files per relation (default 25)")
    parser.add_argument("--file-rows", type=int, default=20_000, help="records per file (default 20000)")
    parser.add_argument(
        "--route",
        choices=["landing", "ingest"],
        default="landing",
        help="landing folders in the config (default), or ingest then run",
    )
    parser.add_argument(
        "--max-batch-rows", help="lakejoin's batch size: arrivals per batch, or 'all' (default: the config's default)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every system, medians reported (default 3)")
    parser.add_argument(
        "--driver-memory", default="4g", help="the Spark driver's heap (default 4g, lakejoin's local default)"
    )
    parser.add_argument(
        "--systems",
        default="lakejoin,by-hand,structured-streaming,one-shot",
        help="comma-separated systems to run (default all)",
    )
    parser.add_argument(
        "--log-reader",
        choices=LOG_READERS,
        default="auto",
        help="Delta on Spark's log reader (default: the one lakejoin picks)",
    )
    parser.add_argument(
        "--out",
        help="default benchmarks/results/backlog[_spark].json; a variant (--route ingest, --max-batch-rows) goes to "
        "benchmarks/experiments/ (not kept in git), so it never replaces the run the benchmarks page shows",
    )
    args = parser.parse_args()
    use_log_reader(args.log_reader)
    variant = "".join(
        [
            f"_{args.route}" if args.route != "landing" else "",
            f"_batch_{args.max_batch_rows}" if args.max_batch_rows else "",
        ]
    )
    engine = "" if args.engine == "delta-rs" else "_spark"
    args.out = args.out or (
        f"benchmarks/experiments/backlog{variant}{engine}.json"
        if variant
        else f"benchmarks/results/backlog{engine}.json"
    )

    root = tempfile.mkdtemp(prefix="lakejoin-backlog-")
    rows, batches, folders = landed_backlog(args.files, args.file_rows, root)
    max_batch_rows = (
        None if args.max_batch_rows is None else 2 * rows if args.max_batch_rows == "all" else int(args.max_batch_rows)
    )
    spark = get_spark(conf={"spark.driver.memory": args.driver_memory})
    require_engine(spark, args.engine)
    predicate = "r.key = s.key"
    every: dict[str, Callable[[str], Measured]] = {
        "lakejoin": lambda workdir: run_lakejoin(spark, folders, workdir, args.engine, args.route, max_batch_rows),
        "by-hand": lambda workdir: run_by_hand(spark, folders, workdir, args.engine),
        "structured-streaming": lambda workdir: run_streams(spark, folders, workdir, predicate, args.engine),
        "one-shot": lambda workdir: one_shot(spark, batches, workdir, predicate),
    }
    systems = {
        name: system for name, system in every.items() if name in args.systems.split(",") or name == "one-shot"
    }  # the reference
    warm = tempfile.mkdtemp(dir=root)  # the session's first jobs, once, in no system's time
    one_shot(spark, batches[:1], warm, predicate)
    rounds: dict[str, list[Measured]] = {name: [] for name in systems}
    for number in range(args.rounds):
        for name, system in systems.items():
            rounds[name].append(system(tempfile.mkdtemp(dir=root)))
            print(f"round {number + 1}: {name} {rounds[name][-1].total_s:.1f} s", flush=True)
    reference: DataFrame = rounds["one-shot"][-1].pairs  # type: ignore[assignment] - every system sets its pairs
    pairs = reference.count()
    figures = {}
    for name, measured in rounds.items():
        median_round, totals = median_of(measured)
        figures[name] = {
            **totals,
            "batches": len(median_round.batch_s) or None,
            "phases": median_round.phases,
            "same_pairs_as_one_shot": same_pairs(median_round.pairs, reference),  # type: ignore[arg-type]
        }
    lakejoin = figures.get("lakejoin", {}).get("total_s")
    ratios = {
        f"lakejoin_over_{name.replace('-', '_')}": lakejoin / figures[name]["total_s"]
        for name in ("by-hand", "structured-streaming", "one-shot")
        if lakejoin and name in figures
    }
    if "by-hand" in figures and "structured-streaming" in figures:
        ratios["by_hand_over_structured_streaming"] = (
            figures["by-hand"]["total_s"] / figures["structured-streaming"]["total_s"]
        )
    streams = (
        "files -> bronze Delta -> join -> gold Delta"
        if args.engine == "spark"
        else "files -> join -> gold Delta (delta-rs)"
    )
    print(
        f"\nbacklog: {rows:,} records per relation in {args.files} Parquet files each, {pairs:,} pairs; lakejoin on {args.engine} "
        f"({args.route} route, max_batch_rows {max_batch_rows or 'default'}), Structured Streaming {streams}; {args.rounds} round(s), medians"
    )
    print(f"{'system':<22} {'total s':>8} {'batches':>8}  same pairs")
    for name, row in figures.items():
        print(
            f"{name:<22} {row['total_s']:>8.1f} {row['batches'] or '-':>8}  {'yes' if row['same_pairs_as_one_shot'] else 'NO'}"
        )
    print("; ".join(f"{name.replace('_', ' ')}: {ratio:.2f}" for name, ratio in ratios.items()))
    if lakejoin:
        print(f"lakejoin: {lakejoin / (2 * rows / 1e6):.1f} s per million records")
    if "lakejoin" in figures:
        ingest, per_batch = figures["lakejoin"]["phases"]
        print(f"lakejoin: ingest of the files outside its batches {ingest['ingest']:.1f} s")
        print_steps(per_batch, figures["by-hand"]["phases"][1] if "by-hand" in figures else {})
    write_json(args.out, {"config": vars(args), "pairs": pairs, "systems": figures, "ratios": ratios})
    print(f"written: {args.out}")
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
