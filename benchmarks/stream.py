"""What every benchmark does with the demo's stream: land it chunk by chunk, running the joiner after each
chunk as a scheduled job would."""

from __future__ import annotations

import time
from collections.abc import Callable

from pipelines.config import Config
from pipelines.ingest import ingest_file
from pipelines.silver import BatchReport, run
from state.engines import DeltaEngine
from state.layout import Warehouse
from state.relations import relation


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
            ingest_file(engine.spark, engine, warehouse, relation(name), path)
            after_ingest(time.perf_counter() - started)
        reports += run(engine, warehouse, config)
        after_chunk(number, reports)
    return reports
