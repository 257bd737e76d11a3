"""Source tables: a relation read in place from a Delta table the user already has, version by version.

A table's new versions are ingested as **pointers**: each accepted row becomes a thin bronze row holding its id,
event time (and partition values), its place in the global arrival order and where the row is (the data file and
its index there). Nothing else of the user's rows is copied. A batch reads its slice's rows from those files
(state/log/pointers.py), so everything after ingest — batches, the exactly-once protocol, lateness, rules — is
the same as for files (docs/design.md section 3.9).

What a source commit may do: append (read once), rewrite without changing data (``dataChange = false``: OPTIMIZE,
Z-order; followed, nothing read), or remove and rewrite rows (DELETE, UPDATE, MERGE, overwrite): refused, or
skipped and logged under ``skip_change_commits``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pipelines.bronze.ingest import log_ingests, log_row, set_aside
from pipelines.bronze.parse import Parsed, firsts, numbered
from pipelines.bronze.write import Landed, Lander, Placed, Provenance, land_rows, last_arrival_seq
from state.engines import Actions, DeltaEngine
from state.engines.base import CHANGE_FEED, DeltaReader, no_change_feed
from state.engines.table import Tables
from state.errors import LakejoinError
from state.frames import union_by_name
from state.join.relations import INSERT, Relation, RelationSpec
from state.layout import Warehouse
from state.log.pointers import protected, read_failure, require_distinct_names, schema_at
from state.names import column

# A row's place within one ingest of a table: its data file's ordinal (by version, then write time and path), then
# its index in the file (Parquet row index), so the arrival order within a version is the same on every read.
ROW_BITS = 33
APPEND, REWRITE, CHANGE = "append", "rewrite", "change"
CDF_TYPE, CDF_VERSION = (
    "_change_type",
    "_commit_version",
)  # a Change Data Feed's columns (docs.delta.io, "Change data feed")
COLUMN_MAPPING = "delta.columnMapping.mode"


@dataclass(frozen=True)
class SourceResult:
    relation: str
    table: str
    versions: tuple[int, int] | None = None  # the table versions this ingest covered; None when none was new
    landed: int = 0
    quarantined: int = 0
    duplicates: int = 0
    skipped: tuple[str, ...] = ()  # "version 4 (DELETE)": change commits skipped under skip_change_commits

    def describe(self) -> str:
        if self.versions is None:
            return f"source {self.table}: no new version for {self.relation}"
        first, last = self.versions
        span = f"version {last}" if first == last else f"versions {first}..{last}"
        skipped = f"; skipped {', '.join(self.skipped)} (skip_change_commits)" if self.skipped else ""
        return (
            f"source {self.table}: {span}: {self.landed} rows to bronze/{self.relation} (pointers), "
            f"{self.quarantined} quarantined, {self.duplicates} duplicates skipped{skipped}"
        )


@dataclass(frozen=True)
class SourceCommit:
    """What one version of a source table did, as far as joining it goes."""

    version: int
    operation: str
    kind: str  # APPEND, REWRITE or CHANGE
    files: tuple[dict, ...]  # the add actions of an append: the rows it brought

    @classmethod
    def of(cls, version: int, actions: Actions, operation: str | None = None) -> SourceCommit:
        """Classified by its actions, not its operation's name: any row removed (a ``remove`` with ``dataChange``,
        or an ``add`` carrying a deletion vector) is a change; rows added alone are an append."""
        adds = [action["add"] for action in actions if "add" in action]
        removes = [action["remove"] for action in actions if "remove" in action]
        info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
        mode = str((info.get("operationParameters") or {}).get("mode", "append")).lower()
        named = operation or (
            info.get("operation", "?") + ("" if mode == "append" else f" ({mode})")
        )  # WRITE (overwrite)
        added = tuple(add for add in adds if add.get("dataChange", True))
        if any(remove.get("dataChange", True) for remove in removes) or any(add.get("deletionVector") for add in added):
            return cls(version, named, CHANGE, ())
        return cls(version, named, APPEND if added else REWRITE, added)


@dataclass(frozen=True)
class Pending:
    """A source table's versions after the last ingested, listed and checked: what its next ingest covers."""

    relation: Relation
    table: str
    identity: str | None  # the table's id, recorded with the ingest
    commits: list[SourceCommit]


