"""The embedded engine: delta-rs (``deltalake``) commits, Spark reads the snapshot's Parquet files.

Data crosses from Spark to delta-rs as Arrow. Reads never go through ``DeltaTable.to_pyarrow_*``,
which can abort the interpreter at exit (delta-rs #2184): Spark reads the files ``file_uris`` names,
and small reads to the driver go through ``QueryBuilder``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from pyarrow import fs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from state.engines.base import (
    NOT_AFTER,
    Actions,
    Aligned,
    Commit,
    Data,
    Memberships,
    Merged,
    OnMatch,
    Recorded,
    TableInfo,
    as_frame,
    changes_merge,
    marked,
    marker,
    match_condition,
    no_change_feed,
    one_of,
)
from state.engines.delta_log import data_file
from state.errors import LakejoinError, first_line
from state.faults import reached
from state.layout import NEW_TABLE_LOG


def to_arrow(df: Data) -> pa.Table:
    """``df`` as Arrow with every field nullable, so a later batch may carry nulls the first did not."""
    table = df if isinstance(df, pa.Table) else df.toArrow()
    return table.cast(pa.schema([field.with_nullable(True) for field in table.schema]))


class DeltaRsReader:
    """delta-rs alone, no Spark: what ``status``, ``show`` and ``reset`` ask of a warehouse (base.DeltaReader)."""

    name = "delta-rs"

    def __init__(self) -> None:
        self._latest: dict[str, DeltaTable] = {}
        self._guard = threading.Lock()

    def _table(self, path: str, version: int | None = None) -> DeltaTable | None:
        """A warehouse table, opened once per run and then brought up to date by reading only the commits newer than
        the ones it has (opening replays the whole log: ~20 ms at 60 versions, and a batch asks ~50 times). Sound
        because nothing drops and creates again a warehouse table during a run (``reset``, the one command that drops
        tables, excludes runs) and every run starts with ``refresh``."""
        with self._guard:
            table = self._latest.get(path)
        if table is None and version is not None:
            return self._fresh(path, version)
        if table is None:
            table = self._fresh(path)
            if table is None:
                return None
            with self._guard:
                self._latest[path] = table
        else:
            table.update_incremental()
        return table if version is None or version == table.version() else self._fresh(path, version)

    @staticmethod
    def _fresh(path: str, version: int | None = None) -> DeltaTable | None:
        """The table read from its log now: for the user's source tables, which may be replaced at any time."""
        try:
            return DeltaTable(path, version=version)
        except TableNotFoundError:
            return None

    def version(self, path: str) -> int | None:
        table = self._table(path)
        return None if table is None else table.version()

    def schema(self, path: str, version: int | None = None) -> StructType | None:
        table = self._table(path, version)
        return None if table is None else _spark_schema(table)

    def rows(self, path: str, version: int | None = None, where: str | None = None) -> pa.Table | None:
        """Through delta-rs's own query engine (DataFusion): milliseconds, where a Spark job takes ~0.2 s."""
        table = self._table(path, version)
        if table is None:
            return None
        return _plain(_query(table, "SELECT * FROM snapshot" + ("" if where is None else f" WHERE {where}")), table)

    def lookup(self, path: str, column: str, values: Sequence[str], where: str | None = None) -> pa.Table | None:
        """DataFusion skips the files by their statistics itself."""
        return self.rows(path, where=one_of(column, values, where))

    def max_value(self, path: str, column: str, version: int | None = None) -> int | None:
        table = self._table(path, version)
        if table is None:
            return None
        stats = pa.table(table.get_add_actions(flatten=True))
        if stats.num_rows == 0:
            return None
        return max((value for value in stats.column(f"max.{column}").to_pylist() if value is not None), default=None)

    def count(self, path: str, where: str | None = None) -> int | None:
        """From the log's file statistics when no predicate is given, every file has them and no deletion vector hides
        rows; else through DataFusion."""
        table = self._table(path)
        if table is None:
            return None
        if where is None and "deletionVectors" not in (table.protocol().reader_features or []):
            counts = pa.table(table.get_add_actions(flatten=False)).column("num_records").to_pylist()
            if None not in counts:
                return sum(counts)
        found = self.aggregate(path, where, "count(*)")
        return None if found is None else found[0]

    def aggregate(self, path: str, where: str | None, *expressions: str) -> tuple | None:
        table = self._table(path)
        if table is None:
            return None
        result = _query(
            table, f"SELECT {', '.join(expressions)} FROM snapshot" + ("" if where is None else f" WHERE {where}")
        )
        return tuple(column[0].as_py() for column in result.columns)

    def head(self, path: str, limit: int) -> pa.Table | None:
        table = self._table(path)
        if table is None:
            return None
        return _plain(_query(table, f"SELECT * FROM snapshot LIMIT {int(limit)}"), table)

    def txn_version(self, path: str, app_id: str) -> int | None:
        table = self._table(path)
        return None if table is None else _recorded(table, app_id).version

    def info(self, path: str, app_id: str, after: int | None = None) -> TableInfo | None:
        table = self._table(path)
        return (
            None if table is None else TableInfo(table.version(), _spark_schema(table), _recorded(table, app_id, after))
        )

    def source_identity(self, table: str) -> tuple[str, int] | None:
        opened = self._fresh(table)
        return None if opened is None else (str(opened.metadata().id), opened.version())

    def source_schema(self, table: str, version: int | None = None) -> StructType | None:
        opened = self._fresh(table, version)
        return None if opened is None else _spark_schema(opened)

    def source_snapshot(self, table: str, version: int | None = None) -> tuple[int, Actions] | None:
        opened = self._fresh(table, version)
        if opened is None:
            return None
        metadata, protocol = opened.metadata(), opened.protocol()
        files = pa.table(opened.get_add_actions(flatten=False))
        partitions = (
            files.column("partition").to_pylist() if "partition" in files.column_names else [{}] * files.num_rows
        )
        adds = [
            {
                "add": {
                    "path": path,
                    "partitionValues": {k: None if v is None else str(v) for k, v in (values or {}).items()},
                    "modificationTime": written,
                }
            }
            for path, values, written in zip(
                files.column("path").to_pylist(), partitions, files.column("modification_time").to_pylist()
            )
        ]
        return opened.version(), [
            {
                "metaData": {
                    "partitionColumns": list(metadata.partition_columns),
                    "configuration": dict(metadata.configuration),
                }
            },
            {"protocol": {"readerFeatures": list(protocol.reader_features or [])}},
            *adds,
        ]

    def source_commits(self, table: str, after: int) -> Iterator[tuple[int, Actions]]:
        opened = _opened(self._fresh(table), table)
        filesystem, root = fs.FileSystem.from_uri(opened.table_uri.rstrip("/"))
        for version in range(after + 1, opened.version() + 1):
            try:
                with filesystem.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as stream:
                    text = stream.read().decode("utf-8")
            except (FileNotFoundError, OSError) as exc:
                raise LakejoinError(
                    f"source table {table} no longer has version {version} in its log ({first_line(exc)})"
                ) from exc
            yield version, [json.loads(line) for line in text.splitlines() if line.strip()]

    def append(
        self, path: str, df: Data, *, commit: Commit | None = None, properties: dict[str, str] | None = None
    ) -> int | None:
        table = self._table(path)  # opened once: the transaction check and the write share it
        if table is not None and _covered(table, commit):
            return None
        reached(f"opened:{path}")
        data = to_arrow(df)
        try:
            write_deltalake(
                table or path,
                data,
                mode="append",
                schema_mode="merge",
                commit_properties=_properties(commit),
                configuration=None if table else NEW_TABLE_LOG | (properties or {}),
            )
        except DeltaError as exc:
            raise LakejoinError(f"cannot append to {path}: {first_line(exc)}") from exc
        return data.num_rows

    def pinned(self, kept: bool = False) -> AbstractContextManager[None]:
        """Nothing to pin: a table held open is brought up to date by a listing of its log, milliseconds, no Spark
        job."""
        return nullcontext()

    def refresh(self, *paths: str) -> None:
        with self._guard:
            if not paths:
                self._latest.clear()
            for path in paths:
                self._latest.pop(path, None)

    def drop(self, path: str) -> None:
        with self._guard:
            self._latest.pop(path, None)
        filesystem, root = fs.FileSystem.from_uri(path if "://" in path else os.path.abspath(path))
        if filesystem.get_file_info(root).type != fs.FileType.NotFound:
            filesystem.delete_dir(root)


