"""Bronze ingest: raw files (JSON Lines, CSV, Parquet) or a DataFrame's records appended to ``bronze/<relation>``.

Bronze keeps the user's columns, typed, and adds what lakejoin derives: each record's id as text (``_id``,
from the configured id columns), its event time on the integer axis (``_ts``), its place in the global
arrival order (``_arrival_seq``, across all relations) and where it came from (file, line). Rows that break
the mapping or a column's type go to the quarantine table with a reason; the rest of the file still lands.
A file already ingested adds nothing, and a record whose id exists with other content is quarantined as a
conflict. A file that cannot be read as a whole (not the format its name says, a header naming a column twice)
is refused in one line with nothing of it written; column names are data (state/names.py). Parsing is
pipelines/parse.py, typing and classifying pipelines/classify.py; this module writes and logs.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipelines.classify import classify, configured_types
from pipelines.parse import Parsed, check_format, firsts, format_of, numbered, parse_file, parse_frame, stored_columns
from state.clock import now
from state.batch_log import BatchPlan
from state.engines import DeltaEngine, Txn
from state.engines.base import DeltaReader
from state.errors import FileRefused, LakejoinError
from state.faults import step
from state.layout import Warehouse
from state.names import column
from state.relations import ID, OP, SEQ, TS, Relation, RelationSpec, default_specs

# A DataFrame's rows are numbered in this column while they are parsed (a user's column may not start with '_').
FRAME_ROW = "_frame_row"
INGESTED_AT = pa.timestamp("us", tz="UTC")
# Arrival places are numbered in blocks of 2^20 lines of a file (one task per block).
BLOCK_BITS = 20
# Files up to this size are cached while they are ingested (parsed and classified once, not once per write).
CACHED_FILE_BYTES = 64 << 20


@dataclass(frozen=True)
class IngestResult:
    file: str
    relation: str
    landed: int = 0
    quarantined: int = 0
    duplicates: int = 0
    already_ingested: bool = False
    already_refused: bool = False  # a landing file refused before: skipped, its refusal is recorded
    refused: str | None = None  # why the file was refused as a whole (it landed nothing)
    recorded: bool = False  # the refusal is in quarantine/ingest, so the file is not tried again

    def describe(self) -> str:
        if self.already_refused:
            return f"{self.file}: refused before (quarantine/ingest says why), skipped"
        if self.refused is not None:
            then = "recorded in quarantine/ingest and not tried again" if self.recorded else "nothing of it was written"
            return f"{self.refused}; {then}"
        if self.already_ingested:
            return f"{self.file}: already ingested into bronze/{self.relation}, nothing added"
        return (
            f"{self.file}: {self.landed} rows to bronze/{self.relation}, "
            f"{self.quarantined} quarantined, {self.duplicates} duplicates skipped"
        )


def ingest_files(
    spark: SparkSession,
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    files: list[str],
    specs: dict[str, RelationSpec] | None = None,
    progress: Callable[[IngestResult], None] = lambda _: None,
) -> list[IngestResult]:
    """Ingest ``files`` in the given order: their rows arrive in that order, line by line. A file refused as a
    whole is reported in its result and the next one goes on; ``progress`` hears of each file as it ends."""
    for file in files:
        format_of(file)
        if not os.path.isfile(file):
            raise LakejoinError(f"no such file: {file}")
    results = []
    for file in files:
        results.append(ingest_or_refuse(spark, engine, warehouse, rel, file, specs))
        progress(results[-1])
    return results


def ingest_or_refuse(
    spark: SparkSession,
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    file: str,
    specs: dict[str, RelationSpec] | None = None,
    record_refusal: bool = False,
) -> IngestResult:
    """``ingest_file``, with a refusal as a result. ``record_refusal`` (a landing folder, where nobody passes the
    file again by hand) keeps it in quarantine/ingest and the ingest log, so the file is not tried again."""
    try:
        return ingest_file(spark, engine, warehouse, rel, file, specs, skip_refused=record_refusal)
    except FileRefused as refused:
        recorded = record_refusal and refused.lasting  # a file that failed to be read is tried again
        if recorded:
            _record_refusal(engine, warehouse, Provenance.of(rel, file), _sha256(os.path.abspath(file)), str(refused))
        return IngestResult(file, rel.name, refused=str(refused), recorded=recorded)


INGEST_LOG_SCHEMA = pa.schema(
    [
        ("ingest_id", pa.string()),
        ("relation", pa.string()),
        ("source_file", pa.string()),
        ("sha256", pa.string()),
        ("rows_landed", pa.int64()),
        ("rows_quarantined", pa.int64()),
        ("rows_duplicate", pa.int64()),
        ("seq_from", pa.int64()),
        ("seq_to", pa.int64()),
        ("ingested_at", INGESTED_AT),
        ("refused", pa.string()),  # why a landing file was refused as a whole (or a source table's version skipped)
        ("source_version", pa.int64()),  # a source table's last version this ingest covers; null for a file
        ("source_table_id", pa.string()),  # that table's identity (Delta metadata id); null for a file
    ]
)

QUARANTINE_SCHEMA = pa.schema(
    [
        ("relation", pa.string()),
        ("reason", pa.string()),
        ("source_file", pa.string()),
        ("source_line", pa.int64()),
        ("raw", pa.string()),
        ("id", pa.string()),
        ("ingest_id", pa.string()),
        ("ingested_at", INGESTED_AT),
        ("source_version", pa.int64()),  # the source table's version that added the row; null for a file
        ("lasting", pa.bool_()),  # a file refused as a whole: for good (its form), or for now (it could not be read)
    ]
)


@dataclass(frozen=True)
class Provenance:
    """What every row of one ingest records about where it came from: a file and its line, or a source table's data
    file, the row within it and the table version that added it (pipelines/sources.py)."""

    relation: Relation
    path: str  # the file, or the source table
    ingest_id: str
    ingested_at: datetime
    file: Column  # bronze's _source_file
    line: Column  # _source_line: the file's line, or the row's index in its data file
    version: Column  # the source table's version; null for a file
    version_logged: int | None = None  # the table version the ingest log records (the last this ingest covers)
    table_id: str | None = None  # the source table's identity, which the ingest log records too
    kept: tuple[str, ...] | None = None  # the data columns bronze keeps (None: all; a table source: the event time)
    named: Column | None = None  # what quarantine/ingest names a row's file by (None: ``path``)

    @classmethod
    def of(cls, rel: Relation, file: str) -> Provenance:
        path = os.path.abspath(file)
        return cls.started(rel, path, F.lit(path), F.col("_source_line"), F.lit(None).cast("long"))

    @classmethod
    def started(cls, rel: Relation, path: str, file: Column, line: Column, version: Column, **more: object) -> Provenance:
        return cls(rel, path, str(uuid.uuid4()), now(), file, line, version, **more)  # type: ignore[arg-type]


def ingest_file(
    spark: SparkSession,
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    file: str,
    specs: dict[str, RelationSpec] | None = None,
    skip_refused: bool = False,
) -> IngestResult:
    """Ingest one file; ``specs`` maps every relation to its columns (config ``relations``; default: id, ts, key).

    Raises ``FileRefused`` when the file cannot be read as a whole, before anything of it is written. A file
    whose content was ingested before adds nothing; one refused before is tried again unless ``skip_refused``."""
    specs = specs or default_specs()
    path = os.path.abspath(file)
    try:
        digest = _sha256(path)
    except OSError as exc:
        raise FileRefused(f"cannot ingest {file}: cannot read it ({exc.strerror or exc})", lasting=False) from exc
    logged = _logged(engine, warehouse, rel, digest)
    if logged is not None and (logged.ingested or skip_refused):
        return IngestResult(file, rel.name, already_ingested=logged.ingested, already_refused=not logged.ingested)

    # The file stays in Spark (a file can outgrow the driver); only its counts come to the driver. Spark's cache
    # builds each partition in the heap, which a large file exhausts (docs/design.md), so the count and each write
    # classify a large file again, against the bronze version ``classify`` read. A file of at most
    # CACHED_FILE_BYTES is cached and classified once, as is any file an engine that writes from the driver holds
    # in memory anyway.
    def parsed() -> Parsed:
        fmt = format_of(file)
        check_format(path, fmt)
        return parse_file(spark, path, fmt)

    cache = engine.driver_writes or os.path.getsize(path) <= CACHED_FILE_BYTES
    landed, quarantined, duplicates = _classify_and_land(engine, warehouse, rel, specs, parsed, Provenance.of(rel, file), digest, file, cache)
    return IngestResult(file, rel.name, landed, quarantined, duplicates)


def ingest_frame(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    frame: DataFrame,
    specs: dict[str, RelationSpec] | None = None,
    label: str | None = None,
) -> IngestResult:
    """Ingest the records of a DataFrame (a notebook's, a stream's micro-batch) as those of a Parquet file: typed as
    it declares them, arriving in its own row order, quarantined and skipped as duplicates by the same rules; and, as
    a file whose content was ingested before, a frame whose records were (a micro-batch replayed after a restart)
    adds nothing.

    ``label`` is the source bronze and the quarantine record for its rows (default ``dataframe:<ingest id>``). The
    frame is cached for the ingest, so its rows are fingerprinted, numbered and classified once whatever its source
    computes: it should be a batch's worth, as a stream's micro-batch is."""
    specs = specs or default_specs()
    columns = frame.columns
    cached = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        stored_columns(columns)  # a reserved or repeated name is refused before the frame is read
        digest = frame_digest(cached)
        logged = _logged(engine, warehouse, rel, digest)
        if logged is not None and logged.ingested:
            return IngestResult(label or "dataframe", rel.name, already_ingested=True)
        ingest_id = str(uuid.uuid4())
        label = label or f"dataframe:{ingest_id}"
        source = Provenance(rel, label, ingest_id, now(), F.lit(label), F.col("_source_line"), F.lit(None).cast("long"))

        def parsed() -> Parsed:
            return parse_frame(numbered(cached, FRAME_ROW), columns, F.col(FRAME_ROW) + 1)

        landed, quarantined, duplicates = _classify_and_land(engine, warehouse, rel, specs, parsed, source, digest, label, False)
    finally:
        cached.unpersist()
    return IngestResult(label, rel.name, landed, quarantined, duplicates)


def frame_digest(frame: DataFrame) -> str:
    """What the ingest log names a DataFrame's content by, as a file's SHA-256 names a file's: the SHA-256 of its
    records' count and two sums of per-record hashes, so the same records give the same digest whatever their order
    or partitioning (a micro-batch replayed after a restart). One small job over the frame."""
    record = F.to_json(F.struct(*[column(name) for name in frame.columns]))  # JSON: hashable whatever the types (maps too)
    fingerprint = frame.agg(
        F.count(F.lit(1)), F.sum(F.xxhash64(record).cast("decimal(38,0)")), F.sum(F.hash(record).cast("decimal(38,0)"))
    ).first()
    return hashlib.sha256(f"dataframe {list(frame.columns)} {[str(value) for value in fingerprint]}".encode()).hexdigest()


def _classify_and_land(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    specs: dict[str, RelationSpec],
    parsed: Callable[[], Parsed],
    source: Provenance,
    digest: str | None,
    name: str,
    cache: bool,
) -> tuple[int, int, int]:
    """Classify what ``parsed`` reads and land it (``land``); a failure to read it refuses ``name`` as a whole."""
    configured = configured_types(rel, specs[rel.name])  # a config error stops the command: it is no file's fault
    classified = None
    try:
        try:
            classified = classify(engine, warehouse, rel, specs, parsed(), configured)
            if cache:
                classified = classified.persist(StorageLevel.MEMORY_AND_DISK)
        except UNREADABLE as exc:
            raise refusal(name, exc) from exc
        return land(engine, warehouse, classified, source, digest, lambda exc: refusal(name, exc))
    finally:
        if classified is not None:
            classified.unpersist()


def land(
    engine: DeltaEngine,
    warehouse: Warehouse,
    classified: DataFrame,
    source: Provenance,
    digest: str | None,
    refuse: Callable[[BaseException], Exception],
    skipped: Sequence[tuple[int, str]] = (),
) -> tuple[int, int, int]:
    """Append ``classified``'s accepted rows to bronze and its quarantined ones to the quarantine, then log them:
    last, so until the log lands the joiner does not see these arrivals. Returns the rows landed, quarantined and
    skipped as duplicates. ``refuse`` turns a failure before anything was written into the error to raise;
    ``skipped`` are a source table's change commits skipped, logged in the same commit."""
    try:
        tally = classified.groupBy("_outcome", _line_block().alias("_block")).agg(F.count(F.lit(1)).alias("rows")).collect()
    except UNREADABLE as exc:
        raise refuse(exc) from exc
    counts: Counter[str] = Counter()
    for row in tally:
        counts[row["_outcome"]] += row["rows"]
    landed, quarantined, duplicates = (counts[kind] for kind in ("accepted", "quarantined", "duplicate"))
    accepted_blocks = [(row["_block"], row["rows"]) for row in tally if row["_outcome"] == "accepted"]
    first_seq = last_arrival_seq(engine, warehouse) + 1
    if landed:
        try:  # the first write: when it fails, nothing was written yet
            engine.append(warehouse.bronze(source.relation), _bronze_rows(classified, source, accepted_blocks, first_seq))
        except UNREADABLE + (LakejoinError,) as exc:
            raise refuse(exc) from exc
    if quarantined:  # once per input: a retry of an ingest that died before its log row finds this write recorded
        txn = None if digest is None else Txn(f"lakejoin-ingest:{source.relation.name}:{digest}", 1)
        engine.append(warehouse.quarantine, quarantine_rows(classified, source), txn)
    with step("ingest_log"):
        log_ingest(engine, warehouse, source, digest, landed, quarantined, duplicates, first_seq, skipped=skipped)
    return landed, quarantined, duplicates


