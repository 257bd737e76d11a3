"""Refuse, before writing anything, a warehouse that is not lakejoin's or whose tables disagree with its batch log.

Every lakejoin write to silver and gold carries the application transaction (pipeline:table, batch id),
and every plan records the state versions it read. So a table that lacks lakejoin's transactions, holds a
batch the log never planned, is older than a version the log read, or is missing while the log needs it,
was changed by something else — and joining on top of it would lose or repeat pairs.
"""

from __future__ import annotations

import os
from dataclasses import replace

from pyspark.sql.types import StructType

from state.engines import DeltaEngine
from state.engines.base import DeltaReader, Recorded
from state.errors import LakejoinError
from state.join.joiner import identity_column
from state.join.relations import ID, TS, relation
from state.layout import IN_STORE, Warehouse, is_table_name
from state.log.batch_log import BatchLog, BatchPlan, LogTail
from state.log.lock import is_local

STATE_COLUMNS = (ID, TS, "_arrival_seq", IN_STORE)
GOLD_COLUMNS = ("owner", "batch_id")  # and each member's id: _r_id, _s_id, …
LATE_COLUMNS = ("relation", ID, TS, "reason", "watermark", "batch_id")
LOG_COLUMNS = ("batch_id", "seq_from", "seq_to", "bronze_versions", "state_versions", "watermarks", "files", "rules")
DQ_QUARANTINE_COLUMNS = ("batch_id", "rule", "table", "row_key", "row")


def require_engine_for(warehouse: Warehouse, engine: DeltaReader) -> None:
    """Unity Catalog tables are reached through Spark's catalog: delta-rs takes paths only."""
    in_catalog = next((table for table in warehouse.tables() if is_table_name(table)), None)
    if in_catalog is not None and engine.name != "spark":
        raise LakejoinError(
            f"{in_catalog.rpartition('.')[0]} is a Unity Catalog schema: its tables need Delta on Spark (engine "
            "'spark', as on Databricks); delta-rs takes a folder path"
        )


def require_warehouse(engine: DeltaReader, warehouse: Warehouse) -> None:
    """A lakejoin warehouse is one that has had an ingest (it holds ``bronze/_ingests``), or batches that landed files
    (a run records its definition before the first)."""
    if all(engine.version(path) is None for path in (warehouse.ingest_log, warehouse.definition, warehouse.batches)):
        raise LakejoinError(
            f"{warehouse.root} is not a lakejoin warehouse (it has no bronze/_ingests table): "
            f"ingest files into it first with 'lakejoin ingest --warehouse {warehouse.root}'"
        )


def check_ingest_target(engine: DeltaEngine, warehouse: Warehouse) -> None:
    """Ingest creates a warehouse only in a new or empty folder, never among someone else's files."""
    if not is_local(warehouse.root) or any(
        engine.version(path) is not None for path in (warehouse.ingest_log, warehouse.definition)
    ):
        return
    others = [name for name in _listdir(warehouse.root) if not name.startswith("_lakejoin_")]
    if others:
        raise LakejoinError(
            f"{warehouse.root} already holds other files ({others[0]}, …) and is not a lakejoin warehouse: "
            "ingest into a new or empty folder"
        )


def _listdir(root: str) -> list[str]:
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def check_consistency(engine: DeltaReader, warehouse: Warehouse, pipeline: str, creates: bool = False) -> LogTail:
    """The batch log's tail, once every table the batches write is shown to be what the log says it is; with the plan
    of the batch after the log's last when some table records a write of it (a batch that died: the next run resumes it
    with that plan, which its writes carry). ``creates``: the run may make the warehouse (it lands files)."""
    if not creates:
        require_warehouse(engine, warehouse)
    earlier = [
        path for path in [*warehouse.legacy_state(), warehouse.legacy_rule_results] if engine.version(path) is not None
    ]
    log_schema = engine.schema(warehouse.batches)
    if earlier or (log_schema is not None and "phase" in log_schema.fieldNames()):
        name = warehouse.name_of(earlier[0] if earlier else warehouse.batches)
        raise LakejoinError(f"{name} is a table of lakejoin's earlier layout: {_rebuild(warehouse)}")
    _require_columns(warehouse, warehouse.batches, log_schema, LOG_COLUMNS)
    tail = BatchLog(engine, warehouse.batches, warehouse.app_id(pipeline, warehouse.batches)).tail()
    found: dict[str, Recorded] = {}
    for path in warehouse.landed_tables():  # bronze and its quarantine: ingests write them too, outside any batch
        found |= _check_batches(engine, warehouse, path, pipeline, tail)
    outputs = [(path, STATE_COLUMNS) for path in warehouse.buffers().values()] + [
        (warehouse.late_arrivals, LATE_COLUMNS),
        (warehouse.dq_quarantine, DQ_QUARANTINE_COLUMNS),
        (warehouse.gold_changes, ()),
    ]
    for path, columns in outputs:
        found |= _check_output(engine, warehouse, path, columns, pipeline, tail)
    first = identity_column(warehouse.relations[0], ID)  # every join kind's gold has the first relation's members
    found |= _check_output(
        engine, warehouse, warehouse.gold, (first, *GOLD_COLUMNS), pipeline, tail, written_every_batch=True
    )
    unfinished = next((BatchPlan.decoded(record.plan) for record in found.values() if record.plan is not None), None)
    if found and unfinished is None:
        name = warehouse.name_of(next(iter(found)))
        raise LakejoinError(
            f"{name} holds batch {tail.last_batch_id + 1}, which the batch log has not committed, without its plan: "
            f"{_rebuild(warehouse)}"
        )
    newest = unfinished or (tail.last and _pinned(tail.last))
    batch = tail.last_batch_id + (unfinished is not None)  # the batch that read what ``newest`` pins
    for name, version in (newest.bronze_versions if newest else {}).items():
        bronze = warehouse.bronze(relation(name, warehouse.relations))
        current = engine.version(bronze)
        if current is None or current < version:
            raise LakejoinError(
                f"{warehouse.name_of(bronze)} is at version {current}, but batch {batch} read version "
                f"{version}: bronze was replaced or restored; {_rebuild(warehouse)}"
            )
    for name, path in warehouse.buffers().items():
        read = (newest.state_versions if newest else {}).get(name)
        current = engine.version(path)
        if read is None:
            continue
        if current is None:
            raise LakejoinError(
                f"{warehouse.name_of(path)} is missing, but batch {batch} read its version {read}: "
                f"{_rebuild(warehouse)}"
            )
        if current < read:
            raise LakejoinError(
                f"{warehouse.name_of(path)} is at version {current}, but batch {batch} read its version {read} "
                f"(was it replaced or restored?): {_rebuild(warehouse)}"
            )
    return replace(tail, unfinished=unfinished)