def ingest_sources(engine: DeltaEngine, warehouse: Warehouse, specs: dict[str, RelationSpec]) -> list[SourceResult]:
    """Ingest what every source table gained since its last ingest (a run does this before planning batches). Every
    table's versions are listed and checked before any is ingested, so a refused commit leaves all of them as they
    were."""
    pending = [
        pending_versions(engine, warehouse, rel, specs[rel.name])
        for rel in warehouse.relations
        if specs[rel.name].table is not None
    ]
    return [_ingest(engine, warehouse, specs, versions) for versions in pending]


def pending_versions(engine: DeltaEngine, warehouse: Warehouse, rel: Relation, spec: RelationSpec) -> Pending:
    """The versions of ``rel``'s table after the last one ingested, classified; a change commit is refused here
    unless ``skip_change_commits``."""
    table = spec.table
    assert table is not None
    _, identity, commits = _listed(engine, warehouse, rel, table)
    change = next((commit for commit in commits if commit.kind == CHANGE), None)
    if spec.changes is not None:  # a change feed: every commit's changes are read from the table's Change Data Feed
        if commits and commits[0].operation == "snapshot" and not _records_changes(engine, table, commits[0].version):
            raise no_change_feed(table, f"{CHANGE_FEED} is not set")
    elif change is not None and not spec.skip_change_commits:
        raise LakejoinError(
            f"source table {table} version {change.version} is a {change.operation}, which removes or rewrites rows: "
            f"lakejoin joins appends only and wrote nothing; set relations.{rel.name}.skip_change_commits: true to "
            "skip such commits"
        )
    return Pending(rel, table, identity, commits)


def _listed(
    engine: DeltaReader, warehouse: Warehouse, rel: Relation, table: str
) -> tuple[int | None, str | None, list[SourceCommit]]:
    """The last version of ``table`` logged as ingested, the table's id, and the versions after it, classified. Before
    the first logged ingest, the first is the table's snapshot: its latest, or the one an ingest that died before its
    log row had read (read again: its rows are found as duplicates, its quarantined rows recorded, nothing skipped)."""
    logged, pointed, known = _last_ingested(engine, warehouse, rel, table)
    try:
        return _listed_after(engine, rel, table, logged, pointed, known)
    except (PySparkException, Py4JJavaError) as exc:  # a table whose history Databricks will not read: refused here
        raise protected(table, exc) or exc


def _listed_after(
    engine: DeltaReader, rel: Relation, table: str, logged: int | None, pointed: int | None, known: set[str]
) -> tuple[int | None, str | None, list[SourceCommit]]:
    found = engine.source_identity(table)
    if found is None:
        raise LakejoinError(
            f"relation {rel.name} reads table {table}, which does not exist (or is not a Delta table): create it, or "
            f"fix relations.{rel.name}.table"
        )
    identity, latest = found
    last = logged if logged is not None else pointed
    if last is not None and (latest < last or (known and identity not in known)):
        raise LakejoinError(
            f"source table {table} is not the table lakejoin has read up to version {last} (now at version {latest}"
            f"{'' if not known or identity in known else ', another table id'}): it was dropped and created again; "
            "join it in a new warehouse"
        )
    commits, after = [], logged
    if logged is None:
        snapshot = engine.source_snapshot(table, pointed)
        if snapshot is None:
            raise LakejoinError(f"source table {table} was dropped while lakejoin read it: run again once it is back")
        version, actions = snapshot
        _check_readable(table, actions, whole=True)
        commits, after = [SourceCommit.of(version, actions, "snapshot")], version
    for version, actions in engine.source_commits(table, after):
        _check_readable(table, actions, whole=False)
        commits.append(SourceCommit.of(version, actions))
    return logged, identity, commits