class DeltaRsEngine(DeltaRsReader):
    """The reader, with Spark to read snapshots into and to compute the Arrow that delta-rs commits."""

    driver_writes = True

    def __init__(self, spark: SparkSession) -> None:
        super().__init__()
        self.spark = spark

    def read(self, path: str, version: int | None = None, where: str | None = None) -> DataFrame | None:
        table = self._table(path, version)
        if table is None:
            return None
        schema = _spark_schema(table)
        files = table.file_uris(file_pruning_predicate=where)
        if not files:
            return self.spark.createDataFrame([], schema)
        df = self.spark.read.schema(schema).parquet(*files)
        return df if where is None else df.where(where)

    def source_files(self, table: str, stored: StructType, files: Sequence[tuple[int, str]]) -> DataFrame:
        """As plain Parquet, by path: delta-rs reads a folder's tables, never a catalog's."""
        root = unquote(_opened(self._fresh(table), table).table_uri.rstrip("/"))  # a URL: Spark takes the path as it is
        paths = sorted({data_file(root, path) for _, path in files})
        if not paths:
            return self.spark.createDataFrame([], stored)
        rows = self.spark.read.schema(stored).parquet(*paths)
        return rows.select(
            "*", F.col("_metadata.file_name").alias("_file_name"), F.col("_metadata.row_index").alias("_row_index")
        )

    def source_changes(self, table: str, first: int, last: int) -> DataFrame:
        opened = _opened(self._fresh(table), table)
        try:
            rows = pa.table(opened.load_cdf(starting_version=first, ending_version=last).read_all()).drop_columns(
                ["_commit_timestamp"]
            )
        except DeltaError as exc:
            raise no_change_feed(table, first_line(exc)) from exc
        # delta-rs reads text as string views and the version unsigned, which Spark does not take from Arrow
        plain = {pa.string_view(): pa.string(), pa.uint64(): pa.int64()}
        return as_frame(
            self.spark,
            rows.cast(pa.schema([field.with_type(plain.get(field.type, field.type)) for field in rows.schema])),
        )

    def optimize(self, path: str, order_by: str | None = None) -> None:
        table = self._table(path)
        if table is not None:
            table.optimize.z_order([order_by]) if order_by else table.optimize.compact()

    def vacuum(self, path: str, retention_hours: int) -> None:
        table = self._table(path)
        if table is not None:
            table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=True)

    def checkpoint(self, path: str) -> None:
        table = self._table(path)
        if table is not None:
            table.create_checkpoint()
            if (
                table.metadata().configuration.get("delta.enableExpiredLogCleanup", "true") != "false"
            ):  # as Delta on Spark honours it
                table.cleanup_metadata()

    def apply_changes(
        self, path: str, df: Data, *, keys: Sequence[str], retraction: str, commit: Commit | None = None
    ) -> int | None:
        table = _opened(self._table(path), path)
        if _covered(table, commit):
            return None
        reached(f"opened:{path}")
        condition, kept = changes_merge(keys, retraction)
        data = to_arrow(df)
        try:
            metrics = (
                table.merge(
                    data,
                    predicate=condition,
                    source_alias="source",
                    target_alias="target",
                    merge_schema=True,
                    commit_properties=_properties(commit),
                )
                .when_matched_delete(predicate=retraction)
                .when_matched_update_all(predicate=kept)
                .when_not_matched_insert_all(predicate=kept)
                .execute()
            )
        except DeltaError as exc:
            raise LakejoinError(f"cannot merge into {path}: {first_line(exc)}") from exc
        changed = sum(
            int(metrics[name])
            for name in ("num_target_rows_deleted", "num_target_rows_updated", "num_target_rows_inserted")
        )
        if changed == 0:  # a MERGE that changes nothing commits nothing: the write is recorded by a commit of no rows
            self.append(path, data.slice(0, 0), commit=commit)
        return changed

    def merge(
        self,
        path: str,
        df: Data,
        *,
        key: str,
        evict: Memberships | None = None,
        commit: Commit | None = None,
        aligned: Aligned | None = None,
        on_match: OnMatch | None = None,
    ) -> Merged | None:
        table = self._table(path)
        if table is None:
            written = self.append(path, df, commit=commit)
            return None if written is None else Merged(written, 0)
        if _covered(table, commit):
            return None
        reached(f"opened:{path}")
        try:
            merger = table.merge(
                to_arrow(df),
                predicate=match_condition(key, aligned),
                source_alias="source",
                target_alias="target",
                merge_schema=True,
                commit_properties=_properties(commit),
            ).when_not_matched_insert_all()
            if on_match is not None and on_match.delete:
                merger = merger.when_matched_delete(predicate=on_match.condition)
            elif on_match is not None and on_match.replace:
                merger = merger.when_matched_update_all()
            elif on_match is not None and on_match.when is not None:
                merger = merger.when_matched_update(updates=on_match.updates(evict), predicate=on_match.condition)
            if evict is not None and (gone := evict.gone("target")) is not None:
                merger = merger.when_not_matched_by_source_delete(gone)
            if evict is not None and (leaving := evict.leaving("target")) is not None:
                merger = merger.when_not_matched_by_source_update(updates=evict.cleared("target"), predicate=leaving)
            metrics = merger.execute()
        except DeltaError as exc:
            raise LakejoinError(f"cannot merge into {path}: {first_line(exc)}") from exc
        return Merged(int(metrics["num_target_rows_inserted"]), int(metrics["num_target_rows_deleted"]))


