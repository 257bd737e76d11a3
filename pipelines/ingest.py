"""Bronze ingest: raw files (JSON Lines, CSV, Parquet) appended to ``bronze/<relation>``.

Bronze keeps the user's columns, typed, and adds what lakejoin derives: each record's id as text (``_id``,
from the configured id columns), its event time on the integer axis (``_ts``), its place in the global
arrival order (``_arrival_seq``, across all relations) and where it came from (file, line). Rows that break
the mapping or a column's type go to the quarantine table with a reason; the rest of the file still lands.
A file already ingested adds nothing, and a record whose id exists with other content is quarantined as a
conflict. A file that cannot be read as a whole (not the format its name says, a header naming a column twice)
is refused in one line with nothing of it written; column names are data (state/names.py).
"""

from __future__ import annotations

import csv
import hashlib
import os
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from state.engines import DeltaEngine
from state.errors import FileRefused, LakejoinError
from state.event_time import INTEGER, INTEGER_TEXT, STORED_TYPE, TIMESTAMP, as_event_time, kind_of, on_axis
from state.faults import step
from state.layout import Warehouse
from state.names import column, nested_names_storable, quoted, stored_names
from state.relations import ID, TS, Relation, RelationSpec, default_specs, others

FORMATS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
CORRUPT = "_corrupt_record"
CASE_SENSITIVE = "spark.sql.caseSensitive"
INGESTED_AT = pa.timestamp("us", tz="UTC")
# monotonically_increasing_id(): a row's partition index sits above this many bits, its place in the partition below.
PARTITION_BITS = 33
# Arrival places are numbered in blocks of 2^20 lines of a file (one task per block).
BLOCK_BITS = 20


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
    spark: SparkSession, engine: DeltaEngine, warehouse: Warehouse, rel: Relation, files: list[str], specs: dict[str, RelationSpec] | None = None
) -> list[IngestResult]:
    """Ingest ``files`` in the given order: their rows arrive in that order, line by line. A file refused as a
    whole is reported in its result and the next one goes on."""
    for file in files:
        _format_of(file)
        if not os.path.isfile(file):
            raise LakejoinError(f"no such file: {file}")
    return [ingest_or_refuse(spark, engine, warehouse, rel, file, specs) for file in files]


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
    except FileRefused as refusal:
        recorded = record_refusal and refusal.lasting  # a file that failed to be read is tried again
        if recorded:
            _record_refusal(engine, warehouse, Provenance.of(rel, file), _sha256(os.path.abspath(file)), str(refusal))
        return IngestResult(file, rel.name, refused=str(refusal), recorded=recorded)


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

    @classmethod
    def of(cls, rel: Relation, file: str) -> Provenance:
        path = os.path.abspath(file)
        return cls.started(rel, path, F.lit(path), F.col("_source_line"), F.lit(None).cast("long"))

    @classmethod
    def started(cls, rel: Relation, path: str, file: Column, line: Column, version: Column, **more: object) -> Provenance:
        return cls(rel, path, str(uuid.uuid4()), datetime.now(timezone.utc), file, line, version, **more)  # type: ignore[arg-type]


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

    source = Provenance.of(rel, file)
    # The file stays in Spark (a file can outgrow the driver); only its counts come to the driver. Spark's cache
    # builds each partition in the heap, which a large file exhausts (see the README's benchmarks), so the count
    # and each write classify it again, against the bronze version ``classify`` read. An engine that writes from the
    # driver holds the file in memory anyway: there it is cached, and classified once.
    configured = _configured_types(rel, specs[rel.name])  # a config error stops the command: it is no file's fault
    classified = None
    try:
        try:
            fmt = _format_of(file)
            _check_format(path, fmt)
            classified = classify(engine, warehouse, rel, specs, _parse(spark, path, fmt), configured)
            if engine.driver_writes:
                classified = classified.persist(StorageLevel.MEMORY_AND_DISK)
        except _UNREADABLE as exc:
            raise _refusal(file, exc) from exc
        landed, quarantined, duplicates = land(engine, warehouse, classified, source, digest, lambda exc: _refusal(file, exc))
    finally:
        if classified is not None:
            classified.unpersist()
    return IngestResult(file, rel.name, landed, quarantined, duplicates)


