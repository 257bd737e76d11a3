"""Delta's log read through Spark SQL and DataFrame reads: the engine's log reader in a Spark Connect session.

A Connect client has no JVM beside it, and Databricks serverless and Connect servers have the Delta extension, not
Delta's Connect plugin: so the latest commit and the app markers come from ``DESCRIBE HISTORY``, a table's location
from ``DESCRIBE DETAIL``, and what only the log's actions say (a source table's commits, an app transaction older
than the commits kept) from reading the ``_delta_log`` files as text and Parquet, as the server sees them.
Each look-up is a round trip to the server; the JVM reader (state/engines/jvm.py) is the fast path where there is
a JVM.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from urllib.parse import urlparse

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from state.engines.base import Actions, Recorded, marked
from state.engines.delta_log import Head, Listed, data_file, sql_name
from state.errors import LakejoinError
from state.layout import is_table_name

# What DESCRIBE HISTORY says of a path or name that is not a Delta table.
NOT_A_TABLE = ("DELTA_TABLE_ONLY_OPERATION", "DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE", "PATH_NOT_FOUND", "TABLE_OR_VIEW_NOT_FOUND")
# How far back the app markers are looked for, commit counts in turn: the newest commit has it in the usual case.
HISTORY_DEPTHS = (1, 32)


class SqlLog:
    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def head(self, table: str) -> Head | None:
        """The newest commit's row of ``DESCRIBE HISTORY``, kept as the handle: its marker and metrics answer
        ``recorded`` and ``rows_committed`` in the usual case without another round trip."""
        rows = self._history(table, 1)
        if not rows:
            return None
        # A recreated table starts again at version 0: its newest commit's time tells it from the one it replaced.
        return Head(int(rows[0]["version"]), f"{rows[0]['version']}@{rows[0]['timestamp']}", rows[0])

    def schema(self, table: str, head: Head) -> StructType:
        return self._reader().load(table).schema if not is_table_name(table) else self.spark.read.table(table).schema

    def files(self, table: str, head: Head, version: int | None) -> Listed | None:
        """As the version's checksum file lists them (one small read, where planning a Delta read of a new version
        reconstructs the table's state on the server), where plain Parquet reads them: no partitions, column mapping
        or deletion vectors."""
        if is_table_name(table):
            return None
        checksum = self._checksum(table, head.version if version is None else version)
        listed, metadata = checksum.get("allFiles"), checksum.get("metadata") or {}
        if listed is None or metadata.get("partitionColumns") or (metadata.get("configuration") or {}).get("delta.columnMapping.mode", "none") != "none":
            return None
        if any(add.get("deletionVector") for add in listed):
            return None
        schema = StructType.fromJson(json.loads(metadata["schemaString"]))
        return Listed([data_file(table, add["path"]) for add in listed], schema, [add.get("stats") for add in listed])

    def rows_committed(self, table: str, head: Head) -> int | None:
        written = (head.handle["operationMetrics"] or {}).get("numOutputRows")
        return None if written is None else int(written)

    def recorded(self, table: str, head: Head, app_id: str) -> Recorded:
        for depth in (*HISTORY_DEPTHS, None):
            rows = [head.handle] if depth == 1 else self._history(table, depth)
            found = next((record for row in rows if (record := marked(row["userMetadata"], app_id)) is not None), None)
            if found is not None:
                return found
            if depth is None or len(rows) < depth:
                break
        return Recorded(self._state_txn(table, head, app_id), in_commits=False)

    def table_id(self, table: str, head: Head) -> str:
        return str(self._detail(table)["id"])

    def source_root(self, table: str) -> str:
        return str(self._detail(table)["location"])

    def source_snapshot(self, table: str, head: Head, version: int | None) -> tuple[int, Actions]:
        """Replayed from the log: the last checkpoint at or before ``version``, then the commits after it."""
        upto = head.version if version is None else version
        root = self.source_root(table)
        log = root.rstrip("/") + "/_delta_log"
        base, first = self._checkpoint(log, upto)
        files: dict[tuple[str, str], dict] = {}
        kinds: dict[str, dict] = {}
        for _, actions in [(None, base), *self._commits(table, log, first, upto)]:
            for action in actions:
                if "add" in action:
                    files[_file_key(root, action["add"])] = action["add"]
                elif "remove" in action:
                    files.pop(_file_key(root, action["remove"]), None)
                elif "metaData" in action or "protocol" in action:
                    kinds[next(iter(action))] = action
        # A snapshot's files are what it holds, each to be read: the state marks them dataChange = false, so that is
        # left out, as the JVM reader leaves it; and it says of each whether it carries deletion vectors.
        adds = [
            {"add": {"path": add["path"], "partitionValues": add.get("partitionValues") or {}, "modificationTime": add.get("modificationTime"),
                     "deletionVector": bool(add.get("deletionVector"))}}
            for add in files.values()
        ]  # fmt: skip
        return upto, [*kinds.values(), *adds]

    def source_commits(self, table: str, after: int) -> Iterator[tuple[int, Actions]]:
        head = self.head(table)
        if head is None or head.version <= after:
            return iter(())
        return iter(self._commits(table, self._log_folder(table), after + 1, head.version))

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
                f"cannot delete {path} over Spark Connect: this machine does not see it; delete the folder where the server "
                "sees it, or keep the warehouse in a catalog schema"
            )

    def _reader(self):  # noqa: ANN202 - a DataFrameReader
        return self.spark.read.format("delta")

    def _history(self, table: str, limit: int | None) -> list:
        """The newest ``limit`` commits (all kept ones when None), newest first; [] when there is no table."""
        if is_table_name(table) and not self.spark.catalog.tableExists(table):
            return []
        bound = "" if limit is None else f" LIMIT {limit}"
        try:
            history = self.spark.sql(f"DESCRIBE HISTORY {sql_name(table)}{bound}")
            return history.select("version", "timestamp", "userMetadata", "operationMetrics").collect()
        except AnalysisException as exc:
            if exc.getCondition() in NOT_A_TABLE:
                return []
            raise

    def _detail(self, table: str):  # noqa: ANN202 - a Row
        return self.spark.sql(f"DESCRIBE DETAIL {sql_name(table)}").select("id", "location").first()

    def _checksum(self, table: str, version: int) -> dict:
        """The version's checksum file (``.crc``), parsed; {} when there is none."""
        try:
            text = self.spark.read.text(f"{table.rstrip('/')}/_delta_log/{version:020d}.crc", wholetext=True).first()
        except AnalysisException:
            return {}
        return {} if text is None else json.loads(text[0])

    def _log_folder(self, table: str) -> str:
        return self.source_root(table).rstrip("/") + "/_delta_log"

    def _commits(self, table: str, log: str, first: int, last: int) -> list[tuple[int, Actions]]:
        """The actions of commits ``first``..``last``, each commit file read as lines of JSON: one Spark read."""
        if first > last:
            return []
        paths = [f"{log}/{version:020d}.json" for version in range(first, last + 1)]
        try:
            lines = self.spark.read.text(paths).select(F.col("_metadata.file_name").alias("file"), "value").collect()
        except AnalysisException as exc:
            raise LakejoinError(f"source table {table} no longer has the versions {first}..{last} in its log ({exc.getCondition()})") from exc
        commits: dict[int, Actions] = {version: [] for version in range(first, last + 1)}
        for line in lines:
            commits[int(line["file"].split(".")[0])].append(json.loads(line["value"]))
        missing = [version for version, actions in commits.items() if not actions]  # every commit has its commitInfo
        if missing:
            raise LakejoinError(f"source table {table}: version {missing[0]}'s commit file could not be read from its log")
        return sorted(commits.items())

    def _checkpoint(self, log: str, upto: int) -> tuple[Actions, int]:
        """The actions of the newest checkpoint at or before ``upto`` that ``_last_checkpoint`` names, and the first
        commit after it; ([], 0) without one (the commits are read from the first)."""
        try:
            pointer = self.spark.read.json(f"{log}/_last_checkpoint").first()
        except AnalysisException:
            return [], 0
        if pointer is None or pointer["version"] > upto:
            return [], 0
        fields = pointer.asDict()
        if fields.get("v2Checkpoint") is not None:
            raise LakejoinError(f"{log} has a V2 checkpoint, which lakejoin cannot read over Spark Connect yet: read the table from a classic session")
        version, parts = int(fields["version"]), fields.get("parts")
        files = (
            [f"{log}/{version:020d}.checkpoint.parquet"]
            if not parts
            else [f"{log}/{version:020d}.checkpoint.{part:010d}.{parts:010d}.parquet" for part in range(1, parts + 1)]
        )
        checkpoint = self.spark.read.parquet(*files)
        kept = [name for name in ("add", "metaData", "protocol", "txn") if name in checkpoint.columns]
        rows = checkpoint.select(F.to_json(F.struct(*kept)).alias("action")).collect()
        return [action for row in rows if (action := json.loads(row["action"]))], version + 1

    def _state_txn(self, table: str, head: Head, app_id: str) -> int | None:
        """The app's transaction in the table's state: from the version's checksum file where it lists them (Delta on
        Spark writes it with each commit), else the newest ``txn`` action of it in the checkpoints and commits the log
        folder holds (its versions only grow)."""
        listed = None if is_table_name(table) else self._checksum(table, head.version).get("setTransactions")
        if listed is not None:
            return next((int(txn["version"]) for txn in listed if txn["appId"] == app_id), None)
        log = self._log_folder(table)
        schema = "txn struct<appId: string, version: long>"
        versions = [_newest(self.spark.read.schema(schema).json(f"{log}/*.json"), app_id)]
        try:  # analysed where it runs: a Connect client's reads are lazy
            versions.append(_newest(self.spark.read.parquet(f"{log}/*.checkpoint*.parquet"), app_id))
        except AnalysisException:
            pass  # no checkpoint yet
        known = [version for version in versions if version is not None]
        return max(known, default=None)


def _newest(actions: DataFrame, app_id: str) -> int | None:
    """The newest version of ``app_id``'s ``txn`` actions among ``actions`` (a log's commits or checkpoint)."""
    newest = actions.where(F.col("txn.appId") == app_id).agg(F.max("txn.version")).first()[0]
    return None if newest is None else int(newest)


def _file_key(root: str, action: dict) -> tuple[str, str]:
    """What tells a data file in the table's state, as Delta's replay does: its path (relative or absolute, resolved)
    and its deletion vector (a DML's add of a file with a new one precedes the remove of the file with the old one)."""
    vector = action.get("deletionVector") or {}
    return data_file(root, action["path"]), f"{vector.get('storageType')}{vector.get('pathOrInlineDv')}@{vector.get('offset')}"