# What ends reading a file: its form (FileRefused from lakejoin's own checks, values nested deeper than Python
# recurses), or a failure while reading it (Spark's, the file system's).
UNREADABLE = (FileRefused, RecursionError, PySparkException, Py4JJavaError, OSError)


def refusal(file: str, exc: BaseException) -> FileRefused:
    """``exc`` as the one-line refusal of ``file``; lasting only when the file's form caused it."""
    if isinstance(exc, FileRefused):
        return FileRefused(f"cannot ingest {file}: {exc}", exc.lasting)
    if isinstance(exc, RecursionError) or "maximum recursion depth exceeded" in str(exc):  # PySpark may wrap it
        return FileRefused(f"cannot ingest {file}: its values are nested too deeply to read")
    return FileRefused(f"cannot ingest {file}: {_first_line(exc)}", lasting=False)


def _first_line(exc: BaseException) -> str:
    """An error's own words, on one line (Spark's messages go on with plans and stack traces)."""
    if isinstance(exc, Py4JJavaError):
        return str(exc.java_exception.toString()).splitlines()[0]
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def log_ingest(
    engine: DeltaEngine,
    warehouse: Warehouse,
    source: Provenance,
    digest: str | None,
    landed: int,
    quarantined: int,
    duplicates: int,
    first_seq: int,
    refused: str | None = None,
    skipped: Sequence[tuple[int, str]] = (),
) -> None:
    """One ingest's row of the ingest log; and, in the same commit, a row per skipped source commit (version, why)."""
    row = dict(
        ingest_id=source.ingest_id,
        relation=source.relation.name,
        source_file=source.path,
        sha256=digest,
        rows_landed=landed,
        rows_quarantined=quarantined,
        rows_duplicate=duplicates,
        seq_from=first_seq,
        seq_to=first_seq + landed - 1,
        ingested_at=source.ingested_at,
        refused=refused,
        source_version=source.version_logged,
        source_table_id=source.table_id,
    )
    skips = [{**row, "rows_landed": 0, "rows_quarantined": 0, "rows_duplicate": 0, "seq_to": first_seq - 1, "refused": why, "source_version": version} for version, why in skipped]
    engine.append(warehouse.ingest_log, pa.Table.from_pylist([*skips, row], INGEST_LOG_SCHEMA))