def _ingest(
    engine: DeltaEngine, warehouse: Warehouse, specs: dict[str, RelationSpec], pending: Pending
) -> SourceResult:
    """``pending``'s appends as pointers, its rewrites followed, its (skipped) change commits logged: one landing
    (pipelines/bronze/write.py), then the rows it set aside, then one ingest-log commit."""
    rel, table, commits = pending.relation, pending.table, pending.commits
    if not commits:
        return SourceResult(rel.name, table)
    changes = [commit for commit in commits if commit.kind == CHANGE]
    appended = [commit for commit in commits if commit.kind == APPEND]
    newest = commits[-1].version
    lander = Lander.for_call(engine, warehouse, specs)
    source = Provenance(
        rel,
        table,
        lander.tag,
        lander.at,
        F.col("_source_file"),
        F.col("_source_line").bitwiseAND((1 << ROW_BITS) - 1),
        F.col("_source_version"),
        kept=(specs[rel.name].event_time, *_partition_columns(appended)),
    )
    # logged with the ingest's own row, after its pointers landed: a crash before that leaves the versions to read again
    skipped = [
        (change.version, f"skipped: version {change.version} is a {change.operation} (skip_change_commits)")
        for change in changes
    ]
    first = last_arrival_seq(Tables.of(engine, warehouse))
    try:
        if specs[rel.name].changes is not None:
            landed, placed = _ingest_changes(lander, rel, table, commits, source, first)
            changes, skipped = [], []
        elif appended:
            landed, placed = _ingest_appends(lander, rel, table, appended, source, newest, first)
        else:  # only rewrites (or skipped changes): the log moves past them
            landed, placed = Landed(rel.name), Placed(table, first, 0)
    except (PySparkException, Py4JJavaError) as exc:
        raise read_failure(table)(exc) from exc
    set_aside(
        engine,
        warehouse,
        rel,
        [] if landed.quarantined is None else [landed.quarantined],
        [f"{table}@{commits[0].version}-{newest}"],
    )
    tally = landed.total
    row = log_row(lander, rel, placed, None, tally, version=newest, table_id=pending.identity)
    skips = [
        {
            **row,
            "rows_landed": 0,
            "rows_quarantined": 0,
            "rows_duplicate": 0,
            "seq_to": placed.first,
            "refused": why,
            "source_version": version,
        }
        for version, why in skipped
    ]
    log_ingests(engine, warehouse, [*skips, row])
    return SourceResult(
        rel.name,
        table,
        (commits[0].version, newest),
        tally.landed,
        tally.quarantined,
        tally.duplicates,
        tuple(f"version {change.version} ({change.operation})" for change in changes),
    )


def _ingest_appends(
    lander: Lander, rel: Relation, table: str, appended: list[SourceCommit], source: Provenance, newest: int, first: int
) -> tuple[Landed, Placed]:
    """The appended rows classified as a file's would be (ids, event times, duplicates, conflicts), then landed.
    Files in the order they were written (a snapshot holds the table's whole history), then by path."""
    engine = lander.engine
    written = lambda add: (add.get("modificationTime") or 0, add["path"])  # noqa: E731 - a sort key
    files = [(commit.version, add) for commit in appended for add in sorted(commit.files, key=written)]
    require_distinct_names(table, [add["path"] for _, add in files])
    parsed, placed = _placed(_file_rows(engine, table, schema_at(engine, table, newest), files), table, first)
    return land_rows(lander, rel, parsed, [placed], source), placed


def _ingest_changes(
    lander: Lander, rel: Relation, table: str, commits: list[SourceCommit], source: Provenance, first: int
) -> tuple[Landed, Placed]:
    """A change feed's new versions landed whole (bronze keeps every version of a record, state/join/changes.py): a
    first ingest's snapshot as inserts at its version, then each later version's Change Data Feed, an update by its new
    version (``update_postimage``), each change sequenced by its commit version."""
    engine = lander.engine
    schema = schema_at(engine, table, commits[-1].version)
    parts = []
    if commits[0].operation == "snapshot":
        snapshot = commits[0]
        rows = _file_rows(engine, table, schema, [(snapshot.version, add) for add in snapshot.files]).frame
        parts.append(rows.withColumns({CDF_TYPE: F.lit(INSERT), CDF_VERSION: F.lit(snapshot.version).cast("long")}))
    later = [commit.version for commit in commits if commit.operation != "snapshot"]
    if later:
        changes = engine.source_changes(table, later[0], later[-1]).where(F.col(CDF_TYPE) != "update_preimage")
        parts.append(
            _change_rows(
                changes, schema, table, first_line=len(commits[0].files) if commits[0].operation == "snapshot" else 0
            )
        )
    if not parts:
        return Landed(rel.name), Placed(table, first, 0)
    frame = union_by_name(parts, allow_missing=True)
    kept = [field for field in schema.fields if not field.name.startswith("_")]
    whole = replace(source, kept=tuple(field.name for field in kept))  # every column, each version's own
    parsed, placed = _placed(Parsed(frame, {field.name: field.dataType for field in kept}, text=False), table, first)
    return land_rows(lander, rel, parsed, [placed], whole), placed


