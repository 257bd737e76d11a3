"""Refuse, before writing anything, a warehouse that is not lakejoin's or whose tables disagree with its batch log.

Every lakejoin write to silver and gold carries the application transaction (pipeline:table, batch id),
and every plan records the state versions it read. So a table that lacks lakejoin's transactions, holds a
batch the log never planned, is older than a version the log read, or is missing while the log needs it,
was changed by something else — and joining on top of it would lose or repeat pairs.
"""

from __future__ import annotations

import os

from pyspark.sql.types import StructType

from state.batch_log import BatchLog, LogTail
from state.engines import DeltaEngine
from state.engines.base import DeltaReader
from state.errors import LakejoinError
from state.layout import IN_STORE, Warehouse
from state.lock import is_local
from state.joiner import identity_column
from state.relations import ID, TS, relation

STATE_COLUMNS = (ID, TS, "_arrival_seq", IN_STORE)
GOLD_COLUMNS = ("owner", "batch_id")  # and each member's id: _r_id, _s_id, …
LATE_COLUMNS = ("relation", ID, TS, "reason", "watermark", "batch_id")
LOG_COLUMNS = ("batch_id", "phase", "seq_from", "seq_to", "bronze_versions", "state_versions")
DQ_RESULT_COLUMNS = ("batch_id", "rule", "table", "policy", "evaluated", "failed")
DQ_QUARANTINE_COLUMNS = ("batch_id", "rule", "table", "row_key", "row")


def require_engine_for(warehouse: Warehouse, engine: DeltaReader) -> None:
    """Unity Catalog tables are reached through Spark's catalog: delta-rs takes paths only."""
    if warehouse.in_catalog and engine.name != "spark":
        raise LakejoinError(
            f"{warehouse.root} is a Unity Catalog schema: its tables need Delta on Spark (engine 'spark', "
            "as on Databricks); delta-rs takes a folder path"
        )


def require_warehouse(engine: DeltaReader, warehouse: Warehouse) -> None:
    """A lakejoin warehouse is one that has had an ingest: it holds ``bronze/_ingests``."""
    if engine.version(warehouse.ingest_log) is None:
        raise LakejoinError(
            f"{warehouse.root} is not a lakejoin warehouse (it has no bronze/_ingests table): "
            f"ingest files into it first with 'lakejoin ingest --warehouse {warehouse.root}'"
        )


def check_ingest_target(engine: DeltaEngine, warehouse: Warehouse) -> None:
    """Ingest creates a warehouse only in a new or empty folder, never among someone else's files."""
    if not is_local(warehouse.root) or any(engine.version(path) is not None for path in (warehouse.ingest_log, warehouse.definition)):
        return
    others = [name for name in _listdir(warehouse.root) if not name.startswith("_lakejoin_")]
    if others:
        raise LakejoinError(
            f"{warehouse.root} already holds other files ({others[0]}, …) and is not a lakejoin warehouse: "
            "ingest into a new or empty folder"
        )


def _listdir(root: str) -> list[str]:
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def check_consistency(engine: DeltaReader, warehouse: Warehouse, pipeline: str) -> LogTail:
    """The batch log's tail, once every silver and gold table is shown to be what the log says it is."""
    require_warehouse(engine, warehouse)
    legacy = [path for path in warehouse.legacy_state() if engine.version(path) is not None]
    if legacy:
        raise LakejoinError(
            f"{warehouse.name_of(legacy[0])} is a state table of lakejoin's earlier layout (a table per buffer; state "
            f"is now one table per relation): {_rebuild(warehouse)}"
        )
    _require_columns(warehouse, warehouse.batches, engine.schema(warehouse.batches), LOG_COLUMNS)
    tail = BatchLog(engine, warehouse.batches, warehouse.app_id(pipeline, warehouse.batches)).tail()
    recorded = tail.newest.state_versions if tail.newest else {}
    for name, path in warehouse.buffers().items():
        _check_output(engine, warehouse, path, STATE_COLUMNS, pipeline, tail, recorded.get(name))
    _check_output(engine, warehouse, warehouse.late_arrivals, LATE_COLUMNS, pipeline, tail, None)
    _check_output(engine, warehouse, warehouse.dq_quarantine, DQ_QUARANTINE_COLUMNS, pipeline, tail, None)
    _check_output(engine, warehouse, warehouse.dq_results, DQ_RESULT_COLUMNS, pipeline, tail, None)
    first = identity_column(warehouse.relations[0], ID)  # every join kind's gold has the first relation's members
    _check_output(engine, warehouse, warehouse.gold, (first, *GOLD_COLUMNS), pipeline, tail, None, written_every_batch=True)
    for name, version in (tail.newest.bronze_versions if tail.newest else {}).items():
        bronze = warehouse.bronze(relation(name, warehouse.relations))
        current = engine.version(bronze)
        if current is None or current < version:
            raise LakejoinError(
                f"{warehouse.name_of(bronze)} is at version {current}, but batch {tail.last_batch_id} read version "
                f"{version}: bronze was replaced or restored; {_rebuild(warehouse)}"
            )
    return tail


def _rebuild(warehouse: Warehouse) -> str:
    return f"rebuild silver and gold from bronze with 'lakejoin reset --warehouse {warehouse.root} --yes'"


def _require_columns(warehouse: Warehouse, path: str, schema: StructType | None, columns: tuple[str, ...]) -> None:
    missing = [] if schema is None else [column for column in columns if column not in schema.fieldNames()]
    if missing:
        raise LakejoinError(
            f"{warehouse.name_of(path)} was not written by lakejoin (no column {missing[0]}): "
            f"move it away, or {_rebuild(warehouse)}"
        )


def _check_output(
    engine: DeltaEngine,
    warehouse: Warehouse,
    path: str,
    columns: tuple[str, ...],
    pipeline: str,
    tail: LogTail,
    recorded_version: int | None,
    written_every_batch: bool = False,
) -> None:
    name, fix = warehouse.name_of(path), _rebuild(warehouse)
    app_id = warehouse.app_id(pipeline, path)
    info = engine.info(path, app_id)
    if info is None:
        if recorded_version is not None:
            raise LakejoinError(f"{name} is missing, but batch {tail.last_batch_id} read its version {recorded_version}: {fix}")
        if written_every_batch and tail.committed_batch_id > 0:
            raise LakejoinError(f"{name} is missing, but the batch log has committed batch {tail.committed_batch_id}: {fix}")
        return
    _require_columns(warehouse, path, info.schema, columns)
    batch = info.txn_version
    if batch is None:
        raise LakejoinError(
            f"{name} was not written by pipeline '{pipeline}' (no Delta transaction of {app_id!r}): move it away, or {fix}"
        )
    if batch > tail.last_batch_id:
        raise LakejoinError(
            f"{name} holds batch {batch}, but the batch log ends at batch {tail.last_batch_id} "
            f"(was silver/batches deleted or restored?): {fix}"
        )
    if written_every_batch and batch < tail.committed_batch_id:
        raise LakejoinError(
            f"{name} ends at batch {batch}, but the batch log has committed batch {tail.committed_batch_id} "
            f"(was it restored to an older version?): {fix}"
        )
    if recorded_version is not None and info.version < recorded_version:
        raise LakejoinError(
            f"{name} is at version {info.version}, but batch {tail.last_batch_id} read its version {recorded_version} "
            f"(was it replaced or restored?): {fix}"
        )