def _record_refusal(engine: DeltaEngine, warehouse: Warehouse, source: Provenance, digest: str, reason: str) -> None:
    """A refused landing file, kept where its rows would have been quarantined: one row without a line."""
    engine.append(warehouse.quarantine, refusal_rows([(source.relation.name, source.path, reason, True)], source.ingest_id, source.ingested_at))
    log_ingest(engine, warehouse, source, digest, 0, 1, 0, last_arrival_seq(engine, warehouse) + 1, refused=reason)


def refusal_rows(refused: Sequence[tuple[str, str, str, bool]], ingest_id: str, ingested_at: datetime) -> pa.Table:
    """Files refused as a whole, kept where their rows would have been quarantined: a row each (relation, file, why,
    whether for good), without a line."""
    rows = [
        dict(relation=relation, reason=reason, source_file=path, source_line=None, raw=None, id=None, ingest_id=ingest_id, ingested_at=ingested_at, source_version=None, lasting=lasting)
        for relation, path, reason, lasting in refused
    ]
    return pa.Table.from_pylist(rows, QUARANTINE_SCHEMA)


def _bronze_rows(classified: DataFrame, source: Provenance, accepted_blocks: list[tuple[int, int]], first_seq: int) -> DataFrame:
    """Accepted rows with their bookkeeping; they take the next places in the arrival order, in line order.

    Numbered block by block of the file's lines (``accepted_blocks``: each block's accepted rows), so one
    task holds at most a block: a window over the whole file would put all of it in one."""
    within = F.row_number().over(Window.partitionBy(_line_block()).orderBy("_source_line")) - 1
    return bronze_rows(classified, source, firsts(accepted_blocks, first_seq, _line_block()) + within)