def classify(
    engine: DeltaEngine, warehouse: Warehouse, rel: Relation, specs: dict[str, RelationSpec], parsed: Parsed, configured: dict[str, DataType]
) -> DataFrame:
    """``parsed``'s rows typed, with ``_id`` and ``_ts``, each with its ``_outcome`` (accepted, duplicate, quarantined)
    and reason. Bronze is read at one version: its schema types the rows, its ids find conflicts, in the count and
    each write that follow."""
    bronze = warehouse.bronze(rel)
    established = engine.read(bronze, engine.version(bronze))
    bronze_schema = StructType() if established is None else established.schema
    spelled = _in_bronze_spelling(parsed, bronze_schema)
    layout = _layout(engine, warehouse, rel, specs, spelled, {**configured, **{f.name: f.dataType for f in bronze_schema.fields}})
    return _classify(_normalize(spelled, layout), established)


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
    except _UNREADABLE as exc:
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
        except _UNREADABLE + (LakejoinError,) as exc:
            raise refuse(exc) from exc
    if quarantined:
        engine.append(warehouse.quarantine, _quarantine_rows(classified, source))
    with step("ingest_log"):
        log_ingest(engine, warehouse, source, digest, landed, quarantined, duplicates, first_seq, skipped=skipped)
    return landed, quarantined, duplicates


# What ends reading a file: its form (FileRefused from lakejoin's own checks, values nested deeper than Python
# recurses), or a failure while reading it (Spark's, the file system's).
_UNREADABLE = (FileRefused, RecursionError, PySparkException, Py4JJavaError, OSError)


def _refusal(file: str, exc: BaseException) -> FileRefused:
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
    row = dict(
        relation=source.relation.name, reason=reason, source_file=source.path, source_line=None, raw=None, id=None,
        ingest_id=source.ingest_id, ingested_at=source.ingested_at, source_version=None,
    )
    engine.append(warehouse.quarantine, pa.Table.from_pylist([row], QUARANTINE_SCHEMA))
    log_ingest(engine, warehouse, source, digest, 0, 1, 0, last_arrival_seq(engine, warehouse) + 1, refused=reason)


def _bronze_rows(classified: DataFrame, source: Provenance, accepted_blocks: list[tuple[int, int]], first_seq: int) -> DataFrame:
    """Accepted rows with their bookkeeping; they take the next places in the arrival order, in line order.

    Numbered block by block of the file's lines (``accepted_blocks``: each block's accepted rows), so one
    task holds at most a block: a window over the whole file would put all of it in one."""
    accepted = classified.where(F.col("_outcome") == "accepted")
    within = F.row_number().over(Window.partitionBy(_line_block()).orderBy("_source_line")) - 1
    place = _firsts(accepted_blocks, first_seq, _line_block()) + within
    data = [name for name in accepted.columns if not name.startswith("_") and (source.kept is None or name in source.kept)]
    table_version = [] if source.kept is None else [source.version.alias("_source_version")]
    return accepted.select(
        *[column(name) for name in data],
        ID,
        TS,
        place.cast("long").alias("_arrival_seq"),
        source.file.alias("_source_file"),
        source.line.alias("_source_line"),
        *table_version,
        F.lit(source.ingest_id).alias("_ingest_id"),
        F.lit(source.ingested_at).alias("_ingested_at"),
        "_content_hash",
    )


def _line_block() -> Column:
    """The block of 2^BLOCK_BITS lines of the file a row comes from."""
    return F.shiftright(F.col("_source_line"), BLOCK_BITS)


def _firsts(rows_per_group: list[tuple[int, int]], start: int, group: Column) -> Column:
    """The first number of ``group``'s rows when groups are numbered in order from ``start``: ``start`` plus
    the rows of the groups before it."""
    firsts, first = [], start
    for key, rows in sorted(rows_per_group):
        firsts += [F.lit(key).cast("long"), F.lit(first).cast("long")]
        first += rows
    return F.create_map(*firsts)[group] if firsts else F.lit(start).cast("long")


