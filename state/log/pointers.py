"""A source table's rows found again by pointer: bronze keeps, for a Delta table read in place, each row's data file
and row index (pipelines/bronze/sources.py ingests them), and the batches and audits that need the row's columns read
them from the table's data files here."""

from __future__ import annotations

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from state.engines import DeltaEngine
from state.errors import LakejoinError
from state.join.relations import Relation, RelationSpec
from state.layout import Warehouse


def with_source_columns(
    engine: DeltaEngine,
    table: str,
    pointers: DataFrame,
    version: int | None = None,
    files: list[tuple[str, int]] | None = None,
) -> DataFrame:
    """Thin bronze rows (``pointers``) with the columns of the source rows they point at, read from the data files
    they name (``files``, each with a version of the table that holds it, when already known; one read of each; the
    rows are matched by file and row index). ``version``: the table version whose schema the rows get (None: the
    latest); a column the table gained later reads as null in older rows."""
    schema = schema_at(engine, table, version)
    kept = set(pointers.columns)
    stored = StructType([field for field in schema.fields if not field.name.startswith("_") and field.name not in kept])
    if files is None:  # the files a whole bronze points into: few next to its rows
        files = [(row[0], row[1]) for row in pointers.groupBy("_source_file").agg(F.max("_source_version")).collect()]
    located = pointers.withColumn("_file_name", F.substring_index("_source_file", "/", -1))
    if files:
        read = engine.source_files(table, stored, [(version, path) for path, version in files])
        # no broadcast hint: a batch's pointers are a local relation Spark broadcasts by size; a whole bronze
        # (validate) is not
        joined = read.join(
            located, (read["_file_name"] == located["_file_name"]) & (read["_row_index"] == located["_source_line"])
        )
        stored_values = {field.name: read[field.name] for field in stored.fields}
    else:
        joined, stored_values = (
            located,
            {field.name: F.lit(None).cast(field.dataType).alias(field.name) for field in stored.fields},
        )
    data = [
        located[name] if name in kept else stored_values[name]
        for name in schema.fieldNames()
        if not name.startswith("_")
    ]
    return joined.select(*data, *[located[name] for name in pointers.columns if name.startswith("_")])


def arrivals_with_source_columns(engine: DeltaEngine, table: str, pointers: DataFrame) -> DataFrame:
    """``with_source_columns`` for a batch's slice, with the schema of the newest version it holds: the files it points
    into, each with the newest version of its rows, from one small job over the pointers. The batch checks that every
    pointer found its row (``missing_rows``)."""
    files = sorted((row[0], row[1]) for row in pointers.groupBy("_source_file").agg(F.max("_source_version")).collect())
    require_distinct_names(table, [path for path, _ in files])
    try:
        return with_source_columns(engine, table, pointers, max((version for _, version in files), default=None), files)
    except (PySparkException, Py4JJavaError) as exc:
        raise read_failure(table)(exc) from exc


def missing_rows(table: str, pointers: int, rows: int) -> LakejoinError | None:
    """Every pointer names one row: anything else would join a row twice, or not at all."""
    if pointers == rows:
        return None
    return LakejoinError(
        f"source table {table}: {pointers} rows were ingested for this batch but {rows} were found in its data files, "
        "which must have been replaced: restore them, or join the table's current snapshot in a new warehouse"
    )


def schema_at(engine: DeltaEngine, table: str, version: int | None) -> StructType:
    """From the table's log: no data file is listed or opened."""
    schema = engine.source_schema(table, version)
    if schema is None:
        raise LakejoinError(f"source table {table} does not exist any more")
    return schema


def require_distinct_names(table: str, paths: list[str]) -> None:
    """Rows are found again by data file name and row index, so two files of one name (a table converted from
    plain Parquet, whose partition folders repeat names) cannot be told apart: refused rather than mixed up."""
    names = [path.rsplit("/", 1)[-1] for path in paths]
    if len(set(names)) != len(names):
        repeated = next(name for name in names if names.count(name) > 1)
        raise LakejoinError(
            f"source table {table} has several data files named {repeated} (in different folders), whose rows lakejoin "
            "cannot tell apart: rewrite the table's files (e.g. REORG TABLE … APPLY (PURGE) or a copy), then join it"
        )


# Databricks' error classes for a table whose row filter or column mask forbids reading its history or a past version
# (error-messages: ROW_LEVEL_SECURITY_COLUMN_MASK_FEATURE_NOT_SUPPORTED, its DESCRIBE_HISTORY and TIME_TRAVEL;
# ROW_LEVEL_SECURITY_FEATURE_NOT_SUPPORTED and COLUMN_MASKS_FEATURE_NOT_SUPPORTED, their TIME_TRAVEL).
PROTECTED_TABLE = (
    "ROW_LEVEL_SECURITY_COLUMN_MASK_FEATURE_NOT_SUPPORTED",
    "ROW_LEVEL_SECURITY_FEATURE_NOT_SUPPORTED",
    "COLUMN_MASKS_FEATURE_NOT_SUPPORTED",
)


def protected(table: str, exc: BaseException) -> LakejoinError | None:
    """The refusal of a source table lakejoin cannot read exactly: one with a row filter or column mask, whose history
    and past versions Databricks does not read (None: ``exc`` is another error)."""
    text = str(exc.java_exception.toString()) if isinstance(exc, Py4JJavaError) else str(exc)
    if not any(name in text for name in PROTECTED_TABLE):
        return None
    return LakejoinError(
        f"source table {table} has a row filter or column mask, so Databricks reads neither its history nor its past "
        "versions, which lakejoin reads it by; nothing was written: join a table without them (one the filter's "
        "owner writes from it), or land its rows as files"
    )


def read_failure(table: str):  # noqa: ANN202 - the ``refuse`` of ``land``
    def failure(exc: BaseException) -> LakejoinError:
        if (refusal := protected(table, exc)) is not None:
            return refusal
        text = str(exc.java_exception.toString()) if isinstance(exc, Py4JJavaError) else str(exc)
        if "FileNotFound" in text or "PATH_NOT_FOUND" in text or "FILE_NOT_EXIST" in text or "does not exist" in text:
            return LakejoinError(
                f"source table {table}: data files lakejoin has not joined yet were deleted (VACUUM): restore them, or "
                "join the table's current snapshot in a new warehouse; keep VACUUM's retention above the time between "
                "runs"
            )
        return LakejoinError(
            f"cannot read source table {table}: {(text.strip().splitlines() or [type(exc).__name__])[0]}"
        )

    return failure


def records(
    engine: DeltaEngine, warehouse: Warehouse, specs: dict[str, RelationSpec] | None, rel: Relation
) -> DataFrame | None:
    """Bronze's rows of ``rel`` with the record's columns: bronze itself for files; for a source table, its pointers
    with the columns read from the table's data files (the whole-table audits: ``validate``); a change feed's bronze
    holds its rows whole."""
    bronze = engine.read(warehouse.bronze(rel))
    table = None if specs is None or specs[rel.name].changes is not None else specs[rel.name].table
    return bronze if bronze is None or table is None else with_source_columns(engine, table, bronze)
