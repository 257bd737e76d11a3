"""The one place lakejoin's Python reaches into Spark's JVM (``_jvm``, ``_jsparkSession``, ``SparkContext``): used only
in a classic session, where the driver's JVM is beside the Python process (local mode, a cluster's driver, a Databricks
job). A Spark Connect client has no JVM; tests/test_where_spark_runs.py fails if any other module reaches in.

- ``JvmLog``: Delta's log read in the driver's JVM, the engine's log reader in a classic session off Databricks whose
  Delta is the line lakejoin pins (``delta_version``; state/engines/delta_log.py). Listing the log and reading the
  newest checksum file take milliseconds, where ``DESCRIBE HISTORY`` or a read plan each run a Spark job or a round
  trip (state/engines/public_log.py does that). Delta's internals are no contract: a Databricks runtime's Delta has
  its own, so it is never used there.
- ``cloned_session``: a session for a command with settings of its own, which hears of its parent's observations.
- ``has_delta_classes``: whether Delta's classes load in the session's JVM.
- ``classic_spark_running``: whether this process already runs a classic Spark, on any thread.
- ``start_driver_jvm``: the driver JVM of a session lakejoin starts itself, its stderr without the JDK's
  incubator-module notice.
- ``connect_executions``, ``interrupt_connect_tag``: what the Spark Connect server ``lakejoin serve`` hosts is
  running, and stopping what a killed command left running there.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from state.engines.base import NOT_AFTER, Actions, Recorded, marked
from state.engines.delta_log import Head, Listed
from state.errors import LakejoinError
from state.layout import is_table_name

if TYPE_CHECKING:
    from py4j.java_gateway import JVMView


def classic_spark_running() -> bool:
    """A classic SparkContext is up in this process, whichever thread started it (``getActiveSession`` is per
    thread)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


# Printed by the JDK itself as the JVM boots, before any logging is set up: Spark's launcher adds
# --add-modules=jdk.incubator.vector to every driver (for MLlib's BLAS, SPARK-48021), and no option removes the notice.
INCUBATOR_NOTICE = b"WARNING: Using incubator modules: "


def start_driver_jvm(settings: dict[str, str]) -> None:
    """Start this process's driver JVM as a session builder would (``settings`` are the session's: master, memory,
    class path, Java options, as spark-submit takes them), its stderr copied to ours line by line except the
    incubator-module notice a user can do nothing about. Nothing when the process already has a JVM: the session
    started next reuses this one."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    read, write = os.pipe()  # not inheritable (PEP 446): only the JVM, given it as its stderr, holds the write end
    forwarder = threading.Thread(
        target=_copy_jvm_stderr, args=(read, os.dup(2)), name="lakejoin-jvm-stderr", daemon=True
    )
    forwarder.start()  # before the launch, so a JVM that fails at start-up with a lot to say never blocks on the pipe
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write})
    except BaseException:
        os.close(write)
        forwarder.join(timeout=5)  # the JVM's last lines come before lakejoin's error
        raise
    os.close(write)
    SparkContext._ensure_initialized(gateway=gateway)


def _copy_jvm_stderr(read: int, target: int) -> None:
    """Until the JVM exits; a terminal that went away stops the copying, never the draining (a JVM blocked on a full
    pipe would hang the driver)."""
    with os.fdopen(read, "rb") as jvm, os.fdopen(target, "wb") as out:
        copying = True
        for line in jvm:
            if copying and not line.startswith(INCUBATOR_NOTICE):
                try:
                    out.write(line)
                    out.flush()
                except OSError:
                    copying = False


def jvm_of(spark: SparkSession) -> JVMView:
    """The JVM's classes as the driver's session sees them: a classic session has them, a Spark Connect client not."""
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise LakejoinError("this needs a classic Spark session (its driver's JVM): a Spark Connect client has none")
    return jvm


def cloned_session(spark: SparkSession) -> SparkSession:
    """A session of the same application with ``spark``'s settings and listeners, for a command with settings of its
    own: an observation (``DataFrame.observe``) on one of ``spark``'s frames is told of that frame's runs in it too,
    which a new session's runs would not tell. ``spark``'s observation listener is made first, so the clone has it."""
    session = spark._jsparkSession
    session.observationManager()  # a lazy value: registered now, before the clone
    return SparkSession(spark.sparkContext, session.cloneSession())


def has_delta_classes(spark: SparkSession) -> bool:
    """Delta's classes load in the session's JVM. Spark's own class loader is asked, not the system one: it also sees
    jars added with ``spark.jars`` or ``spark.jars.packages`` (how ``configure_spark_with_delta_pip`` loads Delta)."""
    try:
        jvm_of(spark).org.apache.spark.util.Utils.classForName("io.delta.tables.DeltaTable", True, False)
    except Exception:  # noqa: BLE001 - py4j raises a generic error for a missing class
        return False
    return True


def delta_version(spark: SparkSession) -> str | None:
    """The version of the Delta the session's JVM loads, from its jar's manifest (the class's package, no call into
    Delta); None when Delta's classes do not load or their jar says no version."""
    try:
        delta = jvm_of(spark).org.apache.spark.util.Utils.classForName("io.delta.tables.DeltaTable", True, False)
    except Exception:  # noqa: BLE001 - py4j raises a generic error for a missing class
        return None
    version = delta.getPackage().getImplementationVersion()
    return None if version is None else str(version)