def _placed(parsed: Parsed, table: str, first: int) -> tuple[Parsed, Placed]:
    """The rows at places after ``first``, in their order: data file by data file (a line's high bits), row by row
    within one (its low bits, which number a file's rows without a gap); one small job counts each file's rows."""
    block = F.shiftright(F.col("_source_line"), ROW_BITS)
    rows = [
        (row["block"], row["rows"])
        for row in parsed.frame.groupBy(block.alias("block")).agg(F.count(F.lit(1)).alias("rows")).collect()
    ]
    place = firsts(rows, first + 1, block) + F.col("_source_line").bitwiseAND((1 << ROW_BITS) - 1)
    return replace(parsed, frame=parsed.frame.withColumn("_arrival_seq", place)), Placed(
        table, first, sum(count for _, count in rows)
    )


def _change_rows(changes: DataFrame, schema: StructType, table: str, first_line: int) -> DataFrame:
    """Change Data Feed rows in the shape ingest classifies, numbered in commit order after ``first_line`` files'."""
    kept = [field for field in schema.fields if not field.name.startswith("_")]
    values = [column(field.name) for field in kept]
    ordered = numbered(changes.orderBy(CDF_VERSION), "_place")
    return ordered.select(
        (F.lit(first_line << ROW_BITS) + F.col("_place")).alias("_source_line"),
        F.lit(table).alias("_source_file"),
        F.col(CDF_VERSION).alias("_source_version"),
        F.to_json(F.struct(*values)).alias("_raw"),
        F.lit(False).alias("_unparsable"),
        *values,
        CDF_TYPE,
        CDF_VERSION,
    )


def _records_changes(engine: DeltaEngine, table: str, version: int) -> bool:
    """The table records its changes at ``version`` (its ``delta.enableChangeDataFeed``)."""
    snapshot = engine.source_snapshot(table, version)
    actions = [] if snapshot is None else snapshot[1]
    configuration = next(
        (action["metaData"].get("configuration") or {} for action in actions if "metaData" in action), {}
    )
    return str(configuration.get(CHANGE_FEED, "false")).lower() == "true"


def _file_rows(engine: DeltaEngine, table: str, schema: StructType, files: list[tuple[int, dict]]) -> Parsed:
    """The rows of ``files`` (version, add action) in the shape ingest classifies: ``_source_line`` the row's place
    (file ordinal, row index), ``_raw`` its JSON for the quarantine, the data files' and partitions' columns typed
    as the table declares them. Columns starting with '_' (Auto Loader's ``_rescued_data``) are lakejoin's
    namespace: not read."""
    spark = engine.spark
    partitions = sorted({name for _, add in files for name in add.get("partitionValues") or {}})
    kept = [field for field in schema.fields if not field.name.startswith("_")]
    stored = StructType([field for field in kept if field.name not in partitions])
    catalog = spark.createDataFrame(
        [
            (
                add["path"].rsplit("/", 1)[-1],
                ordinal,
                version,
                add["path"],
                *[(add.get("partitionValues") or {}).get(p) for p in partitions],
            )
            for ordinal, (version, add) in enumerate(files)
        ],
        StructType(
            [
                StructField("_file_name", StringType()),
                StructField("_ordinal", LongType()),
                StructField("_source_version", LongType()),
                StructField("_source_file", StringType()),
                *[StructField(f"_partition_{i}", StringType()) for i in range(len(partitions))],
            ]
        ),
    )
    located = engine.source_files(table, stored, [(version, add["path"]) for version, add in files])
    joined = located.join(F.broadcast(catalog), "_file_name")
    values = [
        F.col(f"_partition_{partitions.index(field.name)}").cast(field.dataType).alias(field.name)
        if field.name in partitions
        else column(field.name)
        for field in kept
    ]
    frame = joined.select(
        F.shiftleft(F.col("_ordinal"), ROW_BITS).bitwiseOR(F.col("_row_index")).alias("_source_line"),
        "_source_file",
        "_source_version",
        F.to_json(F.struct(*values)).alias("_raw"),
        F.lit(False).alias("_unparsable"),
        *values,
    )
    return Parsed(frame, {field.name: field.dataType for field in kept}, text=False)


