"""Parsing a landed file: each format becomes the same shape, ``Parsed`` — ``_source_line``, ``_raw``,
``_unparsable`` and the data columns, as text (JSON, CSV: typed when classified, pipelines/bronze/classify.py) or typed
as the file declares them (Parquet). A file that cannot be read as a whole is refused (``FileRefused``) here, before
anything of it is written.
"""

from __future__ import annotations

import csv
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import AtomicType, DataType, StringType, StructField, StructType

from state.engines.delta_log import is_connect, is_restricted
from state.errors import FileRefused, LakejoinError
from state.names import column, literal, nested_names_storable, quoted, stored_names

FORMATS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
CORRUPT = "_corrupt_record"
BYTE_ORDER_MARK = "^\ufeff"  # a UTF-8 byte-order mark at a file's start (a regular expression)
CASE_SENSITIVE = "spark.sql.caseSensitive"

# monotonically_increasing_id(): a row's partition index sits above this many bits, its place in the partition below.
PARTITION_BITS = 33
# A text file of at most this many bytes is read whole (one row) and split into lines where it is read.
WHOLE_FILE_BYTES = 64 << 20


# Parsing: each format becomes the same shape — _source_line, _raw, _unparsable and the data columns, as text
# (JSON, CSV: typed when classified) or typed as the file declares them (Parquet).


@dataclass(frozen=True)
class Parsed:
    frame: DataFrame  # _source_line, _raw, _unparsable, then the data columns
    types: dict[str, DataType]  # each data column's type as the file gives it (JSON: inferred; CSV: string)
    text: bool  # the data columns hold text, to be parsed into their types


