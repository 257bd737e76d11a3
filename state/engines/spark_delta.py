"""Delta on Spark (``delta-spark``): used where the session has Delta (Databricks, clusters with the jars).

Same contract as the delta-rs engine. A write records its application transaction as a ``marker`` in its commit's
``userMetadata`` (writer option ``userMetadata``; for MERGE the session conf, on a session of the MERGE's own), and
lakejoin finds it by reading the newest commits. Delta's own app transaction (``txnAppId``/``txnVersion``) would
cost a reconstruction of the table's state per write: Delta 4.4 checks it that way (docs/design.md section 3.4). It
is written only where no kept commit records the app (a table's first write, or after its records left the log),
so the state holds the app's version where the commits no longer do.
Writes are Spark SQL and the DataFrame API (a MERGE is a ``MERGE INTO`` statement), so the engine runs in a classic
session and as a Spark Connect client alike; what it reads of a table's log goes through ``log_reader``.
A session that refuses settings (Databricks serverless, standard access mode: ``is_restricted``) cannot give a MERGE
its marker: there the marker goes in a commit of no rows just before the MERGE (``before_merge``), and that write is
done once a MERGE commit follows it (docs/design.md section 3.4).
A table is a path or, in a Unity Catalog warehouse, a three-part name (``main.lakejoin.gold_join_results``).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType
from pyspark.sql.window import Window

from state.engines.base import (
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
    marker,
    match_condition,
    no_change_feed,
    one_of,
)
from state.engines.delta_log import (
    USER_METADATA,
    DeltaLogReader,
    Head,
    Listed,
    greatest_after,
    is_connect,
    is_restricted,
    sql_name,
)
from state.errors import LakejoinError
from state.faults import reached
from state.frames import union_by_name
from state.layout import NEW_TABLE_LOG, is_table_name
from state.names import column

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
# _recording's names: a writer's options, and the session confs a MERGE takes them as.
WRITER_OPTIONS = {"app_id": "txnAppId", "version": "txnVersion", "marker": "userMetadata"}
SESSION_CONFS = {"app_id": TXN_APP_ID, "version": TXN_VERSION, "marker": USER_METADATA}
SORT_WITHIN_FILES = "spark.databricks.io.skipping.mdc.sortWithinFiles"
# The version of the last commit made on a session, which Delta sets on the session a commit ran on (``DeltaSQLConf``:
# documented, not internal; a conf read is no Spark job, over Spark Connect too).
LAST_COMMIT = "spark.databricks.delta.lastCommitVersionInSession"
ROWS = "_lakejoin_rows"  # what a write of a DataFrame observes of it (``_observing``)
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
# Tables must stay writable by delta-rs too (docs/design.md section 5): no deletion vectors, a property of each table
# the engine creates (a session's default would be a setting, which serverless refuses, and the caller's to keep).
NEW_TABLE = {"delta.enableDeletionVectors": "false"} | NEW_TABLE_LOG
# The settings one command may need: a session lent to it has each either set for it or unset.
COMMAND_CONFS = (TXN_APP_ID, TXN_VERSION, USER_METADATA, SORT_WITHIN_FILES, MATERIALIZE_SOURCE, LAST_COMMIT)
GLOBAL_VIEWS = "spark.sql.globalTempDatabase"
# The Delta line lakejoin is tested with (pyproject.toml's delta-spark pin): the one whose internals the JVM
# reader knows.
PINNED_DELTA = "4.4."
# Sessions for commands with settings of their own (a MERGE's app transaction is a session setting), so that commands
# on different tables run at once without seeing each other's settings: per session lakejoin computes with.
_POOLS: weakref.WeakKeyDictionary[SparkSession, queue.SimpleQueue[SparkSession]] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()
# Per session: held by a write that reads back the version it committed, and by every other commit lakejoin makes on
# the session meanwhile (``committing_on``).
_COMMIT_LOCKS: weakref.WeakKeyDictionary[SparkSession, threading.Lock] = weakref.WeakKeyDictionary()


def log_reader(spark: SparkSession) -> DeltaLogReader:
    """The session's reader of Delta logs: Delta's own log in the driver's JVM (milliseconds a look-up) only where
    lakejoin knows that Delta, a classic session off Databricks whose Delta is the line lakejoin pins; everywhere else
    (Spark Connect, a Databricks runtime, whose Delta is its own, another Delta) the public reader, SQL and reads by
    name (docs/design.md section 5). Each is imported only where it runs, so a Connect client needs no py4j."""
    from state.engines import on_databricks

    if not is_connect(spark) and not on_databricks():
        from state.engines.jvm import JvmLog, delta_version

        if (delta_version(spark) or "").startswith(PINNED_DELTA):
            return JvmLog(spark)
    from state.engines.public_log import PublicLog

    return PublicLog(spark)


class SparkDeltaEngine:
    name = "spark"
    driver_writes = False

    def __init__(self, spark: SparkSession, log: DeltaLogReader | None = None, restricted: bool | None = None) -> None:
        self.spark = spark
        self._log = log or log_reader(spark)
        self._sessions = _command_sessions(spark)
        # (table, column) -> (stamp, version, maximum): the last aggregate asked of each table. A snapshot never
        # changes, so asking again at the same version (each batch's plan, each ingest) needs no Spark job.
        self._maxima: dict[tuple[str, str], tuple[str, int, int | None]] = {}
        # table -> ((stamp, version, where), rows): the last rows read of each table (``rows``).
        self._rows: dict[str, tuple[tuple[str, int, str | None], pa.Table]] = {}
        self._restricted = (
            is_restricted(spark) if restricted is None else restricted
        )  # a test forces it in a classic session
        # Whether a write reads back the version it committed (``_commit``): where the reader builds a head from it,
        # and the session lets lakejoin clear the setting first.
        self._reports = self._log.builds_own_heads and not self._restricted
        # Each warehouse table's head as last seen within ``pinned``, kept up to date by the engine's own writes, and
        # kept after it for the next block told it may keep them.
        self._heads: dict[str, Head | None] = {}
        self._pins = 0
        self._heads_guard = threading.Lock()

    @contextmanager
    def pinned(self, kept: bool = False) -> Iterator[None]:
        """Within the block each warehouse table's latest commit is asked of its log once, then known from the
        engine's own writes: a step asked it ~12 times a table (on the public reader each a ``DESCRIBE HISTORY``, a
        Spark job). For a caller that holds the lock of what it writes and reads the rest at versions it planned;
        entering the outermost block (as on taking the lock) forgets what was seen before it unless it is ``kept``
        (nothing else took a lock since: state/log/lock.py ``Held.unchanged``), and a lock taken within it forgets
        what that lock's other holders write (``refresh``)."""
        with self._heads_guard:
            self._pins += 1
            if self._pins == 1 and not kept:
                self._heads.clear()
        try:
            yield
        finally:
            with self._heads_guard:
                self._pins -= 1

    def _head(self, path: str) -> Head | None:
        """The table's latest commit: within ``pinned``, as last seen."""
        with self._heads_guard:
            if self._pins and path in self._heads:
                return self._heads[path]
        return self._seen(path)

    def _seen(self, path: str) -> Head | None:
        """The table's latest commit asked of its log now (after a write of the engine's own), remembered."""
        head = self._log.head(path)
        with self._heads_guard:
            if self._pins:
                self._heads[path] = head
        return head

    @contextmanager
    def _committing(self, path: str) -> Iterator[None]:
        """A write whose commit the block does not look up (a MERGE, a compaction): the next look asks the log."""
        try:
            yield
        finally:
            with self._heads_guard:
                self._heads.pop(path, None)

    def _commit(self, session: SparkSession, write: Callable[[], None]) -> int | None:
        """Run ``write``, commits on ``session``, and return the version of its last commit as Delta reports it, where
        the engine reads it back (``_reports``); None elsewhere, or when it committed nothing. Other commits on the
        session are held off meanwhile: Delta reports the session's last commit, whoever made it."""
        if not self._reports:
            write()
            return None
        with committing_on(session):
            session.conf.unset(LAST_COMMIT)
            write()
            return _reported(session)

    def _learn(
        self, path: str, before: Head | None, version: int | None, metadata: str | None, rows: Callable[[], int] | None
    ) -> Head | None:
        """The head after a write of the engine's own that committed ``version`` on top of ``before``, kept for the
        next look, when the reader can build it without reading the log; None otherwise. No version reported is
        taken for a question, not for "nothing committed": the log answers it."""
        if version is None or before is None:
            return None
        known = self._log.committed(path, before, version, metadata, rows)
        if known is not None:
            with self._heads_guard:
                if self._pins:
                    self._heads[path] = known
        return known

    def version(self, path: str) -> int | None:
        head = self._head(path)
        return None if head is None else head.version

    def schema(self, path: str, version: int | None = None) -> StructType | None:
        if version is not None:  # a time-travel read plans from the log at that version; nothing runs
            frame = self.read(path, version)
            return None if frame is None else frame.schema
        head = self._head(path)
        return None if head is None else self._log.schema(path, head)

    def read(self, path: str, version: int | None = None, where: str | None = None) -> DataFrame | None:
        head = self._head(path)
        return None if head is None else self._read_at(path, head, version, where)

    def _read_at(self, path: str, head: Head, version: int | None, where: str | None) -> DataFrame:
        """The table at ``version``, else at ``head``: one snapshot, whatever commits came after the head was seen (a
        read through Delta by name would see the newest)."""
        at = head.version if version is None else version
        df = self._frame(path, at, None if where is not None else self._log.files(path, head, version))
        return df if where is None else df.where(where)

    def _frame(
        self, path: str, version: int | None, listed: Listed | None, files: list[str] | None = None
    ) -> DataFrame:
        """The table at ``version``: the listing's ``files`` (default: all of them) read as plain Parquet, or, without
        a listing, a read through Delta."""
        if listed is None:
            reader = self.spark.read.format("delta")
            if version is not None:
                reader = reader.option("versionAsOf", version)
            return reader.table(path) if is_table_name(path) else reader.load(path)
        chosen = listed.files if files is None else files
        return (
            self.spark.read.schema(listed.schema).parquet(*chosen)
            if chosen
            else self.spark.createDataFrame([], listed.schema)
        )

    def rows(self, path: str, version: int | None = None, where: str | None = None) -> pa.Table | None:
        """The rows of a snapshot, read again only when the snapshot or ``where`` is another than the last read of the
        table: a snapshot never changes, and the commands of one pipeline read some (its definition) at each call."""
        head = self._head(path)
        if head is None:
            return None
        snapshot = (head.stamp, head.version if version is None else version, where)
        with self._heads_guard:
            kept = self._rows.get(path)
        if kept is not None and kept[0] == snapshot:
            return kept[1]
        rows = self._read_at(path, head, version, where).toArrow()
        with self._heads_guard:
            self._rows[path] = (snapshot, rows)
        return rows

    def count(self, path: str, where: str | None = None) -> int | None:
        df = self.read(path, where=where)
        return None if df is None else df.count()

    def aggregate(self, path: str, where: str | None, *expressions: str) -> tuple | None:
        df = self.read(path, where=where)
        return None if df is None else tuple(df.selectExpr(*expressions).first())

    def head(self, path: str, limit: int) -> pa.Table | None:
        df = self.read(path)
        return None if df is None else df.limit(limit).toArrow()

    def lookup(self, path: str, column: str, values: Sequence[str], where: str | None = None) -> pa.Table | None:
        """The files the version's checksum lists whose statistics leave room for one of ``values``, read as plain
        Parquet (often none: no Spark job); a read through Delta (planning it rebuilds the table's state) otherwise."""
        head = self._head(path)
        if head is None:
            return None
        listed = self._log.files(path, head, None)
        if listed is None:
            return self.rows(path, where=one_of(column, values, where))
        candidates = listed.holding(column, values)
        if not candidates:
            return pa.Table.from_pylist([], arrow_schema(listed.schema))
        return self._frame(path, None, listed, candidates).where(one_of(column, values, where)).toArrow()

    def max_value(self, path: str, column: str, version: int | None = None) -> int | None:
        head = self._head(path)
        if head is None:
            return None
        at = (head.stamp, head.version if version is None else version)
        known = self._maxima.get((path, column))
        if known is not None and known[:2] == at:
            return known[2]
        from_stats = listed = None
        if (
            known is not None and known[0] == at[0] and known[1] < at[1]
        ):  # the commits since answer, in a table of any size
            since = itertools.takewhile(lambda commit: commit[0] <= at[1], self._log.source_commits(path, known[1]))
            with contextlib.suppress(LakejoinError):  # unless those commits have left the log
                from_stats = greatest_after(known[2], (actions for _, actions in since), column)
        if from_stats is None:  # the listed files' statistics answer when the checksum lists them and they say
            listed = self._log.files(path, head, version)
            from_stats = None if listed is None else listed.maximum(column)
        if from_stats is not None:
            maximum = from_stats[0]
        else:
            value = self._frame(path, at[1], listed).agg(F.max(column)).first()[0]
            maximum = None if value is None else int(value)
        self._maxima[(path, column)] = (*at, maximum)
        return maximum

    def _known_maxima(self, path: str, head: Head | None, columns: Sequence[str]) -> list[str]:
        """Which of ``columns`` have a maximum known at ``head``: a write of them carries it to its commit."""
        if head is None:
            return []
        return [
            name for name in columns if self._maxima.get((path, name), (None, None))[:2] == (head.stamp, head.version)
        ]

    def _found(self, df: Data, frame: DataFrame, carried: Sequence[str]) -> tuple[Callable[[], dict] | None, DataFrame]:
        """What an append of ``df`` (as ``frame``) finds of its rows, their count (``ROWS``) and the maxima of
        ``carried``, and the frame to write: from the rows on the driver, or observed as the write runs where the
        reader builds its head (its commit's row count) from them; nothing otherwise."""
        if isinstance(df, pa.Table):
            return partial(_found_in, df, carried), frame
        return _observing(frame, carried) if self._reports else (None, frame)

    def _carry_maxima(self, path: str, before: Head | None, after: Head, added: dict[str, int | None]) -> None:
        """The maxima known at ``before`` carried to ``after`` when it is the commit of rows whose maxima are ``added``
        on top of it: the next look at the logs, or at bronze's arrival places, costs no aggregate (on the public
        reader, a Spark job each)."""
        if before is None or after.version != before.version + 1:
            return
        for name, value in added.items():
            maximum = self._maxima[(path, name)][2]
            known = [int(number) for number in (maximum, value) if number is not None]
            self._maxima[(path, name)] = (after.stamp, after.version, max(known, default=None))

    def info(self, path: str, app_id: str, after: int | None = None) -> TableInfo | None:
        head = self._head(path)
        return (
            None
            if head is None
            else TableInfo(head.version, self._log.schema(path, head), self._log.recorded(path, head, app_id, after))
        )

    def txn_version(self, path: str, app_id: str) -> int | None:
        head = self._head(path)
        return None if head is None else self._log.recorded(path, head, app_id).version

    def _check(self, table: str, head: Head | None, commit: Commit | None) -> Recorded | None:
        """What ``table`` records of ``commit``'s app before a write; None without a commit, or without a table yet."""
        return None if commit is None or head is None else self._log.recorded(table, head, commit.app_id)

    def source_identity(self, table: str) -> tuple[str, int] | None:
        head = self._log.head(table)
        return None if head is None else (self._log.table_id(table, head), head.version)

    def source_snapshot(self, table: str, version: int | None = None) -> tuple[int, Actions] | None:
        head = self._log.head(table)
        return None if head is None else self._log.source_snapshot(table, head, version)

    def source_commits(self, table: str, after: int) -> Iterator[tuple[int, Actions]]:
        return self._log.source_commits(table, after)

    def source_schema(self, table: str, version: int | None = None) -> StructType | None:
        return self.schema(table, version)  # every read asks Delta's log for its latest state

    def source_files(self, table: str, stored: StructType, files: Sequence[tuple[int, str]]) -> DataFrame:
        """Read by name (Unity Catalog refuses a managed table's files by path) at the newest of the files' versions,
        for the files it still holds, and the others (an OPTIMIZE since took them out) each at its own version: a data
        file's rows are the same at every version that holds it. Each read is kept to its files by name."""
        by_version: dict[int, set[str]] = {}
        for version, path in files:
            by_version.setdefault(version, set()).add(path.rsplit("/", 1)[-1])
        if not by_version:
            return self.spark.createDataFrame([], stored)
        newest = max(by_version)
        if len(by_version) > 1:
            held = {path.rsplit("/", 1)[-1] for path in self._at_version(table, newest).inputFiles()}
            for version in [version for version in by_version if version != newest]:
                by_version[newest] |= by_version[version] & held
                by_version[version] -= held
        reads = []
        for version, names in sorted(by_version.items()):
            if not names:
                continue
            located = self._at_version(table, version).select(
                *[column(field.name) for field in stored.fields],
                F.col("_metadata.file_name").alias("_file_name"),
                F.col("_metadata.file_block_start").alias("_block"),
                F.monotonically_increasing_id().alias("_read"),
            )
            reads.append(located.where(F.col("_file_name").isin(sorted(names))))
        # A Delta read has no _metadata.row_index: a row's index in its file is its place in the file's read order, its
        # split's start first (a split reads its row groups in order; each row group belongs to one split)
        in_file = Window.partitionBy("_file_name").orderBy("_block", "_read")
        return union_by_name(reads).withColumn("_row_index", F.row_number().over(in_file) - 1).drop("_block", "_read")

    def _at_version(self, table: str, version: int) -> DataFrame:
        reader = self.spark.read.format("delta").option("versionAsOf", version)
        return reader.table(table) if is_table_name(table) else reader.load(table)

    def source_changes(self, table: str, first: int, last: int) -> DataFrame:
        reader = (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", first)
            .option("endingVersion", last)
        )
        changes = reader.table(table) if is_table_name(table) else reader.load(table)
        try:
            changes.schema  # noqa: B018 - analysed here: a table without the feed fails now, not in a later job
        except Exception as exc:  # noqa: BLE001 - Delta's analysis errors have many types
            raise no_change_feed(table, str(exc).strip().splitlines()[0]) from exc
        return changes

    def refresh(self, *paths: str) -> None:
        """This engine holds no table open; what ``pinned`` keeps of ``paths`` (every table when none) is forgotten."""
        with self._heads_guard:
            if not paths:
                self._heads.clear()
            for path in paths:
                self._heads.pop(path, None)

    def drop(self, path: str) -> None:
        with self._committing(path):
            if is_table_name(path):
                self.spark.sql(f"DROP TABLE IF EXISTS {path}")
            else:
                self._log.remove(path)

    def append(
        self, path: str, df: Data, *, commit: Commit | None = None, properties: dict[str, str] | None = None
    ) -> int | None:
        head = self._head(path)  # one look at the log: the transaction check and the version to compare
        recorded = self._check(path, head, commit)
        if commit is not None and recorded is not None and recorded.covers(commit):
            return None
        frame = as_frame(self.spark, df)
        creating = (
            NEW_TABLE | (properties or {}) if head is None else {}
        )  # a writer's ``delta.*`` options set a new table's properties
        if head is not None and isinstance(df, pa.Table) and df.num_rows == 0:
            recorded = None  # no rows: only an app transaction, an action of its own, makes Delta commit
        options = _recording(commit, recorded, WRITER_OPTIONS)
        carried = self._known_maxima(path, head, frame.columns)
        observed, written = self._found(df, frame, carried)
        with self._committing(path):
            version = self._commit(frame.sparkSession, partial(_append_creating, path, written, options, creating))
        rows = None if observed is None else lambda: observed()[ROWS]
        after = self._learn(path, head, version, options.get(WRITER_OPTIONS["marker"]), rows) or _present(
            path, self._seen(path)
        )
        if head is None or after.version != head.version:
            if observed is not None and (isinstance(df, pa.Table) or version is not None):  # a DataFrame's, if written
                self._carry_maxima(path, head, after, {name: observed()[name] for name in carried})
            if isinstance(df, pa.Table):
                return df.num_rows
            committed = self._log.rows_committed(path, after)
            return frame.count() if committed is None else committed  # metrics off: history.metricsEnabled=false
        if commit is None or recorded is None or not recorded.in_commits:  # Delta found its app transaction recorded
            return None
        # Delta commits nothing for a write of no rows, marker or not: record the batch by an app transaction,
        # an action of its own, so the table says it was written (gold is, every batch).
        with self._committing(path):
            _append_to(path, frame.limit(0), _recording(commit, None, WRITER_OPTIONS))
        return 0

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
        head = self._head(path)
        if head is None:
            written = self.append(path, df, commit=commit)
            return None if written is None else Merged(written, 0)
        counts = self._merge(
            path,
            head,
            df,
            commit,
            lambda source: merge_statement(sql_name(path), source, match_condition(key, aligned), evict, on_match),
        )
        return None if counts is None else Merged(int(counts["num_inserted_rows"]), int(counts["num_deleted_rows"]))

    def apply_changes(
        self, path: str, df: Data, *, keys: Sequence[str], retraction: str, commit: Commit | None = None
    ) -> int | None:
        condition, kept = changes_merge(keys, retraction)
        clauses = (
            f"WHEN MATCHED AND {retraction} THEN DELETE WHEN MATCHED AND {kept} THEN UPDATE SET * WHEN NOT MATCHED AND "
            f"{kept} THEN INSERT *"
        )
        counts = self._merge(
            path,
            self._head(path),
            df,
            commit,
            lambda source: (
                f"MERGE WITH SCHEMA EVOLUTION INTO {sql_name(path)} AS target USING {source} AS source ON "
                f"{condition} {clauses}"
            ),
        )
        if counts is None:
            return None
        changed = int(counts["num_affected_rows"])
        if changed == 0:  # a MERGE that changes nothing commits nothing: the write is recorded by a commit of no rows
            self.append(path, pa.Table.from_pylist([], arrow_schema(as_frame(self.spark, df).schema)), commit=commit)
        return changed

    def _written(self, path: str, recorded: Recorded | None, commit: Commit | None) -> bool:
        """Whether the table already has the MERGE ``commit``: its marker's commit, or, where the marker went in a
        commit before the MERGE (``before_merge``), a MERGE commit after that one."""
        if recorded is None or commit is None:
            return False
        return recorded.covers(commit) or (recorded.marks_merge_of(commit) and self._merged_after_marker(path, commit))

    def _merged_after_marker(self, path: str, commit: Commit) -> bool:
        """A MERGE committed after the newest commit of no rows that marks ``commit`` before its MERGE: one look at the
        table's history, made only when a batch is resumed."""
        prefix = marker(Commit(commit.app_id, commit.version), before_merge=True)[
            :-1
        ]  # the plan, when there is one, follows
        history = self.spark.sql(f"DESCRIBE HISTORY {sql_name(path)}")
        last = history.agg(
            F.max(F.when(F.col("userMetadata").startswith(prefix), F.col("version"))).alias("marked"),
            F.max(F.when(F.col("operation") == "MERGE", F.col("version"))).alias("merged"),
        ).first()
        return last["marked"] is not None and last["merged"] is not None and last["merged"] > last["marked"]

    def _merge(
        self, path: str, head: Head | None, df: Data, commit: Commit | None, statement: Callable[[str], str]
    ) -> Row | None:
        """Run the MERGE ``statement`` names for a source view of ``df`` on the table at ``head``, recording ``commit``:
        on a session of its own with the marker as its setting, or, where settings are refused, after a commit of no
        rows that carries it. Returns the MERGE's own counts (a MERGE that changes nothing commits nothing, so the
        history's latest entry would be an earlier commit's), None when the table has ``commit`` already; the head it
        made is learnt from the version its session reports."""
        recorded = self._check(path, head, commit)
        if self._written(path, recorded, commit):
            return None
        if self._restricted:
            with self._committing(path):
                return self._merge_after_marker(path, df, commit, recorded, statement)
        # A source built from rows on the driver is an immutable local relation: MERGE need not copy it first.
        confs = ({MATERIALIZE_SOURCE: "none"} if isinstance(df, pa.Table) else {}) | _recording(
            commit, recorded, SESSION_CONFS
        )
        view = f"lakejoin_merge_{uuid.uuid4().hex}"
        with self._committing(path), self._session(confs) as session:
            # The source is a view of the session the MERGE runs in: rows built there, or (a DataFrame of another
            # session) a global view, which every session of the application sees.
            if isinstance(df, pa.Table):
                as_frame(session, df).createOrReplaceTempView(view)
                source, drop = view, lambda: session.catalog.dropTempView(view)
            else:
                df.createOrReplaceGlobalTempView(view)
                source, drop = (
                    f"{self.spark.conf.get(GLOBAL_VIEWS, 'global_temp')}.{view}",
                    lambda: self.spark.catalog.dropGlobalTempView(view),
                )
            try:
                counts = session.sql(statement(source)).first()
                version = _reported(session) if self._reports else None
            finally:
                drop()
        self._learn(path, head, version, confs.get(USER_METADATA), None)
        return counts

    def _merge_after_marker(
        self, path: str, df: Data, commit: Commit | None, recorded: Recorded | None, statement: Callable[[str], str]
    ):  # noqa: ANN202 - a Row
        """The MERGE on a session that refuses settings: the marker first, in a commit of no rows with the table's own
        schema (unless a run this one resumes made it), then the MERGE, on the source's own session."""
        if commit is not None and not (recorded is not None and recorded.marks_merge_of(commit)):
            schema = self._log.schema(path, _present(path, self._head(path)))
            # Delta commits nothing for no rows without an app transaction of its own
            _append_to(
                path,
                self.spark.createDataFrame([], schema),
                _recording(commit, None, WRITER_OPTIONS, before_merge=True),
            )
        reached(f"marked:{path}")
        frame = as_frame(self.spark, df)
        session = frame.sparkSession
        view = f"lakejoin_merge_{uuid.uuid4().hex}"
        frame.createOrReplaceTempView(view)
        try:
            return session.sql(statement(view)).first()
        finally:
            session.catalog.dropTempView(view)

    def optimize(self, path: str, order_by: str | None = None) -> None:
        if self.version(path) is None:
            return
        with self._committing(path):
            if order_by is None:
                self.spark.sql(f"OPTIMIZE {sql_name(path)}").collect()
                return
            with self._session({SORT_WITHIN_FILES: "true"}) as session:  # Z-order alone only range-partitions
                session.sql(f"OPTIMIZE {sql_name(path)} ZORDER BY (`{order_by}`)").collect()

    def vacuum(self, path: str, retention_hours: int) -> None:
        if self.version(path) is not None:
            with self._committing(path):
                self.spark.sql(f"VACUUM {sql_name(path)} RETAIN {retention_hours} HOURS").collect()

    def checkpoint(self, path: str) -> None:
        if self.version(path) is not None:
            self._log.checkpoint(path)

    @contextmanager
    def _session(self, confs: dict[str, str]) -> Iterator[SparkSession]:
        """A session of the engine's own for one command, with ``confs`` set and the other command settings unset."""
        if self._restricted:  # no session of its own and no settings: a command runs without them (maintain's sort)
            yield self.spark
            return
        try:
            session = self._sessions.get_nowait()
        except queue.Empty:
            session = session_apart(self.spark)
        for name in COMMAND_CONFS:
            if name in confs:
                session.conf.set(name, confs[name])
            else:
                session.conf.unset(name)
        try:
            yield session
        finally:
            self._sessions.put(session)


