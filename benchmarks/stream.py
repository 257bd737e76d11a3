"""What every benchmark does with the demo's stream: land it chunk by chunk, running the joiner after each
chunk as a scheduled job would."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from pipelines.bronze.ingest import ingest_files
from pipelines.silver import BatchReport, run
from state.config import Config
from state.engines import DeltaEngine
from state.join.relations import relation
from state.layout import Warehouse


def replay(
    engine: DeltaEngine,
    warehouse: Warehouse,
    config: Config,
    chunks: list[list[tuple[str, str]]],
    after_chunk: Callable[[int, list[BatchReport]], None] = lambda number, reports: None,
    after_ingest: Callable[[float], None] = lambda seconds: None,
) -> list[BatchReport]:
    """Ingest each chunk's files, then ``run``; ``after_ingest(seconds)`` follows each file's ingest and
    ``after_chunk(number, reports so far)`` each chunk."""
    reports: list[BatchReport] = []
    for number, files in enumerate(chunks, start=1):
        for name, path in files:
            started = time.perf_counter()
            ingest_files(engine, warehouse, relation(name, warehouse.relations), [path], config.relations)
            after_ingest(time.perf_counter() - started)
        reports += run(engine, warehouse, config)
        after_chunk(number, reports)
    return reports


def small_stream_arguments(description: str, out: str, wide: bool = False) -> argparse.Namespace:
    """The command line of the benchmarks that compare two ways on the demo's small stream, in rounds; ``wide``
    adds ``--extra-columns``, text columns added to every record."""
    parser = argparse.ArgumentParser(description=description)
    if wide:
        parser.add_argument(
            "--extra-columns", type=int, default=0, help="text columns (24 characters) added to each record"
        )
    parser.add_argument("--rows", type=int, default=3_000, help="records per relation (default 3000)")
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--chunk-rows", type=int, default=1_500)
    parser.add_argument("--max-batch-rows", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=out)
    return parser.parse_args()
