"""Relations read in place from Delta tables against the same stream ingested from files into lakejoin's own bronze.

Replays the demo's stream chunk by chunk both ways, in one Spark session, rounds interleaved after a warm-up:
files (``lakejoin ingest`` of each chunk's files, then ``run``), and source tables (each chunk appended to two
Delta tables with ``write_deltalake``, as the user's own writer would, then ``run``, which ingests the new versions
as pointers). Reports the median seconds of lakejoin's ingest step per chunk and per micro-batch, their ratios, the
bytes each way's bronze holds (what a table source saves), and whether both produced the same gold.

    .venv/bin/python -m benchmarks.table_sources [--rows 3000] [--keys 500] [--chunk-rows 1500] [--max-batch-rows 1000]
                                                 [--extra-columns 0]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd
from deltalake import write_deltalake

from benchmarks.report import write_json
from benchmarks.stream import replay, small_stream_arguments
from pipelines.bronze.sources import ingest_sources
from pipelines.commands.demo import DemoOptions, generate_stream, write_chunks
from pipelines.silver import run
from pipelines.spark import get_spark
from state.config import Config
from state.engines import make_engine
from state.join.relations import RELATIONS
from state.layout import Warehouse

WAYS = ("files", "tables")


@dataclass
class Measured:
    ingest_s: list[float] = field(default_factory=list)  # lakejoin's ingest step, per chunk
    batch_s: list[float] = field(default_factory=list)
    bronze_bytes: int = 0
    gold: Counter = field(default_factory=Counter)


def widened(extra_columns: int):  # noqa: ANN201 - write_chunks' shape
    """Records with ``extra_columns`` more text columns, as wider real records have (what pointers do not copy)."""

    def shape(records: pd.DataFrame, relation: str) -> pd.DataFrame:
        text = records["id"].astype(str).str.pad(24, fillchar="x")
        return records.assign(**{f"attribute_{n}": text for n in range(extra_columns)})

    return shape


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names)


def measure(spark, way: str, chunks: list[list[tuple[str, str]]], max_batch_rows: int) -> Measured:  # noqa: ANN001
    engine = make_engine(spark, "delta-rs")
    root = tempfile.mkdtemp(prefix=f"lakejoin-sources-{way}-")
    warehouse, measured = Warehouse(os.path.join(root, "warehouse")), Measured()
    if way == "files":
        ingest_chunk: list[float] = []
        reports = replay(
            engine, warehouse, Config.of(max_batch_rows=max_batch_rows), chunks, after_ingest=ingest_chunk.append
        )
        measured.ingest_s = [sum(ingest_chunk[i : i + 2]) for i in range(0, len(ingest_chunk), 2)]
    else:
        tables = {rel.name: os.path.join(root, "raw", rel.name) for rel in RELATIONS}
        config = Config.of(
            relations={name: {"table": path, "required": ["key"]} for name, path in tables.items()},
            max_batch_rows=max_batch_rows,
        )
        reports = []
        for files in chunks:
            for name, path in files:
                write_deltalake(tables[name], pd.read_json(path, lines=True), mode="append")
            started = time.perf_counter()
            ingest_sources(engine, warehouse, config.relations)
            measured.ingest_s.append(time.perf_counter() - started)
            reports += run(engine, warehouse, config)
    measured.batch_s = [report.seconds for report in reports]
    measured.bronze_bytes = sum(folder_bytes(warehouse.bronze(rel)) for rel in RELATIONS)
    measured.gold = Counter(tuple(row) for row in engine.read(warehouse.gold).select("r_id", "s_id", "owner").collect())
    return measured


def main() -> None:
    args = small_stream_arguments(__doc__.splitlines()[0], "benchmarks/results/table_sources.json", wide=True)

    spark = get_spark()
    options = DemoOptions(
        rows=args.rows, keys=args.keys, chunk_rows=args.chunk_rows, max_batch_rows=args.max_batch_rows
    )
    chunks = write_chunks(
        generate_stream(options),
        tempfile.mkdtemp(prefix="lakejoin-sources-landing-"),
        args.chunk_rows,
        widened(args.extra_columns),
    )
    for way in WAYS:  # warm-up: JIT, class loading, Python imports
        measure(spark, way, chunks[:1], args.max_batch_rows)
    rounds: dict[str, list[Measured]] = {way: [] for way in WAYS}
    for number in range(args.rounds):
        for way in WAYS:
            rounds[way].append(measure(spark, way, chunks, args.max_batch_rows))
            print(f"round {number + 1}: {way} batches {sum(rounds[way][-1].batch_s):.1f} s", flush=True)

    figures = {
        way: {
            "ingest_p50_s": statistics.median(s for m in measured for s in m.ingest_s),
            "batch_p50_s": statistics.median(s for m in measured for s in m.batch_s),
            "batches": len(measured[0].batch_s),
            "bronze_bytes": measured[0].bronze_bytes,
        }
        for way, measured in rounds.items()
    }
    same_gold = all(m.gold == rounds["files"][0].gold for measured in rounds.values() for m in measured)
    ratios = {
        kind: figures["tables"][kind] / figures["files"][kind]
        for kind in ("ingest_p50_s", "batch_p50_s", "bronze_bytes")
    }
    print(
        f"\n{args.rows} records per relation, {args.keys} keys, chunks of {args.chunk_rows}, batches of at most "
        f"{args.max_batch_rows}, {args.rounds} rounds (medians), delta-rs engine"
    )
    print(f"{'source':<8} {'s / ingest':>11} {'s / batch':>10} {'bronze bytes':>13}")
    for way, row in figures.items():
        print(f"{way:<8} {row['ingest_p50_s']:>11.2f} {row['batch_p50_s']:>10.2f} {row['bronze_bytes']:>13,}")
    print(
        f"tables / files: per ingest {ratios['ingest_p50_s']:.2f}, per batch {ratios['batch_p50_s']:.2f}, "
        f"bronze bytes {ratios['bronze_bytes']:.2f}; same gold: {'yes' if same_gold else 'NO'}"
    )
    write_json(args.out, {"config": vars(args), "ways": figures, "ratios": ratios, "same_gold": same_gold})
    print(f"written: {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()