@contextmanager
def committing_on(session: SparkSession) -> Iterator[None]:
    """Hold off lakejoin's other commits on ``session`` (another thread's write) while a write reads back the version
    it committed (``LAST_COMMIT``, the session's last commit, whoever made it). A lease is renewed on a session apart
    (``session_apart``), so a long write never holds off its renewal."""
    with _POOLS_LOCK:
        lock = _COMMIT_LOCKS.setdefault(session, threading.Lock())
    with lock:
        yield


def session_apart(spark: SparkSession) -> SparkSession:
    """A session of ``spark``'s application with its settings, whose commands and commits leave ``spark``'s alone (its
    settings, its last commit's version): ``spark`` itself where clones are refused (serverless, whose writes report
    no version anyway)."""
    if is_restricted(spark):
        return spark
    return spark.cloneSession() if is_connect(spark) else _cloned(spark)


def _reported(session: SparkSession) -> int | None:
    value = session.conf.get(LAST_COMMIT, None)
    return None if value is None else int(value)


def _append_creating(path: str, written: DataFrame, options: dict[str, str], creating: dict[str, str]) -> None:
    """Append ``written`` with writer ``options``, making the table with ``creating``'s properties when they are given.
    A write that creates a catalog table runs as CREATE TABLE AS SELECT, which reports none of the metrics observed on
    the rows (ingest counts its rows that way): that table is made empty first, then appended to."""
    if creating and is_table_name(path):
        _append_to(path, written.sparkSession.createDataFrame([], written.schema), creating)
        creating = {}
    _append_to(path, written, options | creating)