def _quarantine_rows(classified: DataFrame, source: Provenance) -> DataFrame:
    return classified.where(F.col("_outcome") == "quarantined").select(
        F.lit(source.relation.name).alias("relation"),
        F.col("_reason").alias("reason"),
        F.lit(source.path).alias("source_file"),
        source.line.alias("source_line"),
        F.col("_raw").alias("raw"),
        F.col(ID).alias("id"),
        F.lit(source.ingest_id).alias("ingest_id"),
        F.lit(source.ingested_at).alias("ingested_at"),
        source.version.alias("source_version"),
    )


def _format_of(file: str) -> str:
    extension = os.path.splitext(file)[1].lower()
    if extension not in FORMATS:
        raise LakejoinError(f"cannot ingest {file}: unknown extension {extension or '(none)'!r}; use .jsonl, .csv or .parquet")
    return FORMATS[extension]


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


def last_arrival_seq(engine: DeltaEngine, warehouse: Warehouse) -> int:
    """The last place taken in the global arrival order, across every relation (0 when none)."""
    maxima = [engine.max_value(warehouse.bronze(rel), "_arrival_seq") for rel in warehouse.relations]
    return max((value for value in maxima if value is not None), default=0)


# Parsing: each format becomes the same shape — _source_line, _raw, _unparsable and the data columns, as text
# (JSON, CSV: typed when classified) or typed as the file declares them (Parquet).


@dataclass(frozen=True)
class Parsed:
    frame: DataFrame  # _source_line, _raw, _unparsable, then the data columns
    types: dict[str, DataType]  # each data column's type as the file gives it (JSON: inferred; CSV: string)
    text: bool  # the data columns hold text, to be parsed into their types


def _numbered_lines(spark: SparkSession, path: str) -> DataFrame:
    """Non-blank lines of a text file with their 1-based line numbers, in file order (a UTF-8 byte-order mark at
    its start dropped).

    Each partition of the read is a contiguous piece of the file: its lines are counted (one small job) and
    numbered after those of the pieces before it, so no task holds the whole file as a window over all
    lines would."""
    lines = spark.read.text(path).withColumn("_row_id", F.monotonically_increasing_id())
    piece = F.shiftright(F.col("_row_id"), PARTITION_BITS)
    pieces = [(row["piece"], row["lines"]) for row in lines.groupBy(piece.alias("piece")).agg(F.count(F.lit(1)).alias("lines")).collect()]
    within = F.col("_row_id").bitwiseAND((1 << PARTITION_BITS) - 1)
    numbered = lines.withColumn("_source_line", _firsts(pieces, 1, piece) + within)
    numbered = numbered.withColumn("value", F.when(F.col("_row_id") == 0, F.regexp_replace("value", "^\ufeff", "")).otherwise(F.col("value")))
    return numbered.where(F.trim("value") != "").select("_source_line", F.col("value").alias("_raw"))


# What a file named .jsonl or .csv holds when it is no text lakejoin can read, by its first bytes.
_NOT_TEXT = {
    b"\x1f\x8b": "gzip-compressed: decompress it first",
    b"PK\x03\x04": "a zip archive: unpack it first",
    b"\x28\xb5\x2f\xfd": "zstd-compressed: decompress it first",
    b"\xff\xfe": "UTF-16 text, and lakejoin reads UTF-8: convert it",
    b"\xfe\xff": "UTF-16 text, and lakejoin reads UTF-8: convert it",
}