def bronze_rows(classified: DataFrame, source: Provenance, place: Column) -> DataFrame:
    """Accepted rows with their bookkeeping, each at its ``place`` in the arrival order."""
    accepted = classified.where(F.col("_outcome") == "accepted")
    data = [name for name in accepted.columns if not name.startswith("_") and (source.kept is None or name in source.kept)]
    table_version = [] if source.kept is None else [source.version.alias("_source_version")]
    return accepted.select(
        *[column(name) for name in data],
        ID,
        TS,
        *[name for name in (OP, SEQ) if name in accepted.columns],  # a change feed's (pipelines/classify.py)
        place.cast("long").alias("_arrival_seq"),
        source.file.alias("_source_file"),
        source.line.cast("long").alias("_source_line"),
        *table_version,
        F.lit(source.ingest_id).alias("_ingest_id"),
        F.lit(source.ingested_at).alias("_ingested_at"),
        "_content_hash",
    )


def _line_block() -> Column:
    """The block of 2^BLOCK_BITS lines of the file a row comes from."""
    return F.shiftright(F.col("_source_line"), BLOCK_BITS)



def quarantine_rows(classified: DataFrame, source: Provenance) -> DataFrame:
    """The rows set aside, with the reason, the file and the line."""
    return classified.where(F.col("_outcome") == "quarantined").select(
        F.lit(source.relation.name).alias("relation"),
        F.col("_reason").alias("reason"),
        (F.lit(source.path) if source.named is None else source.named).alias("source_file"),
        source.line.cast("long").alias("source_line"),
        F.col("_raw").alias("raw"),
        F.col(ID).alias("id"),
        F.lit(source.ingest_id).alias("ingest_id"),
        F.lit(source.ingested_at).alias("ingested_at"),
        source.version.alias("source_version"),
        F.lit(None).cast("boolean").alias("lasting"),
    )