def _found_in(rows: pa.Table, columns: Sequence[str]) -> dict:
    """What ``_observing`` finds of a DataFrame, of rows on the driver."""
    return {ROWS: rows.num_rows, **{name: pc.max(rows[name]).as_py() for name in columns}}


def _observing(frame: DataFrame, columns: Sequence[str]) -> tuple[Callable[[], dict], DataFrame]:
    """``frame`` counting its rows (``ROWS``) and taking the maxima of ``columns`` as a write of it runs (no job of its
    own), and what it found, by name: to be asked only once a write of it ran (Spark waits for it until then)."""
    observation = Observation()
    metrics = [
        F.count(F.lit(1)).alias(ROWS),
        *(F.max(column(name)).alias(f"max_{index}") for index, name in enumerate(columns)),
    ]

    def found() -> dict:
        got = observation.get
        return {ROWS: int(got[ROWS]), **{name: got[f"max_{index}"] for index, name in enumerate(columns)}}

    return found, frame.observe(observation, *metrics)


def _cloned(spark: SparkSession) -> SparkSession:
    from state.engines.jvm import cloned_session

    return cloned_session(spark)


def _command_sessions(spark: SparkSession) -> queue.SimpleQueue[SparkSession]:
    """The sessions ``spark``'s engines lend their commands (every engine on one session shares them, so a pipeline
    opening an engine per call does not start new ones): one per command under way, kept for the next."""
    with _POOLS_LOCK:
        return _POOLS.setdefault(spark, queue.SimpleQueue())