def _check_format(path: str, fmt: str) -> None:
    """Refuse a file that is not what its name says before Spark reads it (Spark would answer with a JVM trace)."""
    if fmt == "parquet":
        try:
            pq.read_metadata(path)
        except (pa.ArrowException, OSError) as exc:
            raise FileRefused(f"not a readable Parquet file ({str(exc).splitlines()[0]})") from exc
        return
    with open(path, "rb") as handle:
        start = handle.read(4)
        handle.seek(max(0, os.path.getsize(path) - 4))
        end = handle.read(4)
    what = "a Parquet file: name it .parquet" if start == end == b"PAR1" else next((w for magic, w in _NOT_TEXT.items() if start.startswith(magic)), None)
    if what is not None:
        raise FileRefused(f"it is {what}")


def _parse(spark: SparkSession, path: str, fmt: str) -> Parsed:
    if fmt == "parquet":
        return _parse_parquet(spark, path)
    if fmt == "csv":
        header, header_line = _csv_header(path)
        lines = _numbered_lines(spark, path).where(F.col("_source_line") > header_line)
        return _parse_text(lines, [(name, StringType()) for name in header], F.from_csv)
    schema, lines = _json_schema(spark, path), _numbered_lines(spark, path)
    inferred = [(f.name, f.dataType) for f in schema.fields if f.name != CORRUPT]
    if CORRUPT in schema.fieldNames():
        inferred += [(key, StringType()) for key in _keys_beyond(lines, {name for name, _ in inferred})]
    return _parse_text(lines, inferred, F.from_json)


def _keys_beyond(lines: DataFrame, known: set[str]) -> list[str]:
    """Keys of the lines Spark's JSON reader could not parse that no other line has. It reads a line's raw bytes
    and gives up on one that is not UTF-8 (Latin-1 text), where lakejoin reads the line as text (U+FFFD for such
    a byte), which parses: without this its keys would be dropped. Only run when the reader gave up on a line."""
    keys = lines.select(F.explode(F.json_object_keys("_raw")).alias("key")).distinct().collect()
    return sorted(row.key for row in keys if row.key not in known)


def _csv_header(path: str) -> tuple[list[str], int]:
    """The header (the first row with a field; blank lines before it are skipped) and the line it ends on."""
    try:
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as handle:
            reader = csv.reader(handle)
            for row in reader:
                if any(field.strip() for field in row):
                    return row, reader.line_num
    except csv.Error as exc:
        raise FileRefused(f"its CSV header cannot be read: {exc}") from exc
    return [], 1


def _json_schema(spark: SparkSession, path: str) -> StructType:
    """The file's keys and their types, inferred case-sensitively: by default Spark makes ``Amount`` and ``amount``
    one field and drops the values of the other, where lakejoin refuses the file."""
    previous = spark.conf.get(CASE_SENSITIVE)
    spark.conf.set(CASE_SENSITIVE, "true")
    try:
        return spark.read.json(path).schema
    finally:
        spark.conf.set(CASE_SENSITIVE, previous)


def _parse_text(lines: DataFrame, fields: list[tuple[str, DataType]], parser) -> Parsed:  # noqa: ANN001 - F.from_json or F.from_csv
    """Every field as its text (a nested JSON value as its JSON), so a value that fits no type can be named.
    ``fields`` are the file's own names (a JSON key, a CSV header) with the type the file suggests."""
    names = _stored([name for name, _ in fields])
    as_text = [*(StructField(name, StringType()) for name, _ in fields), StructField(CORRUPT, StringType())]
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    ddl = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in as_text)
    record = lines.select("*", parser(F.col("_raw"), ddl, options).alias("_record"))
    unparsable = F.col("_record").isNull() | F.col(f"_record.{CORRUPT}").isNotNull()
    data = [F.col(f"_record.{quoted(name)}").alias(names[name]) for name, _ in fields]
    types = {names[name]: given if nested_names_storable(given) else StringType() for name, given in fields}
    return Parsed(record.select("_source_line", "_raw", unparsable.alias("_unparsable"), *data), types, text=True)


