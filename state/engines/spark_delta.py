"""Delta on Spark (``delta-spark``): used where the session has Delta (Databricks, clusters with the jars).

Same contract as the delta-rs engine. A write records its application transaction as a ``marker`` in its commit's
``userMetadata`` (writer option ``userMetadata``; for MERGE the session conf, on a session of the MERGE's own), and
lakejoin finds it by reading the newest commits. Delta's own app transaction (``txnAppId``/``txnVersion``) would
cost a reconstruction of the table's state per write: Delta 4.4 checks it that way (docs/design.md section 3.4). It
is written only where no kept commit records the app (a table's first write, or after its records left the log),
so the state holds the app's version where the commits no longer do.
Table metadata (version, schema) is read from the Delta log's snapshot, not by Spark jobs.
A table is a path or, in a Unity Catalog warehouse, a three-part name (``main.lakejoin.gold_join_results``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from state.engines.base import Actions, Data, Memberships, Merged, OnMatch, TableInfo, Txn, covers, marked_version, marker, match_condition
from state.errors import LakejoinError
from state.layout import is_catalog_schema


def is_table_name(table: str) -> bool:
    """``catalog.schema.table`` (a Unity Catalog table), not a path."""
    return "/" not in table and is_catalog_schema(table.rpartition(".")[0])

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
# _recording's names: a writer's options, and the session confs a MERGE takes them as.
WRITER_OPTIONS = {"app_id": "txnAppId", "version": "txnVersion", "marker": "userMetadata"}
SESSION_CONFS = {"app_id": TXN_APP_ID, "version": TXN_VERSION, "marker": USER_METADATA}
SORT_WITHIN_FILES = "spark.databricks.io.skipping.mdc.sortWithinFiles"
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
AUTO_MERGE = "spark.databricks.delta.schema.autoMerge.enabled"
# Tables must stay writable by delta-rs too (docs/design.md section 5): no deletion vectors.
NO_DELETION_VECTORS = "spark.databricks.delta.properties.defaults.enableDeletionVectors"
# What the engine sets on the session it is given (pipelines/api.py puts a caller's values back once its calls end).
SESSION_SETTINGS = {NO_DELETION_VECTORS: "false"}


class SparkDeltaEngine:
    name = "spark"
    driver_writes = False

    def __init__(self, spark: SparkSession) -> None:
        from delta.tables import DeltaTable

        self.spark = spark
        self._jvm = spark._jvm  # type: ignore[attr-defined]
        self._delta_table = DeltaTable
        # (table, column) -> (table id, version, maximum): the last aggregate asked of each table. A snapshot never
        # changes, so asking again at the same version (each batch's plan, each ingest) needs no Spark job.
        self._maxima: dict[tuple[str, str], tuple[str, int, int | None]] = {}
        for name, value in SESSION_SETTINGS.items():
            spark.conf.set(name, value)

    def _exists(self, table: str) -> bool:
        return self._snapshot(table) is not None

    def _handle(self, table: str, session: SparkSession | None = None):  # noqa: ANN202 - delta.tables.DeltaTable
        session = session or self.spark
        if is_table_name(table):
            return self._delta_table.forName(session, table)
        return self._delta_table.forPath(session, table)

    def _snapshot(self, table: str):  # noqa: ANN202 - a JVM org.apache.spark.sql.delta.Snapshot
        """The table's latest snapshot, straight from its Delta log: listing the log and reading the newest
        checksum file take milliseconds, where ``history``, ``detail`` or a read plan each run a Spark job.
        None when there is no table."""
        if is_table_name(table) and not self.spark.catalog.tableExists(table):
            return None
        none = self._jvm.scala.Option.empty()
        snapshot = self._log(table).update(False, none, none)
        return snapshot if snapshot.version() >= 0 else None

    def _log(self, table: str):  # noqa: ANN202 - a JVM org.apache.spark.sql.delta.DeltaLog
        if is_table_name(table):
            return self._handle(table)._jdt.deltaLog()
        return self._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, table)

    def _rows_committed(self, table: str, version: int, frame: DataFrame) -> int:
        """The rows the append committed as ``version``, from the metrics Delta records in that commit (one
        small file read). Not an ``Observation``: its listener logs a stack trace for every failed query in the
        session, and Great Expectations on Spark runs some that fail by design."""
        actions = self._log(table).getChanges(version, self._jvm.scala.Option.empty(), False).next()._2()
        for index in range(actions.size()):
            action = actions.apply(index)
            if action.getClass().getSimpleName() == "CommitInfo" and action.operationMetrics().isDefined():
                written = action.operationMetrics().get().get("numOutputRows")
                if written.isDefined():
                    return int(written.get())
        return frame.count()  # metrics off (spark.databricks.delta.history.metricsEnabled=false)

    def version(self, path: str) -> int | None:
        snapshot = self._snapshot(path)
        return None if snapshot is None else int(snapshot.version())

    def schema(self, path: str, version: int | None = None) -> StructType | None:
        if version is not None:  # a time-travel read plans from the log at that version; nothing runs
            frame = self.read(path, version)
            return None if frame is None else frame.schema
        snapshot = self._snapshot(path)
        return None if snapshot is None else _schema(snapshot)

    def read(self, path: str, version: int | None = None, where: str | None = None) -> DataFrame | None:
        snapshot = self._snapshot(path)
        if snapshot is None:
            return None
        log, none = self._log(path), self._jvm.scala.Option.empty()
        if version is not None and version != snapshot.version():
            snapshot = log.getSnapshotAt(version, none, none, False)
        # A whole path table's files as the version's checksum lists them: no state reconstruction to plan the read
        # (a filtered read goes through Delta, which skips files by their statistics).
        files = None if is_table_name(path) or where is not None else _listed_files(snapshot, log)
        if files is not None:
            schema = _schema(snapshot)
            df = self.spark.read.schema(schema).parquet(*files) if files else self.spark.createDataFrame([], schema)
        else:
            reader = self.spark.read.format("delta")
            if version is not None:
                reader = reader.option("versionAsOf", version)
            df = reader.table(path) if is_table_name(path) else reader.load(path)
        return df if where is None else df.where(where)

    def rows(self, path: str, version: int | None = None, where: str | None = None) -> pa.Table | None:
        df = self.read(path, version, where)
        return None if df is None else df.toArrow()

    def max_value(self, path: str, column: str, version: int | None = None) -> int | None:
        snapshot = self._snapshot(path)
        if snapshot is None:
            return None
        # The table's id tells a table recreated at the same path (``reset``) from the one it replaced.
        at = (str(snapshot.metadata().id()), int(snapshot.version()) if version is None else version)
        known = self._maxima.get((path, column))
        if known is not None and known[:2] == at:
            return known[2]
        value = self.read(path, at[1]).agg(F.max(column)).first()[0]
        maximum = None if value is None else int(value)
        self._maxima[(path, column)] = (*at, maximum)
        return maximum

    def info(self, path: str, app_id: str) -> TableInfo | None:
        snapshot = self._snapshot(path)
        return None if snapshot is None else TableInfo(int(snapshot.version()), _schema(snapshot), self._recorded(path, snapshot, app_id).version)

    def txn_version(self, path: str, app_id: str) -> int | None:
        snapshot = self._snapshot(path)
        return None if snapshot is None else self._recorded(path, snapshot, app_id).version

    def _check(self, table: str, snapshot, txn: Txn | None) -> Recorded | None:  # noqa: ANN001 - a JVM Snapshot, or None
        """What ``table`` records of ``txn``'s app before a write; None without a txn, or without a table yet."""
        return None if txn is None or snapshot is None else self._recorded(table, snapshot, txn.app_id)

    def _recorded(self, table: str, snapshot, app_id: str) -> Recorded:  # noqa: ANN001 - a JVM Snapshot
        """The newest commit's record of ``app_id`` (its marker, or an app transaction: delta-rs writes both), looked
        for from the snapshot's commit back (one commit file in the usual case); else, once the commits the log keeps
        are read, the state's app transaction."""
        log, none = self._log(table), self._jvm.scala.Option.empty()
        for version in range(int(snapshot.version()), -1, -1):
            changes = log.getChanges(version, none, False)
            commit = changes.next() if changes.hasNext() else None
            if commit is None or commit._1() != version:  # this commit has left the log, and so have older ones
                break
            found = _commit_record(commit._2(), app_id)
            if found is not None:
                return Recorded(found, in_commits=True)
        return Recorded(_txn_version(snapshot, app_id), in_commits=False)

    def source_identity(self, table: str) -> tuple[str, int] | None:
        snapshot = self._snapshot(table)
        return None if snapshot is None else (str(snapshot.metadata().id()), int(snapshot.version()))

    def source_root(self, table: str) -> str:
        return str(self._log(table).dataPath().toString())

    def source_snapshot(self, table: str, version: int | None = None) -> tuple[int, Actions] | None:
        snapshot = self._snapshot(table)
        if snapshot is None:
            return None
        if version is not None:
            none = self._jvm.scala.Option.empty()
            snapshot = self._log(table).getSnapshotAt(version, none, none, False)
        # A snapshot's files are what it holds, each to be read: the state marks them dataChange = false, so that is left out.
        files = DataFrame(snapshot.allFiles().toDF(), self.spark).select(
            "path", "partitionValues", "modificationTime", F.col("deletionVector").isNotNull().alias("deletionVector")
        )
        adds = [{"add": json.loads(add)} for add in files.toJSON().collect()]
        return int(snapshot.version()), [json.loads(snapshot.metadata().json()), json.loads(snapshot.protocol().json()), *adds]

    def source_commits(self, table: str, after: int) -> Iterator[tuple[int, Actions]]:
        try:
            changes = self._log(table).getChanges(after + 1, self._jvm.scala.Option.empty(), True)
            while changes.hasNext():
                pair = changes.next()
                actions = pair._2()
                yield int(pair._1()), [json.loads(actions.apply(i).json()) for i in range(actions.size())]
        except Py4JJavaError as exc:
            reason = str(exc.java_exception.toString()).splitlines()[0]
            raise LakejoinError(f"source table {table} no longer has the versions after {after} in its log ({reason})") from exc

    def source_schema(self, table: str, version: int | None = None) -> StructType | None:
        return self.schema(table, version)  # every read asks Delta's log for its latest state

    def refresh(self) -> None:
        """This engine holds no table open: each call asks Delta's log for its latest state (``DeltaLog.update``)."""

    def drop(self, path: str) -> None:
        if is_table_name(path):
            self.spark.sql(f"DROP TABLE IF EXISTS {path}")
            return
        hadoop_path = self._jvm.org.apache.hadoop.fs.Path(path)
        hadoop_path.getFileSystem(self.spark._jsc.hadoopConfiguration()).delete(hadoop_path, True)  # type: ignore[union-attr]
        self._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()

    def append(self, path: str, df: Data, txn: Txn | None = None) -> int | None:
        snapshot = self._snapshot(path)  # one look at the log: the transaction check and the version to compare
        recorded = self._check(path, snapshot, txn)
        if recorded is not None and recorded.covers(txn):  # type: ignore[arg-type] - a record needs a txn
            return None
        frame = self.spark.createDataFrame(df) if isinstance(df, pa.Table) else df
        _append_to(path, frame, _recording(txn, recorded, WRITER_OPTIONS))
        after = self.version(path)
        if snapshot is None or after != snapshot.version():
            return df.num_rows if isinstance(df, pa.Table) else self._rows_committed(path, after, frame)
        if txn is None or recorded is None or not recorded.in_commits:  # Delta found its app transaction recorded
            return None
        # Delta commits nothing for a write of no rows, marker or not: record the batch by an app transaction,
        # an action of its own, so the table says it was written (gold is, every batch).
        _append_to(path, frame.limit(0), _recording(txn, None, WRITER_OPTIONS))
        return 0

    def merge(
        self,
        path: str,
        df: Data,
        key: str,
        evict: Memberships | None = None,
        txn: Txn | None = None,
        aligned: str | None = None,
        on_match: OnMatch | None = None,
    ) -> Merged | None:
        snapshot = self._snapshot(path)
        if snapshot is None:
            written = self.append(path, df, txn)
            return None if written is None else Merged(written, 0)
        recorded = self._check(path, snapshot, txn)
        if recorded is not None and recorded.covers(txn):  # type: ignore[arg-type] - a record needs a txn
            return None
        # A source built from rows on the driver is an immutable local relation: MERGE need not copy it first.
        confs = {AUTO_MERGE: "true"} | ({MATERIALIZE_SOURCE: "none"} if isinstance(df, pa.Table) else {})
        confs |= _recording(txn, recorded, SESSION_CONFS)
        session = self._session(confs)
        source = df if isinstance(df, DataFrame) else session.createDataFrame(df)
        merger = (
            self._handle(path, session)
            .alias("target")
            .merge(source.alias("source"), match_condition(key, df, aligned))
            .whenNotMatchedInsertAll()
        )
        if on_match is not None and on_match.delete:
            merger = merger.whenMatchedDelete(condition=on_match.condition)
        elif on_match is not None and on_match.when is not None:
            merger = merger.whenMatchedUpdate(condition=on_match.condition, set=on_match.updates(evict))
        if evict is not None and (gone := evict.gone("target")) is not None:
            merger = merger.whenNotMatchedBySourceDelete(gone)
        if evict is not None and (leaving := evict.leaving("target")) is not None:
            merger = merger.whenNotMatchedBySourceUpdate(condition=leaving, set=evict.cleared("target"))
        # The MERGE's own counts: a MERGE that changes nothing commits nothing, so the history's latest
        # entry would be an earlier commit's.
        counts = merger.execute().first()
        return Merged(int(counts["num_inserted_rows"]), int(counts["num_deleted_rows"]))

    def optimize(self, path: str, order_by: str | None = None) -> None:
        if not self._exists(path):
            return
        if order_by is None:
            self._handle(path).optimize().executeCompaction()
            return
        sorting = self._handle(path, self._session({SORT_WITHIN_FILES: "true"})).optimize()  # Z-order alone only range-partitions
        sorting.executeZOrderBy(order_by)

    def vacuum(self, path: str, retention_hours: int) -> None:
        if self._exists(path):
            self._handle(path).vacuum(retention_hours)

    def _session(self, confs: dict[str, str]) -> SparkSession:
        """A session of its own for one command's settings (a MERGE's app transaction is a session setting), so
        commands on different tables can run at once without seeing each other's settings."""
        session = self.spark.newSession()
        for name, value in {**SESSION_SETTINGS, **confs}.items():
            session.conf.set(name, value)
        return session