def merge_statement(
    target: str, source: str, condition: str, evict: Memberships | None, on_match: OnMatch | None
) -> str:
    """The ``MERGE INTO`` of ``source`` into ``target``: new rows inserted (columns the target lacks added), rows the
    source names again updated or deleted (``on_match``), rows it does not name deleted or cleared (``evict``)."""
    clauses = []
    if on_match is not None and on_match.replace:
        clauses.append("WHEN MATCHED THEN UPDATE SET *")
    elif on_match is not None and (on_match.delete or on_match.when is not None):
        when = "" if on_match.condition is None else f" AND {on_match.condition}"
        action = "DELETE" if on_match.delete else "UPDATE SET " + _assignments(on_match.updates(evict))
        clauses.append(f"WHEN MATCHED{when} THEN {action}")
    clauses.append("WHEN NOT MATCHED THEN INSERT *")
    if evict is not None and (gone := evict.gone("target")) is not None:
        clauses.append(f"WHEN NOT MATCHED BY SOURCE AND {gone} THEN DELETE")
    if evict is not None and (leaving := evict.leaving("target")) is not None:
        clauses.append(
            f"WHEN NOT MATCHED BY SOURCE AND ({leaving}) THEN UPDATE SET " + _assignments(evict.cleared("target"))
        )
    return f"MERGE WITH SCHEMA EVOLUTION INTO {target} AS target USING {source} AS source ON {condition} " + " ".join(
        clauses
    )