def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class _Logged:
    """What the ingest log holds for one file content: ingested, or else refused (as a landing file)."""

    ingested: bool


def _logged(engine: DeltaEngine, warehouse: Warehouse, rel: Relation, digest: str) -> _Logged | None:
    log = engine.rows(warehouse.ingest_log, where=f"sha256 = '{digest}' AND relation = '{rel.name}'")
    if log is None or log.num_rows == 0:
        return None
    refusals = log.column("refused").to_pylist() if "refused" in log.column_names else [None]
    return _Logged(ingested=None in refusals)


def last_arrival_seq(engine: DeltaReader, warehouse: Warehouse) -> int:
    """The last place taken in the global arrival order, across every relation (0 when none): by an arrival in bronze,
    by a batch's slice (a batch's files reserve places that they may not all take), or by the files of a batch that
    died after landing some of them (its plan, carried by its bronze commits, reserves their places)."""
    taken = [engine.max_value(warehouse.bronze(rel), "_arrival_seq") for rel in warehouse.relations]
    taken.append(engine.max_value(warehouse.batches, "seq_to"))
    for rel in warehouse.relations:
        info = engine.info(warehouse.bronze(rel), warehouse.app_id(warehouse.pipeline, warehouse.bronze(rel)))
        if info is not None and info.recorded.plan is not None:
            taken.append(BatchPlan.decoded(info.recorded.plan).seq_to)
    return max((value for value in taken if value is not None), default=0)
