"""``lakejoin status``: what a warehouse holds and how far the joiner has got. It changes nothing."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pipelines.bronze.sources import source_status
from pipelines.definition import recorded
from state.config import Config, OnAxis
from state.engines.base import DeltaReader
from state.engines.table import Table, Tables
from state.errors import LakejoinError
from state.event_time import bronze_kind, render
from state.join.final import MATCHED
from state.join.relations import TS
from state.layout import IN_STORE, Warehouse
from state.log import progress
from state.log.batch_log import BatchLog, LogTail
from state.log.checks import check_consistency, require_warehouse
from state.log.lock import JOIN, holder


@dataclass(frozen=True)
class TableStatus:
    name: str
    version: int | None  # None: the table does not exist (yet)
    rows: int | None


@dataclass(frozen=True)
class WarehouseStatus:
    warehouse: str
    tables: list[TableStatus]
    last_committed_batch: int  # 0 before the first
    joined_up_to: int  # arrivals with _arrival_seq up to here are in committed batches
    unfinished_batch: int | None  # planned but not committed: the next run resumes it
    pending: dict[str, int]  # relation -> arrivals in bronze not yet in a committed batch
    watermarks: dict[str, int]  # on the event-time axis (state/event_time.py)
    event_time: str | None  # the kind of event time bronze holds: timestamp, date or integer (None before any)
    late: int  # arrivals set aside in quarantine/late_arrivals
    bounded: bool  # False: stores keep full history (no window, or no watermarks to evict by)
    rules: list[dict]  # the last checked batch's data-quality results: rule, table, policy, evaluated, failed, examples
    running: str | None  # who holds the run lock, when a run is in progress
    problem: str | None  # why the next run would refuse the warehouse, if it would
    definition: dict | None = None  # the recorded definition in force: version, recorded_at, settings
    sources: list[dict] = field(default_factory=list)  # per relation read from a table: versions ingested and pending
    # Outer, anti and as-of joins: per waiting relation, its stored records whose rows wait to be final
    # (state/join/final.py): how many, the oldest's event time, and the watermark that makes that one final
    waiting: list[dict] = field(default_factory=list)
    # Change feeds (state/join/changes.py): what the last committed batch did with their rows, and every batch together
    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    # Idle relations (as the last batch decided) and declared progress (state/log/progress.py):
    # relation -> since / up to
    idle: dict[str, str] = field(default_factory=dict)
    declared: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        width = max(len(table.name) for table in self.tables)
        lines = [f"warehouse {self.warehouse}", f"  {'table':<{width}}  version  rows"]
        for table in self.tables:
            version = "-" if table.version is None else str(table.version)
            rows = "-" if table.rows is None else f"{table.rows:,}"
            lines.append(f"  {table.name:<{width}}  {version:>7}  {rows}")
        lines.append(
            f"last committed batch: {self.last_committed_batch or 'none'} (arrivals joined up to #{self.joined_up_to})"
        )
        if self.unfinished_batch is not None:
            lines.append(f"unfinished batch: {self.unfinished_batch} (the next run resumes it with its plan)")
        lines.append(
            "pending arrivals: " + ", ".join(f"{count:,} {name.upper()}" for name, count in self.pending.items())
        )
        lines += [_describe_source(source) for source in self.sources]
        marks = ", ".join(f"{name.upper()} {render(mark, self.event_time)}" for name, mark in self.watermarks.items())
        lines.append(f"watermarks: {marks or 'none (no allowed_lateness set)'}")
        lines += [
            f"idle: {name.upper()} since {since} (for the others' rows and eviction its watermark is the lowest of "
            "theirs)"
            for name, since in self.idle.items()
        ]
        lines += [
            f"declared: no {name.upper()} record older than {to} will come (lakejoin advance)"
            for name, to in self.declared.items()
        ]
        lines.append(f"late arrivals: {self.late:,}")
        lines.append(
            "state: "
            + (
                "bounded by watermarks and window"
                if self.bounded
                else "stores keep full history (set allowed_lateness and window to bound them)"
            )
        )
        lines += [
            f"waiting to be final: {wait['records']:,} {wait['relation'].upper()} records"
            + (
                ""
                if wait["oldest"] is None
                else f", the oldest at {wait['oldest']}: its row comes once {wait['until']}"
            )
            for wait in self.waiting
        ]
        for which, counts in self.changes.items():
            lines.append(f"changes, {which}: " + ", ".join(f"{count:,} {name}" for name, count in counts.items()))
        if self.rules:
            failing = [rule for rule in self.rules if rule["failed"]]
            lines.append(
                f"data quality, batch {self.rules[0]['batch_id']}: {len(self.rules) - len(failing)} of "
                f"{len(self.rules)} rule checks passed"
            )
            lines += [
                f"  {rule['rule']} on {rule['table']}: {rule['failed']:,} of {rule['evaluated']:,} rows failed "
                f"({rule['policy']}), e.g. {rule['examples']}"
                for rule in failing
            ]
        if self.running:
            lines.append(f"running: {self.running}")
        if self.definition is not None:
            lines.append(f"definition: version {self.definition['version']}, recorded {self.definition['recorded_at']}")
            lines += [f"  {name}: {value}" for name, value in _flat(self.definition["settings"])]
        lines.append(f"consistency: {self.problem or 'OK'}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return asdict(self)


def warehouse_status(engine: DeltaReader, warehouse: Warehouse, config: Config) -> WarehouseStatus:
    require_warehouse(engine, warehouse)
    problem = None
    handles = Tables.of(engine, warehouse)
    try:
        tail = check_consistency(handles, warehouse)
    except LakejoinError as exc:
        problem = str(exc)
        tail = _tail_anyway(handles.batches)
    pending = {}
    for rel in warehouse.relations:
        pending[rel.name] = engine.count(warehouse.bronze(rel), where=f"_arrival_seq > {tail.last_seq}") or 0
    tables = [
        _table_status(engine, warehouse, path)
        for path in warehouse.tables()
        if path != warehouse.gold_changes or engine.version(path) is not None
    ]
    late = next(table.rows for table in tables if table.name == warehouse.name_of(warehouse.late_arrivals))
    definition = recorded(engine, warehouse)
    kind = bronze_kind(handles.bronze, config.event_times)
    return WarehouseStatus(
        warehouse=warehouse.root,
        tables=tables,
        last_committed_batch=tail.last_batch_id,
        joined_up_to=tail.last_seq,
        unfinished_batch=None if tail.unfinished is None else tail.unfinished.batch_id,
        pending=pending,
        watermarks=tail.watermarks,
        event_time=kind,
        late=late or 0,
        # an as-of join bounds its quotes per key by the watermarks alone (docs/joins.md, "The as-of join")
        bounded=(config.window is not None or config.join_kind.as_of)
        and all(config.lateness(rel.name) is not None for rel in warehouse.relations),
        rules=_last_rule_results(tail),
        running=holder(warehouse.root, JOIN),
        problem=problem,
        sources=[
            source_status(engine, warehouse, rel, table)
            for rel in warehouse.relations
            if (table := config.spec(rel.name).table) is not None
        ],
        definition=None
        if definition is None
        else {
            "version": definition.version,
            "recorded_at": str(definition.recorded_at),
            "settings": definition.settings,
        },
        waiting=_waiting(engine, warehouse, config.on_axis(kind)),
        changes=_changes(engine, warehouse) if config.reads_changes else {},
        idle={
            name: progress.instant(since)
            for name, since in (dict(tail.last["idle"] or {}) if tail.last else {}).items()
        },
        declared={name: render(to, kind) or str(to) for name, to in progress.declared(handles.progress).items()},
    )


def _changes(engine: DeltaReader, warehouse: Warehouse) -> dict[str, dict[str, int]]:
    """The change counts the batch log records: the last committed batch's, and their sums over every batch."""
    schema = engine.schema(warehouse.batches)
    if schema is None or "changes" not in schema.fieldNames():
        return {}
    logged = engine.rows(warehouse.batches, where="changes IS NOT NULL")
    if logged is None:
        return {}
    counts = [
        (row["batch_id"], name, count)
        for row in logged.select(["batch_id", "changes"]).to_pylist()
        for name, count in row["changes"]
    ]
    if not counts:
        return {}
    last = max(batch for batch, _, _ in counts)
    total: dict[str, int] = {}
    for _, name, count in counts:
        total[name] = total.get(name, 0) + count
    return {f"batch {last}": {name: count for batch, name, count in counts if batch == last}, "all batches": total}