def _query(table: DeltaTable, query: str) -> pa.Table:
    """``query`` over the table, registered as ``snapshot``, through delta-rs's own query engine (DataFusion)."""
    return pa.table(QueryBuilder().register("snapshot", table).execute(query).read_all())


def _plain(result: pa.Table, table: DeltaTable) -> pa.Table:
    """DataFusion's answer in the table's own types: it answers with view types Spark cannot take."""
    return result.cast(pa.schema([field.with_nullable(True) for field in pa.schema(table.schema().to_arrow())]))


def _spark_schema(table: DeltaTable) -> StructType:
    return from_arrow_schema(pa.schema(table.schema().to_arrow()), prefer_timestamp_ntz=False)  # as pyspark 4.1.4


def _opened(table: DeltaTable | None, path: str) -> DeltaTable:
    if table is None:
        raise LakejoinError(f"no Delta table at {path}")
    return table


def _covered(table: DeltaTable, commit: Commit | None) -> bool:
    """``applied`` on a table already open (each open reads the log)."""
    return commit is not None and _recorded(table, commit.app_id).covers(commit)


def _recorded(table: DeltaTable, app_id: str, after: int | None = None) -> Recorded:
    """The newest commit's record of ``app_id`` (its ``marker``, with the plan it carries: Delta on Spark writes no
    app transaction), looked for from the latest commit back (one commit file in the usual case); else, once the
    commits the log keeps are read, the state's app transaction, which every write of this engine also carries."""
    limit = 1
    while True:
        commits = table.history(limit)  # newest first
        kept = [commit for commit in commits if after is None or commit["version"] > after]
        found = next(
            (record for commit in kept if (record := marked(commit.get("userMetadata"), app_id)) is not None), None
        )
        if found is not None:
            return found
        if len(kept) < len(commits):  # the search reached ``after``
            return NOT_AFTER
        if len(commits) < limit:
            return Recorded(table.transaction_version(app_id), in_commits=False)
        limit *= 8


def _properties(commit: Commit | None) -> CommitProperties | None:
    if commit is None:
        return None
    return CommitProperties(
        app_transactions=[Transaction(app_id=commit.app_id, version=commit.version)],
        custom_metadata={"userMetadata": marker(commit)},
    )