def _append_to(table: str, frame: DataFrame, options: dict[str, str]) -> None:
    writer = frame.write.format("delta").mode("append").option("mergeSchema", "true").options(**options)
    if is_table_name(table):
        writer.saveAsTable(table)
    else:
        writer.save(table)


def _schema(snapshot) -> StructType:  # noqa: ANN001 - a JVM Snapshot
    return StructType.fromJson(json.loads(snapshot.schema().json()))


@dataclass(frozen=True)
class Recorded:
    """The last version of an app a table records, and whether a commit the log keeps says so (else the state)."""

    version: int | None
    in_commits: bool

    def covers(self, txn: Txn) -> bool:
        return covers(self.version, txn)


def _recording(txn: Txn | None, recorded: Recorded | None, names: dict[str, str]) -> dict[str, str]:
    """The writer options (or session confs) that record ``txn``, named by ``names``: always its marker, and Delta's
    app transaction too where no kept commit records the app (see the module's docstring)."""
    if txn is None:
        return {}
    settings = {names["marker"]: marker(txn)}
    if recorded is None or not recorded.in_commits:
        settings |= {names["app_id"]: txn.app_id, names["version"]: str(txn.version)}
    return settings


def _listed_files(snapshot, log) -> list[str] | None:  # noqa: ANN001 - a JVM Snapshot and its DeltaLog
    """The data files of ``snapshot`` (absolute paths) as its checksum file lists them (Delta on Spark writes the list for tables of
    few files), where plain Parquet reads them: no partitions, column mapping or deletion vectors. None otherwise:
    planning a Delta read of a new version reconstructs the table's state, Spark jobs over its log."""
    checksum = snapshot.checksumOpt()
    listed = checksum.get().allFiles() if checksum.isDefined() else None
    metadata = snapshot.metadata()
    if listed is None or not listed.isDefined() or not metadata.partitionColumns().isEmpty():
        return None
    mapping = metadata.configuration().get("delta.columnMapping.mode")
    if mapping.isDefined() and mapping.get() != "none":
        return None
    adds = [listed.get().apply(i) for i in range(listed.get().size())]
    if any(add.deletionVector() is not None for add in adds):
        return None
    return [str(add.absolutePath(log).toString()) for add in adds]