class JvmLog:
    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._jvm = jvm_of(spark)
        self._none = self._jvm.scala.Option.empty()

    def _log(self, table: str):  # noqa: ANN202 - a JVM org.apache.spark.sql.delta.DeltaLog
        if is_table_name(table):
            from delta.tables import DeltaTable

            return DeltaTable.forName(self.spark, table)._jdt.deltaLog()
        return self._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, table)

    def head(self, table: str) -> Head | None:
        if is_table_name(table) and not self.spark.catalog.tableExists(table):
            return None
        snapshot = self._log(table).update(False, self._none, self._none)
        if snapshot.version() < 0:
            return None
        return Head(int(snapshot.version()), str(snapshot.metadata().id()), snapshot)

    def schema(self, table: str, head: Head) -> StructType:
        return _schema(head.handle)

    builds_own_heads = False

    def committed(
        self, table: str, before: Head, version: int, metadata: str | None, rows: Callable[[], int] | None
    ) -> Head | None:
        """None: a head is a snapshot of Delta's, read from the log in milliseconds and without a Spark job."""
        return None

    def table_id(self, table: str, head: Head) -> str:
        return head.stamp

    def files(self, table: str, head: Head, version: int | None) -> Listed | None:
        """As the version's checksum lists them (Delta on Spark writes the list for tables of few files), where plain
        Parquet reads them: no partitions, column mapping or deletion vectors. Planning a Delta read of a new version
        instead reconstructs the table's state, Spark jobs over its log."""
        if is_table_name(table):
            return None
        log, snapshot = self._log(table), head.handle
        if version is not None and version != head.version:
            snapshot = log.getSnapshotAt(version, self._none, self._none, False)
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
        return Listed(
            [str(add.absolutePath(log).toString()) for add in adds], _schema(snapshot), [add.stats() for add in adds]
        )

    def rows_committed(self, table: str, head: Head) -> int | None:
        actions = self._log(table).getChanges(head.version, self._none, False).next()._2()
        for index in range(actions.size()):
            action = actions.apply(index)
            if action.getClass().getSimpleName() == "CommitInfo" and action.operationMetrics().isDefined():
                written = action.operationMetrics().get().get("numOutputRows")
                if written.isDefined():
                    return int(written.get())
        return None

    def recorded(self, table: str, head: Head, app_id: str, after: int | None = None) -> Recorded:
        """Looked for from the head's commit back (one commit file in the usual case), down to ``after``."""
        log = self._log(table)
        for version in range(head.version, -1 if after is None else after, -1):
            changes = log.getChanges(version, self._none, False)
            commit = changes.next() if changes.hasNext() else None
            if commit is None or commit._1() != version:  # this commit has left the log, and so have older ones
                break
            found = _commit_record(commit._2(), app_id)
            if found is not None:
                return found
        else:  # every commit down to ``after`` read
            if after is not None:
                return NOT_AFTER
        return Recorded(_txn_version(head.handle, app_id), in_commits=False)

    def source_snapshot(self, table: str, head: Head, version: int | None) -> tuple[int, Actions]:
        snapshot = (
            head.handle if version is None else self._log(table).getSnapshotAt(version, self._none, self._none, False)
        )
        # A snapshot's files are what it holds, each to be read: the state marks them dataChange = false, so that
        # is left out.
        files = DataFrame(snapshot.allFiles().toDF(), self.spark).select(
            "path", "partitionValues", "modificationTime", F.col("deletionVector").isNotNull().alias("deletionVector")
        )
        adds = [{"add": json.loads(add)} for add in files.toJSON().collect()]
        return int(snapshot.version()), [
            json.loads(snapshot.metadata().json()),
            json.loads(snapshot.protocol().json()),
            *adds,
        ]

    def source_commits(self, table: str, after: int) -> Iterator[tuple[int, Actions]]:
        try:
            changes = self._log(table).getChanges(after + 1, self._none, True)
            while changes.hasNext():
                pair = changes.next()
                actions = pair._2()
                yield int(pair._1()), [json.loads(actions.apply(i).json()) for i in range(actions.size())]
        except Py4JJavaError as exc:
            reason = str(exc.java_exception.toString()).splitlines()[0]
            raise LakejoinError(
                f"source table {table} no longer has the versions after {after} in its log ({reason})"
            ) from exc

    def checkpoint(self, table: str) -> None:
        """A path table's only: a catalog's table is checkpointed with its catalog entry, which Delta's own commits
        pass and this call would not, so Delta writes those at its interval."""
        if is_table_name(table):
            return
        log = self._log(table)
        try:
            log.checkpointAndCleanUpDeltaLog(log.update(False, self._none, self._none), self._none)
        except Py4JJavaError as exc:
            reason = str(exc.java_exception.toString()).splitlines()[0]
            raise LakejoinError(
                f"cannot write the checkpoint of {table} ({reason}); its data is unchanged: run maintain again"
            ) from exc

    def remove(self, path: str) -> None:
        hadoop_path = self._jvm.org.apache.hadoop.fs.Path(path)
        conf = self.spark.sparkContext._jsc.hadoopConfiguration()
        hadoop_path.getFileSystem(conf).delete(hadoop_path, True)
        self._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def _schema(snapshot) -> StructType:  # noqa: ANN001 - a JVM Snapshot
    return StructType.fromJson(json.loads(snapshot.schema().json()))