def _parse_parquet(spark: SparkSession, path: str) -> Parsed:
    df = spark.read.parquet(path)
    names = _stored(df.columns)

    def kept(field: StructField) -> Column:
        return column(field.name) if nested_names_storable(field.dataType) else F.to_json(column(field.name))

    frame = df.select(
        (F.col("_metadata.row_index") + 1).alias("_source_line"),
        F.to_json(F.struct(*[column(name) for name in df.columns])).alias("_raw"),
        F.lit(False).alias("_unparsable"),
        *[kept(field).alias(names[field.name]) for field in df.schema.fields],
    )
    types = {names[f.name]: f.dataType if nested_names_storable(f.dataType) else StringType() for f in df.schema.fields}
    return Parsed(frame, types, text=False)


def _stored(names: list[str]) -> dict[str, str]:
    """The names bronze stores a file's columns under (state/names.py); a name lakejoin reserves is refused."""
    try:
        stored = stored_names(names)
    except ValueError as exc:
        raise FileRefused(f"{exc}: rename one of them") from exc
    reserved = [name for name in stored.values() if name.startswith("_")]
    if reserved:
        raise FileRefused(f"column {reserved[0]!r} starts with '_', which lakejoin reserves for bookkeeping: rename it")
    return stored


# Typing: each data column gets the type bronze established for it, else the configured one, else the file's own;
# the event time gets its kind's type (state/event_time.py). A value that fits no type is named in a reason.

# Parquet types that convert to an established type without losing anything.
_WIDENS = {
    (ByteType, ShortType), (ByteType, IntegerType), (ByteType, LongType), (ShortType, IntegerType), (ShortType, LongType),
    (IntegerType, LongType), (FloatType, DoubleType), (ByteType, DoubleType), (ShortType, DoubleType), (IntegerType, DoubleType),
    (DateType, TimestampType), (TimestampNTZType, TimestampType),
}


@dataclass(frozen=True)
class _Layout:
    """What a file's rows must become: the relation's column mapping, the event time's kind, each column's type."""

    spec: RelationSpec
    kind: str
    types: dict[str, DataType]


def _configured_types(rel: Relation, spec: RelationSpec) -> dict[str, DataType]:
    try:
        return {name: DataType.fromDDL(ddl) for name, ddl in spec.columns.items()}
    except Exception as exc:  # noqa: BLE001 - Spark's parse errors have many types; the message names the setting
        raise LakejoinError(f"config: relations.{rel.name}.columns has a type Spark does not know ({spec.columns}): {str(exc).splitlines()[0]}") from exc


def _in_bronze_spelling(parsed: Parsed, bronze_schema: StructType) -> Parsed:
    """The file's columns under bronze's spelling where they differ only in case: Delta holds one column per
    name whatever its case, so ``Amount`` lands in bronze's ``amount``."""
    spelling = {f.name.lower(): f.name for f in bronze_schema.fields}
    renames = {name: spelling[name.lower()] for name in parsed.types if spelling.get(name.lower(), name) != name}
    if not renames:
        return parsed
    return Parsed(parsed.frame.withColumnsRenamed(renames), {renames.get(n, n): t for n, t in parsed.types.items()}, parsed.text)


def _layout(
    engine: DeltaEngine, warehouse: Warehouse, rel: Relation, specs: dict[str, RelationSpec], parsed: Parsed, settled: dict[str, DataType]
) -> _Layout:
    """``settled``: the types the config and bronze give (bronze's win)."""
    spec = specs[rel.name]
    kind = _event_time_kind(engine, warehouse, rel, specs, parsed, settled)
    types = {**_nested_that_fit(parsed, settled), **settled, spec.event_time: STORED_TYPE[kind]}
    for name, given in ({} if parsed.text else parsed.types).items():
        wanted = types[name]
        text_time = name == spec.event_time and isinstance(given, StringType)
        if given != wanted and not text_time and (type(given), type(wanted)) not in _WIDENS:
            raise FileRefused(
                f"column {name} is {given.simpleString()} there but {wanted.simpleString()} in "
                f"bronze/{rel.name} (or the config), and does not widen to it: convert it, or land it under another name"
            )
    return _Layout(spec, kind, types)