def numbered_lines(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Non-blank lines of text files with their file (``_source_file``, as ``paths`` names it) and 1-based line number
    (``_source_line``), a UTF-8 byte-order mark at a file's start dropped: each file of at most ``WHOLE_FILE_BYTES``
    read whole and split into its lines where it is read, a larger one in blocks (``_lines_by_block``). Plans here are
    SQL text: each Column object built is a call to the JVM, and a few-row ingest's cost is mostly such calls."""
    whole = [path for path in paths if os.path.getsize(path) <= WHOLE_FILE_BYTES]
    large = [path for path in paths if path not in whole]
    parts = ([_lines_of_whole(spark, whole)] if whole else []) + ([_lines_by_block(spark, large)] if large else [])
    lines = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    unmarked = (
        f"CASE WHEN _source_line = 1 THEN regexp_replace(_raw, {literal(BYTE_ORDER_MARK)}, '') ELSE _raw END AS _raw"
    )
    return lines.selectExpr("_source_file", "_source_line", unmarked).where("trim(_raw) != ''")


def _lines_of_whole(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Each file one row, split into its lines as Spark's text reader splits them (at ``\\r\\n``, ``\\r`` or
    ``\\n``): a line's number is its place in the file, with no job of its own."""
    files = spark.read.text(list(paths), wholetext=True)
    lines = files.selectExpr(
        f"{named_file(paths, local_path('_metadata.file_path'))} AS _source_file",
        "posexplode(split(value, '\\r\\n|\\r|\\n')) AS (_place, _raw)",
    )
    return lines.selectExpr("_source_file", "_place + 1 AS _source_line", "_raw")


def _lines_by_block(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Large files, read in blocks: each block's lines come in order, so a line's number is its place in its block
    after the lines of the file's earlier blocks, which a small aggregate over the same lines counts and the job
    broadcasts back."""
    lines = spark.read.text(list(paths)).select(
        F.expr(local_path("_metadata.file_path")).alias("_spark_path"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_row"),
        F.col("value").alias("_raw"),
    )
    earlier = Window.partitionBy("_spark_path").orderBy("_block").rowsBetween(Window.unboundedPreceding, -1)
    blocks = lines.groupBy("_spark_path", "_block").agg(
        F.min("_row").alias("_first_row"), F.count(F.lit(1)).alias("_lines")
    )
    blocks = blocks.withColumn("_before", F.coalesce(F.sum("_lines").over(earlier), F.lit(0)))
    return lines.join(F.broadcast(blocks), ["_spark_path", "_block"]).select(
        F.expr(named_file(paths)).alias("_source_file"),
        (F.col("_before") + F.col("_row") - F.col("_first_row") + 1).alias("_source_line"),
        "_raw",
    )


def local_path(uri: str) -> str:
    """A file's path as Spark names it (``file:/a%20b.jsonl``, the SQL ``uri``) as the file system does
    (``/a b.jsonl``): percent-escapes decoded ('+' is a plus in a path, not a space) and the local scheme dropped."""
    return f"regexp_replace(url_decode(regexp_replace({uri}, {literal(chr(92) + '+')}, '%2B')), '^(file|dbfs):', '')"


def named_file(paths: Sequence[str], spark_path: str = "_spark_path") -> str:
    """``_source_file`` (SQL): the path given for each of ``paths`` (matched on the path Spark read, ``spark_path``),
    which every read row must have (a row of no file given stops the job rather than land under no name)."""
    given = ", ".join(f"{literal(os.path.abspath(path))}, {literal(path)}" for path in paths)
    return (
        f"coalesce(map({given})[{spark_path}], raise_error(concat('lakejoin: Spark read a file it was not given: ', "
        f"{spark_path})))"
    )


def numbered(frame: DataFrame, name: str) -> DataFrame:
    """``frame`` with each row's 0-based place in it as column ``name``, in the frame's own order (``counted``)."""
    return counted(frame, name)[0]


def counted(frame: DataFrame, name: str, *sums: Column) -> tuple[DataFrame, int, list]:
    """``frame`` with each row's 0-based place in it as column ``name``, in the frame's own order; its rows; and the
    totals of ``sums`` (integer aggregates over its rows; None over no rows), all from one small job.

    Each partition is a contiguous piece of the frame: its rows are counted and numbered after those of the pieces
    before it, so no task holds the whole frame as a window over all rows would."""
    rows = frame.withColumn(name, F.monotonically_increasing_id())
    piece = F.shiftright(F.col(name), PARTITION_BITS)
    found = (
        rows.groupBy(piece.alias("piece"))
        .agg(F.count(F.lit(1)).alias("rows"), *[total.alias(f"sum{index}") for index, total in enumerate(sums)])
        .collect()
    )
    pieces = [(row["piece"], row["rows"]) for row in found]
    totals = [
        sum(parts) if (parts := [int(row[f"sum{index}"]) for row in found if row[f"sum{index}"] is not None]) else None
        for index in range(len(sums))
    ]
    within = F.col(name).bitwiseAND((1 << PARTITION_BITS) - 1)
    return rows.withColumn(name, firsts(pieces, 0, piece) + within), sum(count for _, count in pieces), totals


# What a file named .jsonl or .csv holds when it is no text lakejoin can read, by its first bytes.
_NOT_TEXT = {
    b"\x1f\x8b": "gzip-compressed: decompress it first",
    b"PK\x03\x04": "a zip archive: unpack it first",
    b"\x28\xb5\x2f\xfd": "zstd-compressed: decompress it first",
    b"\xff\xfe": "UTF-16 text, and lakejoin reads UTF-8: convert it",
    b"\xfe\xff": "UTF-16 text, and lakejoin reads UTF-8: convert it",
}


def check_format(path: str, fmt: str) -> None:
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
    what = (
        "a Parquet file: name it .parquet"
        if start == end == b"PAR1"
        else next((w for magic, w in _NOT_TEXT.items() if start.startswith(magic)), None)
    )
    if what is not None:
        raise FileRefused(f"it is {what}")


def parse_files(spark: SparkSession, paths: Sequence[str], fmt: str) -> Parsed:
    """Files of one format read together, each row with ``_source_file`` and ``_source_line``. Their columns are
    those of all of them (JSON keys inferred over all, a CSV header and a Parquet schema that every one of them
    shares: a caller groups them so)."""
    if fmt == "parquet":
        return _parse_parquet(spark, paths)
    lines = numbered_lines(spark, paths)
    if fmt == "csv":
        headers = {path: _csv_header(path) for path in paths}
        (header,) = {tuple(names) for names, _ in headers.values()}
        after = ", ".join(f"{literal(path)}, {line}" for path, (_, line) in headers.items())
        return _parse_text(
            lines.where(f"_source_line > map({after})[_source_file]"),
            [(name, StringType()) for name in header],
            "from_csv",
        )
    schema = _json_schema(spark, paths)
    inferred = [(f.name, f.dataType) for f in schema.fields if f.name != CORRUPT]
    if CORRUPT in schema.fieldNames():
        inferred += [(key, StringType()) for key in _keys_beyond(lines, {name for name, _ in inferred})]
    return _parse_text(lines, inferred, "from_json")


def csv_header(path: str) -> tuple[str, ...]:
    """The names a CSV file's header gives (files of one header are read together)."""
    return tuple(_csv_header(path)[0])


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


def _json_schema(spark: SparkSession, paths: Sequence[str]) -> StructType:
    """The files' keys and their types, inferred case-sensitively: by default Spark makes ``Amount`` and ``amount``
    one field and drops the values of the other, where lakejoin refuses the file. Inferred in a session of its own,
    so no other work of ``spark`` (a batch lands its relations at once) sees the setting. A session that refuses the
    setting (Databricks serverless) lists the top-level keys first, refusing two that differ only in case as the other
    way does, and keeps each nested value as its JSON text: below the top level, case-blind inference would merge two
    such keys and lose one's values."""
    if not is_restricted(spark):
        return _case_sensitive(spark).read.json(list(paths)).schema
    keys = spark.read.text(list(paths)).select(F.explode(F.json_object_keys("value")).alias("key")).distinct().collect()
    stored_columns(sorted(row.key for row in keys))
    inferred = spark.read.json(list(paths)).schema
    return StructType(
        [
            field if isinstance(field.dataType, AtomicType) else StructField(field.name, StringType())
            for field in inferred.fields
        ]
    )


_SENSITIVE: weakref.WeakKeyDictionary[SparkSession, SparkSession] = weakref.WeakKeyDictionary()
_SENSITIVE_LOCK = threading.Lock()


def _case_sensitive(spark: SparkSession) -> SparkSession:
    """A session of ``spark``'s application that tells names apart by case, made once."""
    with _SENSITIVE_LOCK:
        session = _SENSITIVE.get(spark)
        if session is None:
            session = spark.cloneSession() if is_connect(spark) else spark.newSession()
            session.conf.set(CASE_SENSITIVE, "true")
            _SENSITIVE[spark] = session
        return session


def _parse_text(lines: DataFrame, fields: list[tuple[str, DataType]], parser: str) -> Parsed:
    """Every field as its text (a nested JSON value as its JSON), so a value that fits no type can be named.
    ``fields`` are the file's own names (a JSON key, a CSV header) with the type the file suggests; ``parser``: the
    SQL function that parses a line (``from_json``, ``from_csv``)."""
    names = stored_columns([name for name, _ in fields])
    as_text = [*(StructField(name, StringType()) for name, _ in fields), StructField(CORRUPT, StringType())]
    ddl = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in as_text)
    options = f"map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', {literal(CORRUPT)})"
    record = lines.selectExpr(
        "_source_file", "_source_line", "_raw", f"{parser}(_raw, {literal(ddl)}, {options}) AS _record"
    )
    data = [f"_record.{quoted(name)} AS {quoted(names[name])}" for name, _ in fields]
    types = {names[name]: given if nested_names_storable(given) else StringType() for name, given in fields}
    frame = record.selectExpr(
        "_source_file",
        "_source_line",
        "_raw",
        f"_record IS NULL OR _record.{CORRUPT} IS NOT NULL AS _unparsable",
        *data,
    )
    return Parsed(frame, types, text=True)


def _parse_parquet(spark: SparkSession, paths: Sequence[str]) -> Parsed:
    df = spark.read.parquet(*paths)
    located = df.select(
        "*",
        F.expr(local_path("_metadata.file_path")).alias("_spark_path"),
        F.col("_metadata.row_index").alias("_row_index"),
    )
    return parse_frame(
        located.select(F.expr(named_file(paths)).alias("_source_file"), "*"), df.columns, F.col("_row_index") + 1
    )


def parse_frame(df: DataFrame, columns: list[str], line: Column) -> Parsed:
    """``df``'s ``columns`` as records typed as the frame declares them (a Parquet file, a DataFrame handed to
    lakejoin); ``line`` numbers them from 1. A nested type whose names Delta cannot store is kept as its JSON."""
    names = stored_columns(columns)
    fields = [df.schema[name] for name in columns]

    def kept(field: StructField) -> Column:
        return column(field.name) if nested_names_storable(field.dataType) else F.to_json(column(field.name))

    frame = df.select(
        *[name for name in df.columns if name in ("_source_file", "_arrival_seq")],  # a file's name, a row's place
        line.alias("_source_line"),
        F.to_json(F.struct(*[column(name) for name in columns])).alias("_raw"),
        F.lit(False).alias("_unparsable"),
        *[kept(field).alias(names[field.name]) for field in fields],
    )
    types = {names[f.name]: f.dataType if nested_names_storable(f.dataType) else StringType() for f in fields}
    return Parsed(frame, types, text=False)


def stored_columns(names: list[str]) -> dict[str, str]:
    """The names bronze stores a file's columns under (state/names.py); a name lakejoin reserves is refused."""
    try:
        stored = stored_names(names)
    except ValueError as exc:
        raise FileRefused(f"{exc}: rename one of them") from exc
    reserved = [name for name in stored.values() if name.startswith("_")]
    if reserved:
        raise FileRefused(f"column {reserved[0]!r} starts with '_', which lakejoin reserves for bookkeeping: rename it")
    return stored


def firsts(rows_per_group: list[tuple[int, int]], start: int, group: Column) -> Column:
    """The first number of ``group``'s rows when groups are numbered in order from ``start``: ``start`` plus
    the rows of the groups before it."""
    firsts, first = [], start
    for key, rows in sorted(rows_per_group):
        firsts += [F.lit(key).cast("long"), F.lit(first).cast("long")]
        first += rows
    return F.create_map(*firsts)[group] if firsts else F.lit(start).cast("long")


def format_of(file: str) -> str:
    extension = os.path.splitext(file)[1].lower()
    if extension not in FORMATS:
        raise LakejoinError(
            f"cannot ingest {file}: unknown extension {extension or '(none)'!r}; use .jsonl, .csv or .parquet"
        )
    return FORMATS[extension]