def _partition_columns(appended: list[SourceCommit]) -> list[str]:
    return sorted({name for commit in appended for add in commit.files for name in add.get("partitionValues") or {}})


def _check_readable(table: str, actions: Actions, whole: bool) -> None:
    """Refuse a table whose files lakejoin cannot read as they are: columns stored under other names (column
    mapping), or rows deleted in place (deletion vectors) in a snapshot read whole."""
    for action in actions:
        mode = (action.get("metaData", {}).get("configuration") or {}).get(COLUMN_MAPPING, "none")
        if mode != "none":
            raise LakejoinError(
                f"source table {table} maps its column names ({COLUMN_MAPPING} = {mode}), which lakejoin cannot read "
                "yet: join a table without column mapping"
            )
        deleted = whole and (
            "deletionVectors" in (action.get("protocol", {}).get("readerFeatures") or [])
            and _unknown_deletions(actions)
        )
        if deleted or (whole and (action.get("add") or {}).get("deletionVector")):
            raise LakejoinError(
                f"source table {table} has rows deleted in place (deletion vectors), which lakejoin cannot read: "
                f"run REORG TABLE {table} APPLY (PURGE), then run again"
            )


def _unknown_deletions(actions: Actions) -> bool:
    """A snapshot whose adds do not say whether they carry deletion vectors (delta-rs does not list them)."""
    return any("add" in action and "deletionVector" not in action["add"] for action in actions)


def _last_ingested(
    engine: DeltaReader, warehouse: Warehouse, rel: Relation, table: str
) -> tuple[int | None, int | None, set[str]]:
    """From one read of ``rel``'s ingest log rows: the last version of ``table`` logged as ingested, the newest its
    pointers in bronze hold (beyond the log when an ingest died between its pointers and its log row), and the table
    ids the ingests recorded. A relation whose bronze points into another table cannot be moved to this one."""
    logged, known = None, set()
    schema = engine.schema(warehouse.ingest_log)
    if schema is not None and "source_version" in schema.fieldNames():
        log = engine.rows(warehouse.ingest_log, where=f"relation = '{rel.name}' AND source_version IS NOT NULL")
        tables = set(log.column("source_file").to_pylist())
        if tables - {table}:
            raise LakejoinError(
                f"bronze/{rel.name} points into table {sorted(tables - {table})[0]}, not {table}: a relation keeps its "
                "source; join the new table in a new warehouse"
            )
        logged = max(log.column("source_version").to_pylist(), default=None)
        if "source_table_id" in log.column_names:
            known = {identity for identity in log.column("source_table_id").to_pylist() if identity is not None}
    bronze = engine.schema(warehouse.bronze(rel))
    pointed = (
        engine.max_value(warehouse.bronze(rel), "_source_version")
        if bronze is not None and "_source_version" in bronze.fieldNames()
        else None
    )
    return logged, pointed, known


def source_status(engine: DeltaReader, warehouse: Warehouse, rel: Relation, table: str) -> dict[str, object]:
    """What ``lakejoin status`` shows of a source: the last version ingested, the table's latest, and what the next run
    would ingest (versions, and rows where the log's file statistics count them)."""
    try:
        logged, _, commits = _listed(engine, warehouse, rel, table)
    except LakejoinError as exc:
        return {"relation": rel.name, "table": table, "problem": str(exc)}
    counts = [_rows_in(add) for commit in commits if commit.kind == APPEND for add in commit.files]
    known = [count for count in counts if count is not None]  # a file without statistics leaves the sum unknown
    return {
        "relation": rel.name,
        "table": table,
        "ingested_version": logged,
        "latest_version": commits[-1].version if commits else logged,
        "pending_versions": len(commits),
        "pending_rows": sum(known) if len(known) == len(counts) else None,
    }


def _rows_in(add: dict) -> int | None:
    """The rows of a data file, from the statistics its add action carries (None when it has none)."""
    stats = add.get("stats")
    return json.loads(stats).get("numRecords") if stats else None
