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
from state.engines.base import DeltaReader, Recorded, TableInfo
from state.engines.table import Table, Tables
from state.errors import LakejoinError
from state.join.joiner import identity_column
from state.join.relations import ID, TS
from state.layout import IN_STORE, Warehouse, is_table_name, state_name
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
        raise not_a_warehouse(warehouse.root)


def not_a_warehouse(root: str) -> LakejoinError:
    """The error of a command that needs a warehouse where there is none (no ingest log, definition or batch log)."""
    return LakejoinError(
        f"{root} is not a lakejoin warehouse (it has no bronze/_ingests or silver_definition table): ingest files into "
        f"it first with 'lakejoin ingest --warehouse {root}'"
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


def check_consistency(tables: Tables, warehouse: Warehouse, creates: bool = False) -> LogTail:
    """The batch log's tail, once every table the batches write is shown to be what the log says it is; with the plan
    of the batch after the log's last when some table records a write of it (a batch that died: the next run resumes it
    with that plan, which its writes carry). ``creates``: the run may make the warehouse (it lands files)."""
    engine = tables.batches.engine
    if not creates:
        require_warehouse(engine, warehouse)
    fix = _rebuild(warehouse)
    log_schema = tables.batches.schema()
    _refuse_earlier_log(warehouse, log_schema)
    _require_columns(tables.batches.name, log_schema, LOG_COLUMNS, fix)
    tail = BatchLog(engine, tables.batches.path, tables.batches.app_id).tail()
    if tail.last is None:
        _refuse_earlier_tables(engine, warehouse)
    found: dict[str, Recorded] = {}
    last = _pinned(tail.last) if tail.last else None
    read = last.bronze_versions if last else {}  # where a later batch's commits start
    for rel, bronze in tables.bronze.items():  # ingests write bronze too, outside any batch
        found |= _check_batches(bronze, bronze.info(read.get(rel.name)), tail, fix)
    found |= _check_batches(tables.quarantine, tables.quarantine.info(), tail, fix)
    outputs = [(table, STATE_COLUMNS) for table in tables.state.values()] + [
        (tables.late_arrivals, LATE_COLUMNS),
        (tables.dq_quarantine, DQ_QUARANTINE_COLUMNS),
        (tables.gold_changes, ()),
    ]
    for table, columns in outputs:
        found |= _check_output(table, columns, tail, fix)
    first = identity_column(next(iter(tables.bronze)), ID)  # every join kind's gold has the first relation's members
    found |= _check_output(tables.gold, (first, *GOLD_COLUMNS), tail, fix, written_every_batch=tables.batches)
    unfinished = next((BatchPlan.decoded(record.plan) for record in found.values() if record.plan is not None), None)
    if found and unfinished is None:
        raise LakejoinError(
            f"{next(iter(found))} holds batch {tail.last_batch_id + 1}, which the batch log has not committed, without "
            f"its plan: {fix}"
        )
    newest = unfinished or last
    batch = tail.last_batch_id + (unfinished is not None)  # the batch that read what ``newest`` pins
    for rel, bronze in tables.bronze.items():
        read = (newest.bronze_versions if newest else {}).get(rel.name)
        if read is None:
            continue
        current = bronze.version()
        if current is None or current < read:
            raise LakejoinError(
                f"{bronze.name} is at version {current}, but batch {batch} read version {read}: bronze was replaced "
                f"or restored; {fix}"
            )
    for rel, state in tables.state.items():
        read = (newest.state_versions if newest else {}).get(state_name(rel))
        if read is None:
            continue
        current = state.version()
        if current is None:
            raise LakejoinError(f"{state.name} is missing, but batch {batch} read its version {read}: {fix}")
        if current < read:
            raise LakejoinError(
                f"{state.name} is at version {current}, but batch {batch} read its version {read} (was it replaced or "
                f"restored?): {fix}"
            )
    return replace(tail, unfinished=unfinished)


def _refuse_earlier_log(warehouse: Warehouse, log_schema: StructType | None) -> None:
    """A batch log with phases: lakejoin's earlier layout, which only a rebuild from bronze turns into today's. The
    earlier layout's other tables (a table per buffer, the rules' results apart) left lakejoin no later than the log's
    phases, so a warehouse that ran batches with them has a log with phases: they need no look-up while the log has a
    batch."""
    if log_schema is not None and "phase" in log_schema.fieldNames():
        _refuse_earlier(warehouse, warehouse.batches)


def _refuse_earlier_tables(engine: DeltaReader, warehouse: Warehouse) -> None:
    """The earlier layout's other tables, in a warehouse whose batch log has no batch (a first run, or a log deleted):
    looked up only then (a statement each on the public reader, a round trip each over Spark Connect)."""
    for path in [*warehouse.legacy_state(), warehouse.legacy_rule_results]:
        if engine.version(path) is not None:
            _refuse_earlier(warehouse, path)


def _refuse_earlier(warehouse: Warehouse, path: str) -> None:
    raise LakejoinError(f"{warehouse.name_of(path)} is a table of lakejoin's earlier layout: {_rebuild(warehouse)}")


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


def _require_columns(name: str, schema: StructType | None, columns: tuple[str, ...], fix: str) -> None:
    missing = [] if schema is None else [column for column in columns if column not in schema.fieldNames()]
    if missing:
        raise LakejoinError(f"{name} was not written by lakejoin (no column {missing[0]}): move it away, or {fix}")


def _check_batches(table: Table, info: TableInfo | None, tail: LogTail, fix: str) -> dict[str, Recorded]:
    """A table's record of this pipeline's batches (``info``): none after the one after the log's last. Returns the
    record of that next batch when the table has it (the batch died after writing here)."""
    if info is None or info.txn_version is None or info.txn_version <= tail.last_batch_id:
        return {}
    batch = info.txn_version
    if batch > tail.last_batch_id + 1:
        raise LakejoinError(
            f"{table.name} holds batch {batch}, but the batch log ends at batch {tail.last_batch_id} "
            f"(was silver/batches deleted or restored?): {fix}"
        )
    return {table.name: info.recorded}


def _left_unchanged(batches: Table, batch: int) -> bool:
    """Whether the batch log shows that every batch after ``batch`` added no gold row and took none out: gold is then
    what they left it, though it lacks their marks (earlier versions left none for a change feed's MERGE that changed
    nothing). A gold restored to before a batch that changed it is still refused."""
    after = batches.rows(where=f"batch_id > {batch}")
    return after is not None and all(
        not row.get("pairs") and not dict(row.get("changes") or {}).get("retracted") for row in after.to_pylist()
    )


def _check_output(
    table: Table, columns: tuple[str, ...], tail: LogTail, fix: str, written_every_batch: Table | None = None
) -> dict[str, Recorded]:
    """``_check_batches`` for a table only batches write: it has lakejoin's columns and this pipeline's transactions,
    and, when every batch writes it (``written_every_batch``: the batch log), it has every batch the log committed."""
    info = table.info()
    if info is None:
        if written_every_batch is not None and tail.last_batch_id > 0:
            raise LakejoinError(
                f"{table.name} is missing, but the batch log has committed batch {tail.last_batch_id}: {fix}"
            )
        return {}
    _require_columns(table.name, info.schema, columns, fix)
    if info.recorded.unknown:  # the app's commits have left the log: the batch log is the record
        return {}
    if info.txn_version is None:
        raise LakejoinError(
            f"{table.name} was not written by pipeline '{table.pipeline}' (no Delta transaction of {table.app_id!r}): "
            f"move it away, or {fix}"
        )
    if (
        written_every_batch is not None
        and info.txn_version < tail.last_batch_id
        and not _left_unchanged(written_every_batch, info.txn_version)
    ):
        raise LakejoinError(
            f"{table.name} ends at batch {info.txn_version}, but the batch log has committed batch "
            f"{tail.last_batch_id} (was it restored to an older version?): {fix}"
        )
    return _check_batches(table, info, tail, fix)
