"""``lakejoin reset``: a full refresh. Silver and gold are dropped; the next run rebuilds them from bronze.

Bronze, the ingest log and the ingest quarantine stay: they are the source of truth. The files batches landed from
landing folders are named in the batch log, which goes: they are written into the ingest log first, with the places
their rows took, so they stay landed (not read again) and their rows pending for the rebuild. Gold goes first and the
batch log last, so a reset that dies half-way leaves tables the batch log disagrees with, which the next ``run``
refuses (state/log/checks.py) until ``reset`` is run again.
"""

from __future__ import annotations

from datetime import datetime

from pipelines.batch.land import batch_tag, retried_files
from pipelines.bronze.ingest import log_ingests
from state.clock import now
from state.engines import Commit
from state.engines.base import DeltaReader
from state.engines.table import table_in
from state.layout import Warehouse
from state.log.batch_log import BatchPlan, LandedFile
from state.log.checks import require_warehouse


def reset(engine: DeltaReader, warehouse: Warehouse) -> list[str]:
    """Drop every derived table; return the names of those that existed."""
    require_warehouse(engine, warehouse)
    _keep_landed(engine, warehouse)
    dropped = []
    for path in warehouse.derived_tables():
        if engine.version(path) is not None:
            dropped.append(warehouse.name_of(path))
        engine.drop(path)
    return dropped


def _keep_landed(engine: DeltaReader, warehouse: Warehouse) -> None:
    """The files batches landed (or refused for good), as ingest-log rows: those the batch log names, and those a batch
    that died after landing them had landed (its bronze commits carry its plan). Appended once per batch log: a reset
    run again after it died skips them."""
    found = engine.source_identity(warehouse.batches)  # a log built again after a reset has another table id
    schema = engine.schema(warehouse.batches)
    logged = (
        engine.rows(warehouse.batches) if schema is not None and "files" in schema.fieldNames() else None
    )  # the earlier layout's ingest logged its files
    files = (
        []
        if logged is None
        else [
            (row["batch_id"], row["recorded_at"], LandedFile(**file))
            for row in logged.select(["batch_id", "recorded_at", "files"]).to_pylist()
            for file in row["files"] or []
        ]
    )
    last = 0 if logged is None or logged.num_rows == 0 else max(logged.column("batch_id").to_pylist())
    files += _landed_by_unfinished(engine, warehouse, last)
    if not files:
        return
    rows = [_log_row(batch, at, file) for batch, at, file in files]
    log_ingests(engine, warehouse, rows, Commit(f"lakejoin-reset:{found[0] if found else 'none'}", 1))


def _landed_by_unfinished(
    engine: DeltaReader, warehouse: Warehouse, last: int
) -> list[tuple[int, datetime, LandedFile]]:
    """The files the batch after ``last`` landed before it died: those of each relation whose bronze holds its commit,
    less those it refused for now (their rows are not there: a later batch lands them)."""
    landed = []
    for rel in warehouse.relations:
        bronze = warehouse.bronze(rel)
        info = engine.info(bronze, warehouse.app_id(warehouse.pipeline, bronze))
        if info is None or info.recorded.version != last + 1 or info.recorded.plan is None:
            continue
        plan = BatchPlan.decoded(info.recorded.plan)
        left_out = retried_files(table_in(engine, warehouse, warehouse.quarantine), plan.batch_id)
        landed += [(plan.batch_id, now(), file) for file in plan.landing(rel.name) if file.path not in left_out]
    return landed


def _log_row(batch_id: int, at: datetime, file: LandedFile) -> dict:
    """A landed file as the ingest log names an ingested one: its rows are at places ``first + 1`` to
    ``first + bound``."""
    return dict(
        ingest_id=batch_tag(batch_id),
        relation=file.relation,
        source_file=file.path,
        sha256=file.sha256,
        rows_landed=None,
        rows_quarantined=None,
        rows_duplicate=None,
        seq_from=file.first + 1,
        seq_to=file.first + file.bound,
        ingested_at=at,
        refused=file.refused,
        source_version=None,
        source_table_id=None,
    )
