"""Parsing a landed file: each format becomes the same shape, ``Parsed`` — ``_source_line``, ``_raw``,
``_unparsable`` and the data columns, as text (JSON, CSV: typed when classified, pipelines/classify.py) or typed as
the file declares them (Parquet). A file that cannot be read as a whole is refused (``FileRefused``) here, before
anything of it is written.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType, StructField, StructType

from state.errors import FileRefused, LakejoinError
from state.names import column, nested_names_storable, quoted, stored_names

FORMATS = {".jsonl": "json", ".ndjson": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
CORRUPT = "_corrupt_record"
CASE_SENSITIVE = "spark.sql.caseSensitive"

# monotonically_increasing_id(): a row's partition index sits above this many bits, its place in the partition below.
PARTITION_BITS = 33


# Parsing: each format becomes the same shape — _source_line, _raw, _unparsable and the data columns, as text
# (JSON, CSV: typed when classified) or typed as the file declares them (Parquet).


@dataclass(frozen=True)
class Parsed:
    frame: DataFrame  # _source_line, _raw, _unparsable, then the data columns
    types: dict[str, DataType]  # each data column's type as the file gives it (JSON: inferred; CSV: string)
    text: bool  # the data columns hold text, to be parsed into their types


def _numbered_lines(spark: SparkSession, path: str) -> DataFrame:
    """Non-blank lines of a text file with their 1-based line numbers, in file order (a UTF-8 byte-order mark at
    its start dropped)."""
    lines = numbered(spark.read.text(path), "_row_id")
    numbered_lines = lines.withColumn("_source_line", F.col("_row_id") + 1)
    numbered_lines = numbered_lines.withColumn("value", F.when(F.col("_row_id") == 0, F.regexp_replace("value", "^\ufeff", "")).otherwise(F.col("value")))
    return numbered_lines.where(F.trim("value") != "").select("_source_line", F.col("value").alias("_raw"))


def numbered(frame: DataFrame, name: str) -> DataFrame:
    """``frame`` with each row's 0-based place in it as column ``name``, in the frame's own order.

    Each partition is a contiguous piece of the frame: its rows are counted (one small job) and numbered after
    those of the pieces before it, so no task holds the whole frame as a window over all rows would."""
    rows = frame.withColumn(name, F.monotonically_increasing_id())
    piece = F.shiftright(F.col(name), PARTITION_BITS)
    pieces = [(row["piece"], row["rows"]) for row in rows.groupBy(piece.alias("piece")).agg(F.count(F.lit(1)).alias("rows")).collect()]
    within = F.col(name).bitwiseAND((1 << PARTITION_BITS) - 1)
    return rows.withColumn(name, firsts(pieces, 0, piece) + within)


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
    what = "a Parquet file: name it .parquet" if start == end == b"PAR1" else next((w for magic, w in _NOT_TEXT.items() if start.startswith(magic)), None)
    if what is not None:
        raise FileRefused(f"it is {what}")


def parse_file(spark: SparkSession, path: str, fmt: str) -> Parsed:
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
    names = stored_columns([name for name, _ in fields])
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
    return parse_frame(df, df.columns, F.col("_metadata.row_index") + 1)


def parse_frame(df: DataFrame, columns: list[str], line: Column) -> Parsed:
    """``df``'s ``columns`` as records typed as the frame declares them (a Parquet file, a DataFrame handed to
    lakejoin); ``line`` numbers them from 1. A nested type whose names Delta cannot store is kept as its JSON."""
    names = stored_columns(columns)
    fields = [df.schema[name] for name in columns]

    def kept(field: StructField) -> Column:
        return column(field.name) if nested_names_storable(field.dataType) else F.to_json(column(field.name))

    frame = df.select(
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
        raise LakejoinError(f"cannot ingest {file}: unknown extension {extension or '(none)'!r}; use .jsonl, .csv or .parquet")
    return FORMATS[extension]