def _assignments(updates: dict[str, str]) -> str:
    return ", ".join(f"target.`{name}` = {value}" for name, value in updates.items())


def arrow_schema(schema: StructType) -> pa.Schema:
    """``schema`` in Arrow, timestamps in UTC. pyspark's converter is internal and changed within 4.1: 4.1.0 (the
    client of Databricks Connect 18, serverless environment 5) takes the zone as ``timezone`` and fails without it;
    4.1.4 takes ``timestamp_utc``, UTC by default."""
    try:
        return to_arrow_schema(schema, timezone="UTC")  # pyspark 4.1.0
    except TypeError:
        return to_arrow_schema(schema)


def _append_to(table: str, frame: DataFrame, options: dict[str, str]) -> None:
    writer = frame.write.format("delta").mode("append").option("mergeSchema", "true").options(**options)
    if is_table_name(table):
        writer.saveAsTable(table)
    else:
        writer.save(table)


def _recording(
    commit: Commit | None, recorded: Recorded | None, names: dict[str, str], before_merge: bool = False
) -> dict[str, str]:
    """The writer options (or session confs) that record ``commit``, named by ``names``: always its marker, and Delta's
    app transaction too where no kept commit records the app (see the module's docstring)."""
    if commit is None:
        return {}
    settings = {names["marker"]: marker(commit, before_merge)}
    if recorded is None or not recorded.in_commits:
        settings |= {names["app_id"]: commit.app_id, names["version"]: str(commit.version)}
    return settings


def _present(path: str, head: Head | None) -> Head:
    """The latest commit of a table lakejoin has just written, or is about to MERGE into: gone only when something
    else dropped it meanwhile."""
    if head is None:
        raise LakejoinError(f"{path} was dropped while lakejoin wrote it: something else is changing this warehouse")
    return head