def _waiting(engine: DeltaReader, warehouse: Warehouse, axis: OnAxis) -> list[dict]:
    """Per relation whose records wait to be final (outer, anti, as-of joins), its stored records without a match
    yet (all, for an as-of join): each gives a row once the other relation's watermark passes its ``ts`` plus the
    kind's horizon."""
    waiting = []
    join, kind = axis.config.join_kind, axis.kind
    horizon = join.horizon(axis.window)
    for rel in join.waiting(warehouse.relations):
        path = warehouse.state(rel)
        schema = engine.schema(path)
        if schema is None:
            continue
        alone = IN_STORE + (f" AND NOT COALESCE({MATCHED}, false)" if MATCHED in schema.fieldNames() else "")
        found = engine.aggregate(path, alone, "count(*)", f"min({TS})")
        if found is None:
            continue
        count, oldest = found
        other = next(other for other in warehouse.relations if other != rel)
        passes = None if oldest is None or horizon is None else render(oldest + horizon, kind)
        until = None if passes is None else f"{other.label}'s watermark passes {passes}"
        waiting.append(
            {
                "relation": rel.name,
                "records": count,
                "oldest": None if oldest is None else render(oldest, kind),
                "until": until,
            }
        )
    return waiting


def _describe_source(source: dict) -> str:
    head = f"source {source['relation'].upper()}: {source['table']}"
    if "problem" in source:
        return f"{head}: {source['problem']}"
    if source["ingested_version"] is None:
        return (
            f"{head}: not read yet (the next run joins its snapshot at version {source['latest_version']}, and "
            f"{source['pending_versions'] - 1} versions after it)"
        )
    rows = "" if source["pending_rows"] is None else f", {source['pending_rows']:,} rows"
    return (
        f"{head}: read up to version {source['ingested_version']}, {source['pending_versions']} versions pending{rows}"
    )


def _flat(settings: dict, prefix: str = "") -> list[tuple[str, object]]:
    """Settings as dotted names and values, skipping the unset ones."""
    flat = []
    for name, value in settings.items():
        if isinstance(value, dict) and value:
            flat += _flat(value, f"{prefix}{name}.")
        elif value not in (None, {}, []):
            flat.append((f"{prefix}{name}", value))
    return flat


def _last_rule_results(tail: LogTail) -> list[dict]:
    """The last committed batch's rule results, as its log row holds them."""
    if tail.last is None:
        return []
    results = [{"batch_id": tail.last_batch_id, **rule} for rule in tail.last["rules"] or []]
    return sorted(results, key=lambda row: (row["table"], row["rule"]))


def _tail_anyway(batches: Table) -> LogTail:
    """The log's tail even when the tables disagree with it; empty when the log itself is unreadable."""
    try:
        return BatchLog(batches.engine, batches.path, batches.app_id).tail()
    except Exception:  # noqa: BLE001 - a foreign log can fail in any way; the problem line already says why
        return LogTail(0, 0)


def _table_status(engine: DeltaReader, warehouse: Warehouse, path: str) -> TableStatus:
    return TableStatus(warehouse.name_of(path), engine.version(path), engine.count(path))