def _pinned(row: dict) -> BatchPlan:
    """What a logged batch pinned of the tables it read."""
    return BatchPlan(
        row["batch_id"],
        row["seq_from"],
        row["seq_to"],
        dict(row["bronze_versions"] or {}),
        dict(row["state_versions"] or {}),
    )


def _rebuild(warehouse: Warehouse) -> str:
    return f"rebuild silver and gold from bronze with 'lakejoin reset --warehouse {warehouse.root} --yes'"


def _require_columns(warehouse: Warehouse, path: str, schema: StructType | None, columns: tuple[str, ...]) -> None:
    missing = [] if schema is None else [column for column in columns if column not in schema.fieldNames()]
    if missing:
        raise LakejoinError(
            f"{warehouse.name_of(path)} was not written by lakejoin (no column {missing[0]}): "
            f"move it away, or {_rebuild(warehouse)}"
        )


def _check_batches(
    engine: DeltaReader, warehouse: Warehouse, path: str, pipeline: str, tail: LogTail
) -> dict[str, Recorded]:
    """A table's record of this pipeline's batches: none after the one after the log's last. Returns the record of
    that next batch when the table has it (the batch died after writing here)."""
    info = engine.info(path, warehouse.app_id(pipeline, path))
    if info is None or info.txn_version is None or info.txn_version <= tail.last_batch_id:
        return {}
    batch = info.txn_version
    if batch > tail.last_batch_id + 1:
        raise LakejoinError(
            f"{warehouse.name_of(path)} holds batch {batch}, but the batch log ends at batch {tail.last_batch_id} "
            f"(was silver/batches deleted or restored?): {_rebuild(warehouse)}"
        )
    return {path: info.recorded}


def _left_unchanged(engine: DeltaReader, warehouse: Warehouse, batch: int) -> bool:
    """Whether the batch log shows that every batch after ``batch`` added no gold row and took none out: gold is then
    what they left it, though it lacks their marks (earlier versions left none for a change feed's MERGE that changed
    nothing). A gold restored to before a batch that changed it is still refused."""
    after = engine.rows(warehouse.batches, where=f"batch_id > {batch}")
    return after is not None and all(
        not row.get("pairs") and not dict(row.get("changes") or {}).get("retracted") for row in after.to_pylist()
    )


def _check_output(
    engine: DeltaReader,
    warehouse: Warehouse,
    path: str,
    columns: tuple[str, ...],
    pipeline: str,
    tail: LogTail,
    written_every_batch: bool = False,
) -> dict[str, Recorded]:
    """``_check_batches`` for a table only batches write: it has lakejoin's columns and this pipeline's transactions,
    and (``written_every_batch``) it has every committed batch."""
    name, fix = warehouse.name_of(path), _rebuild(warehouse)
    app_id = warehouse.app_id(pipeline, path)
    info = engine.info(path, app_id)
    if info is None:
        if written_every_batch and tail.last_batch_id > 0:
            raise LakejoinError(f"{name} is missing, but the batch log has committed batch {tail.last_batch_id}: {fix}")
        return {}
    _require_columns(warehouse, path, info.schema, columns)
    if info.recorded.unknown:  # the app's commits have left the log: the batch log is the record
        return {}
    if info.txn_version is None:
        raise LakejoinError(
            f"{name} was not written by pipeline '{pipeline}' (no Delta transaction of {app_id!r}): move it away, or "
            f"{fix}"
        )
    if (
        written_every_batch
        and info.txn_version < tail.last_batch_id
        and not _left_unchanged(engine, warehouse, info.txn_version)
    ):
        raise LakejoinError(
            f"{name} ends at batch {info.txn_version}, but the batch log has committed batch {tail.last_batch_id} "
            f"(was it restored to an older version?): {fix}"
        )
    return _check_batches(engine, warehouse, path, pipeline, tail)