def _nested_that_fit(parsed: Parsed, settled: dict[str, DataType]) -> dict[str, DataType]:
    """The file's own types, with a nested type JSON inferred kept only where every value parses into it, else
    the column kept as its JSON text. Spark infers an empty string as null, so ``["", []]`` is inferred as an
    array of arrays that its own ``""`` does not fit: no row is quarantined for what the file's inference got wrong."""
    inferred = [
        name for name, given in parsed.types.items() if parsed.text and name not in settled and isinstance(given, (StructType, ArrayType, MapType))
    ]
    if not inferred:
        return parsed.types
    misfit = [F.max((column(name).isNotNull() & F.from_json(column(name), parsed.types[name]).isNull()).cast("int")) for name in inferred]
    fits = parsed.frame.where(~F.col("_unparsable")).agg(*misfit).first()
    return {**parsed.types, **{name: StringType() for name, broken in zip(inferred, fits) if broken}}


def _event_time_kind(
    engine: DeltaEngine, warehouse: Warehouse, rel: Relation, specs: dict[str, RelationSpec], parsed: Parsed, settled: dict[str, DataType]
) -> str:
    """The kind of ``rel``'s event time: as bronze or the config has it, else as the other relations' (all share one
    axis), else as the file gives it — text is timestamps when some value reads as one, else integers."""
    event_time = specs[rel.name].event_time
    ours = kind_of(settled[event_time]) if event_time in settled else None
    if event_time in settled and ours is None:
        raise LakejoinError(f"event time {event_time} of {rel.name} is {settled[event_time].simpleString()}: use a timestamp, a date or an integer column")
    for other in others(rel, warehouse.relations):
        schema, theirs_column = engine.schema(warehouse.bronze(other)), specs[other.name].event_time
        theirs = kind_of(schema[theirs_column].dataType) if schema is not None and theirs_column in schema.fieldNames() else None
        if ours is not None and theirs is not None and ours != theirs:
            raise LakejoinError(
                f"event time {event_time} of {rel.name} is a {ours} but {theirs_column} of {other.name} is a {theirs}: "
                "both relations' event times must be of one kind"
            )
        ours = ours or theirs
    if ours is not None or event_time not in parsed.types:
        return ours or INTEGER
    given = parsed.types[event_time]
    if not parsed.text and not isinstance(given, StringType):
        if kind_of(given) is None:
            raise FileRefused(f"event time {event_time} of {rel.name} is {given.simpleString()} there: use a timestamp, a date or an integer column")
        return kind_of(given)  # type: ignore[return-value]
    text = F.trim(column(event_time).cast("string"))
    looks_like_time = ~F.col("_unparsable") & ~text.rlike(INTEGER_TEXT) & text.try_cast(TimestampType()).isNotNull()
    return TIMESTAMP if parsed.frame.where(looks_like_time).limit(1).count() else INTEGER


def _typed(parsed: Parsed, layout: _Layout) -> list[tuple[str, Column, Column | None]]:
    """Each data column as (name, typed value, the reason when its value fits no type)."""
    typed = []
    for name, declared in parsed.types.items():
        given = StringType() if parsed.text else declared  # text formats hold every value as its text until here
        value, wanted = column(name), layout.types[name]
        if name == layout.spec.event_time:
            converted = as_event_time(value, layout.kind)
            description = f"{'an' if layout.kind == INTEGER else 'a'} {layout.kind}"
        elif given == wanted:
            typed.append((name, value, None))
            continue
        elif parsed.text and isinstance(wanted, (StructType, ArrayType, MapType)):
            converted, description = F.from_json(value, wanted), wanted.simpleString()
        else:
            converted, description = value.try_cast(wanted), wanted.simpleString()
        text = F.trim(value.cast("string"))
        misfit = F.when(value.isNotNull() & (text != "") & converted.isNull(), F.concat(F.lit(f"{name} is not {description}: "), text))
        typed.append((name, converted, misfit))
    return typed


# Classification: every parsed row is accepted, a duplicate (skipped) or quarantined with a reason.


