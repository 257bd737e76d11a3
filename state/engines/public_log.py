"""Delta's log read through what Delta and Unity Catalog promise: SQL (``DESCRIBE HISTORY``, ``DESCRIBE DETAIL``)
and DataFrame reads by name (``versionAsOf``, ``inputFiles``), never a table's files by path.

It is the engine's log reader wherever the JVM reader is not allowed (state/engines/spark_delta.py ``log_reader``):
a Spark Connect session (Databricks serverless, Databricks Connect, ``lakejoin serve``), a Databricks runtime, whose
Delta is its own, and a session whose Delta is not the version lakejoin pins. Unity Catalog refuses path access to a
managed table's storage, so nothing here reads ``_delta_log`` or a data file: what only the log's actions would
say comes from lakejoin's own record instead (a table's app transaction older than the commits kept: the batch log,
``Recorded.unknown``) or from public reads (a source table's versions: its history, and the files each version
holds, ``inputFiles``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from urllib.parse import urlparse

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from state.engines.base import NOT_AFTER, Actions, Recorded, marked
from state.engines.delta_log import Head, Listed, is_connect, sql_name
from state.errors import LakejoinError
from state.layout import is_table_name

# What DESCRIBE HISTORY says of a path or name that is not a Delta table.
NOT_A_TABLE = (
    "DELTA_TABLE_ONLY_OPERATION",
    "DELTA_TABLE_NOT_FOUND",
    "DELTA_MISSING_DELTA_TABLE",
    "PATH_NOT_FOUND",
    "TABLE_OR_VIEW_NOT_FOUND",
)
# The newest commits a look-up reads, newest first: the app markers are looked for among them (the newest commit has
# them in the usual case, an ingest's commits may come after a batch's), then in the whole history. A look-up costs a
# Spark job (Delta reads commits in one) and takes as long for 1 commit as for 32 (~150 ms here, either way).
HISTORY_DEPTH = 32
# Operations that take files out without taking rows out (their removes carry dataChange = false): compaction,
# Z-ordering, and a REORG that purges rows already deleted. Any other commit is what its files and metrics say.
REWRITES = frozenset({"OPTIMIZE", "REORG"})
# Metrics of rows a commit took out or changed (Delta on Spark's and delta-rs's names).
CHANGED_ROWS = (
    "numDeletedRows",
    "numUpdatedRows",
    "numTargetRowsUpdated",
    "numTargetRowsDeleted",
    "num_deleted_rows",
    "num_updated_rows",
)


def _stamp(rows: list) -> str:
    """A head's version with its oldest row's version and commit time: a table recreated at the same path starts
    again at version 0, and its commits' times tell it from the one it replaced. Not the newest commit's time, which a
    head the engine builds from its own commit does not know (``committed``), so that head's stamp is a look-up's."""
    oldest = rows[-1]
    return f"{rows[0]['version']}@{oldest['version']}:{oldest['timestamp']}"


class PublicLog:
    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def head(self, table: str) -> Head | None:
        """The newest commits' rows of ``DESCRIBE HISTORY`` (``HISTORY_DEPTH``), kept as the handle: their markers and
        metrics answer ``recorded`` and ``rows_committed`` without another look-up."""
        rows = self._history(table, HISTORY_DEPTH)
        if not rows:
            return None
        return Head(int(rows[0]["version"]), _stamp(rows), rows)

    def schema(self, table: str, head: Head) -> StructType:
        return self._read(table, head.version).schema

    def files(self, table: str, head: Head, version: int | None) -> Listed | None:
        """None: a data file list with statistics is the log's to give, so the engine reads through Delta."""
        return None

    def rows_committed(self, table: str, head: Head) -> int | None:
        written = (head.handle[0]["operationMetrics"] or {}).get("numOutputRows")
        return None if written is None else int(written)

    builds_own_heads = True

    def committed(
        self, table: str, before: Head, version: int, metadata: str | None, rows: Callable[[], int] | None
    ) -> Head | None:
        """The history ``before`` read, with the engine's own commit on top as what it wrote says of it (its marker,
        its rows): a ``DESCRIBE HISTORY`` (a Spark job) saved per write. Only when the commit came right after
        ``before``: then no other commit came between, and the rows read are still the newest but one."""
        if version != before.version + 1:
            return None
        metrics = {} if rows is None else {"numOutputRows": str(rows())}
        entry = {"version": version, "timestamp": None, "userMetadata": metadata, "operationMetrics": metrics}
        handle = [entry, *before.handle[: HISTORY_DEPTH - 1]]  # the rows a look-up now would read, but one time
        return Head(version, _stamp(handle), handle)

    def recorded(self, table: str, head: Head, app_id: str, after: int | None = None) -> Recorded:
        """The newest commit the history keeps that records ``app_id`` (after ``after``); when none does and the
        history has lost its oldest commits (its first kept version is not 0), unknown: lakejoin's batch log is the
        record then."""
        rows = head.handle
        for deeper in (False, True):
            kept = [row for row in rows if after is None or int(row["version"]) > after]
            found = next((record for row in kept if (record := marked(row["userMetadata"], app_id)) is not None), None)
            if found is not None:
                return found
            if after is not None and len(kept) < len(rows):  # the search reached ``after``
                return NOT_AFTER
            if deeper or len(rows) < HISTORY_DEPTH:
                break
            rows = self._history(table, None)
        oldest = min((int(row["version"]) for row in rows), default=0)
        return Recorded(None, in_commits=False, unknown=oldest > 0)

    def table_id(self, table: str, head: Head) -> str:
        return str(self._detail(table)["id"])

    def source_snapshot(self, table: str, head: Head, version: int | None) -> tuple[int, Actions]:
        """The version's data files as a read of it lists them (``inputFiles``), and the table's properties: enough to
        read its rows by name. Whether it deletes rows in place does not matter to a read through Delta."""
        upto = head.version if version is None else version
        detail = self._detail(table)
        metadata = {
            "metaData": {
                "partitionColumns": list(detail["partitionColumns"] or []),
                "configuration": dict(detail["properties"] or {}),
            }
        }
        return upto, [
            metadata,
            *({"add": {"path": path, "partitionValues": {}}} for path in self._files_at(table, upto)),
        ]

    def source_commits(self, table: str, after: int) -> Iterator[tuple[int, Actions]]:
        """Each version after ``after`` as its history entry and the files it added or took out (two reads' lists
        compared) say: an append adds files and takes out none; a rewrite (``REWRITES``) takes rows out of no one;
        anything that deleted, updated or took out rows is a change."""
        history = self.spark.sql(f"DESCRIBE HISTORY {sql_name(table)}").where(f"version > {after}")
        entries = sorted(
            history.select("version", "operation", "operationParameters", "operationMetrics").collect(),
            key=lambda row: row["version"],
        )
        versions = [int(row["version"]) for row in entries]
        if versions != list(range(after + 1, after + 1 + len(versions))):
            raise LakejoinError(
                f"source table {table} no longer has the versions after {after} in its history (cleaned up after its "
                "retention)"
            )
        before = None
        for entry in entries:
            version, operation = int(entry["version"]), str(entry["operation"])
            parameters, metrics = dict(entry["operationParameters"] or {}), dict(entry["operationMetrics"] or {})
            info = {"commitInfo": {"operation": operation, "operationParameters": parameters}}
            if operation in REWRITES:
                yield version, [info, {"remove": {"path": "", "dataChange": False}}]
                before = None
                continue
            if any(
                int(metrics.get(name) or 0) for name in CHANGED_ROWS
            ):  # rows deleted in place add no file, take none
                yield version, [info, {"remove": {"path": "", "dataChange": True}}]
                before = None
                continue
            files = set(self._files_at(table, version))
            earlier = set(self._files_at(table, version - 1)) if before is None else before
            taken = [{"remove": {"path": path, "dataChange": True}} for path in sorted(earlier - files)]
            yield (
                version,
                [info, *taken, *({"add": {"path": path, "partitionValues": {}}} for path in sorted(files - earlier))],
            )
            before = files

    def checkpoint(self, table: str) -> None:
        """Nothing: SQL has no statement that writes a checkpoint, so Delta writes them at its interval alone."""

    def remove(self, path: str) -> None:
        """Only where this machine sees the folder (a local server): SQL cannot delete a path table's files. Checked
        with the server afterwards, so a folder the client does not see is never taken as deleted."""
        where = urlparse(path)
        local = where.path if where.scheme == "file" else path
        if not where.scheme or where.scheme == "file":
            shutil.rmtree(local, ignore_errors=not os.path.exists(local))
        if self.head(path) is not None:
            raise LakejoinError(
                f"cannot delete {path} over Spark Connect: this machine does not see it; delete the folder where the "
                "server sees it, or keep the warehouse in a catalog schema"
            )

    def _read(self, table: str, version: int | None = None):  # noqa: ANN202 - a DataFrame
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.table(table) if is_table_name(table) else reader.load(table)

    def _files_at(self, table: str, version: int) -> list[str]:
        """The data files of ``version``, as a read of it plans them: one look at the table's state, no path read."""
        if version < 0:
            return []
        return sorted(self._read(table, version).inputFiles())

    def _history(self, table: str, limit: int | None) -> list:
        """The newest ``limit`` commits (all kept ones when None), newest first; [] when there is no table."""
        if not self._exists(table):
            return []
        bound = "" if limit is None else f" LIMIT {limit}"
        try:
            # The command's own rows: a projection of them would be a plan of its own, one Spark job more a look-up
            return self.spark.sql(f"DESCRIBE HISTORY {sql_name(table)}{bound}").collect()
        except AnalysisException as exc:
            if exc.getCondition() in NOT_A_TABLE:  # a path table over Spark Connect: see _exists
                return []
            raise

    def _exists(self, table: str) -> bool:
        """Asked of the catalog for a name, of Delta for a path in a classic session. A Spark Connect client has no
        public question for a path (Delta's own DeltaTable API needs its Connect plugin on the server, which a
        Databricks or plain server may lack): there ``_history`` takes Delta's "not a Delta table" for an answer.
        Only a folder warehouse has path tables; a catalog's are names."""
        if is_table_name(table):
            return bool(self.spark.catalog.tableExists(table))
        if is_connect(self.spark):
            return True
        from delta.tables import DeltaTable

        return bool(DeltaTable.isDeltaTable(self.spark, table))

    def _detail(self, table: str):  # noqa: ANN202 - a Row
        return self.spark.sql(f"DESCRIBE DETAIL {sql_name(table)}").collect()[0]