def _commit_record(actions, app_id: str) -> Recorded | None:  # noqa: ANN001 - a JVM Seq[Action]
    """What one commit records of ``app_id``: its marker (with the plan it carries), or its app transaction."""
    transaction = None
    for index in range(actions.size()):
        action = actions.apply(index)
        kind = action.getClass().getSimpleName()
        if kind == "CommitInfo" and action.userMetadata().isDefined():
            found = marked(action.userMetadata().get(), app_id)
            if found is not None:
                return found
        elif kind == "SetTransaction" and action.appId() == app_id:
            transaction = Recorded(int(action.version()), in_commits=True)
    return transaction


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


# An operation in these states runs no more, though the server keeps it until its client releases it or gives it up.
CONNECT_DONE = frozenset({"Finished", "Failed", "Canceled", "Closed"})


def connect_executions(spark: SparkSession) -> list[tuple[str, str, frozenset[str]]] | int:
    """What this process's Spark Connect server is running: each running operation's user, session and tags, or, when
    it holds none, the time (epoch milliseconds) its last one ended (pipelines/commands/server.py, which hosts the
    server, reads both)."""
    found = jvm_of(spark).org.apache.spark.sql.connect.service.SparkConnectService.listActiveExecutions()
    if found.isLeft():
        return int(found.left().get())
    held = found.right().get()
    executions = []
    for index in range(held.size()):
        info = held.apply(index)
        if str(info.status().toString()) not in CONNECT_DONE:
            tags = frozenset(filter(None, info.sparkSessionTags().mkString("\n").split("\n")))
            executions.append((info.userId(), info.sessionId(), tags))
    return executions


def interrupt_connect_tag(spark: SparkSession, user: str, session: str, tag: str) -> None:
    """Interrupt the operations of a Spark Connect session that carry ``tag`` (a client that died left them running)."""
    jvm = jvm_of(spark)
    service, none = jvm.org.apache.spark.sql.connect.service.SparkConnectService, jvm.scala.Option.empty()
    service.getOrCreateIsolatedSession(user, session, none).interruptTag(tag)