def _normalize(parsed: Parsed, layout: _Layout) -> DataFrame:
    """Data columns typed, plus ``_id`` and ``_ts`` (state/relations.py), and the reason for what fails."""
    spec = layout.spec
    present = set(parsed.types)
    typed = _typed(parsed, layout)
    values = {name: value for name, value, _ in typed}
    present_ids = [values[c].cast("string") for c in spec.id if c in present]
    if len(present_ids) < len(spec.id):  # a file without an id column: every row is quarantined for it
        record_id = F.lit(None).cast("string")
    else:
        record_id = present_ids[0] if len(spec.id) == 1 else F.to_json(F.array(*present_ids))
    reason = F.coalesce(
        F.when(F.col("_unparsable"), F.lit("unparsable line")),
        *[_missing(name, present) for name in spec.record_columns],
        *[misfit for name, _, misfit in typed if misfit is not None and name == spec.event_time],
        *[misfit for name, _, misfit in typed if misfit is not None and name != spec.event_time],
    )
    axis = on_axis(values[spec.event_time], layout.kind) if spec.event_time in present else F.lit(None)
    whence = [name for name in parsed.frame.columns if name.startswith("_source_")]  # a line; a table's file and version too
    return parsed.frame.select(
        *whence,
        "_raw",
        reason.alias("_reason"),
        *[value.alias(name) for name, value in values.items()],
        record_id.alias(ID),
        axis.cast("long").alias(TS),
    )


def _missing(name: str, present: set[str]) -> Column:
    if name not in present:
        return F.lit(f"missing column {name}")
    value = column(name)
    return F.when(value.isNull() | (F.trim(value.cast("string")) == ""), F.lit(f"missing {name}"))


def _classify(normalized: DataFrame, bronze: DataFrame | None) -> DataFrame:
    data_columns = sorted(name for name in normalized.columns if not name.startswith("_"))
    hashed = normalized.withColumn("_content_hash", F.sha2(F.to_json(F.struct(*[column(name) for name in data_columns])), 256))
    valid = F.col("_reason").isNull()
    by_id = Window.partitionBy(valid, ID).orderBy("_source_line")
    ranked = hashed.withColumns(
        {
            "_nth": F.when(valid, F.row_number().over(by_id)),
            "_first_hash": F.when(valid, F.first("_content_hash").over(by_id)),
            "_first_line": F.when(valid, F.first("_source_line").over(by_id)),
        }
    )
    if bronze is None:
        ranked = ranked.withColumn("_existing_hash", F.lit(None).cast("string"))
    else:
        # Bronze outgrows any file: find the file's ids in it with the ids broadcast (a scan, no shuffle of
        # bronze), then join back the few it holds.
        file_ids = F.broadcast(normalized.select(F.col(ID).alias("_existing_id")).where(F.col("_existing_id").isNotNull()))
        existing = bronze.select(F.col(ID).alias("_existing_id"), F.col("_content_hash").alias("_existing_hash"))
        held = existing.join(file_ids, "_existing_id", "left_semi")
        ranked = ranked.join(F.broadcast(held), valid & (F.col(ID) == F.col("_existing_id")), "left").drop("_existing_id")
    seen_in_file = F.col("_nth") > 1
    reason = F.coalesce(
        F.col("_reason"),
        F.when(
            seen_in_file & (F.col("_content_hash") != F.col("_first_hash")),
            F.concat(F.lit("id conflict: same id with other content at line "), F.col("_first_line").cast("string")),
        ),
        F.when(
            F.col("_existing_hash").isNotNull() & (F.col("_existing_hash") != F.col("_content_hash")),
            F.lit("id conflict: id already in bronze with other content"),
        ),
    )
    duplicate = seen_in_file | (F.col("_existing_hash") == F.col("_content_hash"))
    outcome = F.when(reason.isNotNull(), "quarantined").when(duplicate, "duplicate").otherwise("accepted")
    return ranked.select(
        *[column(name) for name in hashed.columns if name != "_reason"],
        reason.alias("_reason"),
        outcome.alias("_outcome"),
    )