def _commit_record(actions, app_id: str) -> int | None:  # noqa: ANN001 - a JVM Seq[Action]
    """The version of ``app_id`` one commit records: its marker, or its app transaction."""
    for index in range(actions.size()):
        action = actions.apply(index)
        kind = action.getClass().getSimpleName()
        if kind == "CommitInfo" and action.userMetadata().isDefined():
            found = marked_version(action.userMetadata().get(), app_id)
            if found is not None:
                return found
        elif kind == "SetTransaction" and action.appId() == app_id:
            return int(action.version())
    return None


def _txn_version(snapshot, app_id: str) -> int | None:  # noqa: ANN001 - a JVM Snapshot
    """The app's last transaction version in the snapshot's state: from the version's checksum file where it lists
    them (Delta on Spark writes it with each commit), else from the state itself (a Spark job over the log)."""
    checksum = snapshot.checksumOpt()
    listed = checksum.get().setTransactions() if checksum.isDefined() else None
    if listed is not None and listed.isDefined():
        transactions = listed.get()
        versions = [transactions.apply(i) for i in range(transactions.size())]
        return next((int(txn.version()) for txn in versions if txn.appId() == app_id), None)
    recorded = snapshot.transactions().get(app_id)
    return int(recorded.get()) if recorded.isDefined() else None

