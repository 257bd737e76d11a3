"""The contract both Delta engines honour; tests/test_engines.py checks it for each."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from state.errors import LakejoinError
from state.names import literal

# One commit of a table's Delta log: its actions as the log spells them ({"add": {...}}, {"commitInfo": {...}}).
Actions: TypeAlias = list[dict[str, Any]]

# What an engine commits: a Spark DataFrame, or rows already on the driver as Arrow (small deltas,
# log rows), which the delta-rs engine writes as they are instead of a round trip through the JVM.
Data: TypeAlias = DataFrame | pa.Table


@dataclass(frozen=True)
class Commit:
    """A Delta application transaction: the write of ``version`` (a batch id) by ``app_id``.

    A table that already records ``version`` (or a later one) for ``app_id`` has had this write,
    so the engine skips it: that is what makes a replayed batch idempotent (docs/design.md section 3).
    ``plan`` is the batch's plan (state/log/batch_log.py), which every write of a batch carries in its commit, so that a
    batch that died after any of its writes is resumed with the plan it was computed from.
    """

    app_id: str
    version: int
    plan: str | None = None


@dataclass(frozen=True)
class Eviction:
    """Target rows whose ``column`` is below ``below`` leave the table in the MERGE that inserts new rows."""

    column: str
    below: int

    def sql(self, alias: str | None = None) -> str:
        column = self.column if alias is None else f"{alias}.{self.column}"
        return f"{column} < {self.below}"


@dataclass(frozen=True)
class Memberships:
    """Where a state table's rows stand after a batch: per buffer, the boolean column saying a row is in it and the
    cutoff below which rows leave it (None: they never do). A buffer holds exactly its rows at or above its cutoff
    (cutoffs only move up). A row in no buffer stays in the table until it is below ``held_until`` too (its relation's
    watermark: till then a copy of it may still arrive on time, and is known as one by the row), then the MERGE
    deletes it; a row leaving some buffers has their columns cleared."""

    cutoffs: dict[str, Eviction | None]  # membership column -> cutoff
    held_until: Eviction | None = None  # None: rows in no buffer stay (their relation has no watermark)

    def gone(self, alias: str | None = None) -> str | None:
        """Rows the table no longer keeps: below every cutoff and below ``held_until`` (none while some buffer keeps
        everything, or without ``held_until``)."""
        lowest = self.lowest()
        if lowest is None or self.held_until is None:
            return None
        return f"({lowest.sql(alias)}) AND ({self.held_until.sql(alias)})"

    def leaving(self, alias: str | None = None) -> str | None:
        """Rows that leave some buffer they are in (their column still set, now below its cutoff); None when no buffer
        has a cutoff."""
        parts = [f"({_column(column, alias)} AND {cut.sql(alias)})" for column, cut in self._clearing().items()]
        return " OR ".join(parts) or None

    def cleared(self, alias: str | None = None) -> dict[str, str]:
        """The update of a row that stays: each buffer's column, unset where the row is now below its cutoff."""
        return {
            column: f"{_column(column, alias)} AND NOT ({cut.sql(alias)})" for column, cut in self._clearing().items()
        }

    def lowest(self) -> Eviction | None:
        """The cutoff below which no buffer keeps a row (None while some buffer keeps everything)."""
        cuts = self._clearing().values()
        if not cuts or len(cuts) < len(self.cutoffs):
            return None
        return min(cuts, key=lambda cut: cut.below)

    def _clearing(self) -> dict[str, Eviction]:
        """The buffers a row can leave: those with a cutoff."""
        return {column: cut for column, cut in self.cutoffs.items() if cut is not None}


def _column(name: str, alias: str | None) -> str:
    return f"`{name}`" if alias is None else f"{alias}.`{name}`"


@dataclass(frozen=True)
class OnMatch:
    """What a MERGE does to a stored row whose key a source row names again (a batch's arrivals never do: ingest
    gives each record a new id), where that source row's ``when`` column is true (any such row when None): set
    the stored row's ``when`` column true (an outer join's ``_matched``), delete the stored row (an as-of join's
    superseded record), or replace it whole (a change feed's new version, state/join/changes.py)."""

    when: str | None
    delete: bool = False
    replace: bool = False  # the source row is the record's new version (a change feed's): it replaces the stored row

    @property
    def condition(self) -> str | None:
        return None if self.when is None else f"source.`{self.when}`"

    def updates(self, evict: Memberships | None) -> dict[str, str]:
        """The update of a stored row the source names: ``when`` set, and, since the row is matched (so no
        not-matched-by-source clause reaches it), the columns of the buffers it leaves cleared."""
        matched = {} if self.when is None else {self.when: "true"}
        return matched | ({} if evict is None else evict.cleared("target"))


@dataclass(frozen=True)
class Recorded:
    """The last version of an app a table records, the plan that commit carries (``Commit.plan``), and whether a commit
    the log keeps says so (else the table's state, which keeps versions but no plans)."""

    version: int | None
    in_commits: bool
    plan: str | None = None
    # Written before a MERGE that could not carry it (a session that refuses settings: ``marker``): the write it
    # records is done only if a MERGE commit follows it, which the engine that wrote it checks.
    before_merge: bool = False
    # No commit the log keeps records the app, and the log has lost its oldest commits: a reader that may not read the
    # table's state (state/engines/public_log.py) cannot tell, and the batch log is the record (state/log/checks.py). A
    # write then carries Delta's own app transaction, which Delta checks.
    unknown: bool = False

    def covers(self, commit: Commit) -> bool:
        return not self.before_merge and covers(self.version, commit)

    def marks_merge_of(self, commit: Commit) -> bool:
        """A marker of ``commit`` (or a later write) made before its MERGE, which may or may not have followed."""
        return self.before_merge and covers(self.version, commit)


# What a search bounded below (``after``) finds when no commit after the bound records the app.
NOT_AFTER = Recorded(None, in_commits=False)


@dataclass(frozen=True)
class TableInfo:
    """What the consistency check needs of a table, from one read of its log."""

    version: int
    schema: StructType
    recorded: Recorded  # what the asked-about app id last committed

    @property
    def txn_version(self) -> int | None:
        return self.recorded.version


@dataclass(frozen=True)
class Merged:
    inserted: int
    evicted: int  # rows deleted: in no buffer any more


class DeltaReader(Protocol):
    """What reads a warehouse without computing in Spark: logs, schemas, counts and small slices to the driver, the
    user's source tables, and dropping tables. ``status``, ``show`` and ``reset`` need nothing more, so on a local
    warehouse they run on delta-rs alone and start no JVM."""

    name: str

    def version(self, path: str) -> int | None:
        """The table's latest version, or None when there is no Delta table at ``path``."""
        ...

    def schema(self, path: str, version: int | None = None) -> StructType | None:
        """The table's schema at ``version`` (latest when None), from its log alone (no data file is listed or
        opened); None when absent."""
        ...

    def rows(self, path: str, version: int | None = None, where: str | None = None) -> pa.Table | None:
        """``read`` straight to the driver as Arrow, for small slices (a batch's arrivals, log rows): no Spark
        job where the engine can avoid one. None when the table does not exist."""
        ...

    def lookup(self, path: str, column: str, values: Sequence[str], where: str | None = None) -> pa.Table | None:
        """The rows whose text ``column`` holds one of ``values`` (and that ``where`` keeps), as Arrow: a look-up by key
        in a log table, which reads only the files whose statistics leave room for one of them. None when the table
        does not exist."""
        ...

    def max_value(self, path: str, column: str, version: int | None = None) -> int | None:
        """The largest value of an integer column at ``version`` (latest when None); None if empty or absent."""
        ...

    def count(self, path: str, where: str | None = None) -> int | None:
        """The rows of the latest snapshot (those ``where``, a SQL predicate, selects); None when absent."""
        ...

    def aggregate(self, path: str, where: str | None, *expressions: str) -> tuple | None:
        """SQL aggregates (``count(*)``, ``min(_ts)``) over the latest snapshot's rows ``where`` selects, as one
        tuple; None when absent."""
        ...

    def head(self, path: str, limit: int) -> pa.Table | None:
        """Up to ``limit`` rows of the latest snapshot, on the driver as Arrow; None when absent."""
        ...

    def txn_version(self, path: str, app_id: str) -> int | None:
        """The last version ``app_id`` committed to the table (the newest commit the log keeps that records it,
        by ``marker`` or app transaction; else the state's app transaction); None when it never did or there is no
        table."""
        ...

    def info(self, path: str, app_id: str, after: int | None = None) -> TableInfo | None:
        """``version``, ``schema`` and what ``app_id`` last committed (its version and plan) together; None when there
        is no table. ``after``: a version below every commit of the app that matters to the caller (the version a logged
        batch read): only the commits after it are searched, and none there records nothing (version None)."""
        ...

    def source_identity(self, table: str) -> tuple[str, int] | None:
        """The table's identity (its metadata id: a table dropped and created again at one path has another) and its
        latest version, read from its log now (the user may replace it at any time); None when there is no table."""
        ...

    def source_schema(self, table: str, version: int | None = None) -> StructType | None:
        """``schema`` of the user's table, read from its log now (never from a table held open); None when absent."""
        ...

    def source_snapshot(self, table: str, version: int | None = None) -> tuple[int, Actions] | None:
        """The table at ``version`` (latest when None) and the actions that rebuild it: its ``metaData``, its
        ``protocol`` and one ``add`` per data file (``path``, ``partitionValues`` and ``modificationTime`` as the log
        has them). None when there is no table."""
        ...

    def source_commits(self, table: str, after: int) -> Iterator[tuple[int, Actions]]:
        """Each version of the table after ``after``, in order, with its actions. Raises ``LakejoinError`` when
        the log no longer holds one of them (cleaned up after its retention)."""
        ...

    def append(
        self, path: str, df: Data, *, commit: Commit | None = None, properties: dict[str, str] | None = None
    ) -> int | None:
        """Append ``df``, creating the table (with the Delta table ``properties`` given) or adding new columns as
        needed. A reader appends rows already on the driver (Arrow); an engine also a Spark DataFrame.

        Returns the rows written, or None when the table already records ``commit`` (nothing written).
        """
        ...

    def pinned(self, kept: bool = False) -> AbstractContextManager[None]:
        """A block within which a table's latest commit, once looked up, is known until the engine's own write moves it
        (or ``refresh`` forgets it): for a step that holds the lock of every table it writes and reads the others at
        versions it planned. Entering the outermost block forgets every table unless what was known is ``kept`` (no
        lakejoin writer took a lock since it was seen); a block within it, nothing."""
        ...

    def refresh(self, *paths: str) -> None:
        """Forget the tables ``paths`` (every one when none) held open or seen, so the next use reads their logs again:
        a run starts with it, since between two runs another process may have dropped a table and created it again
        (``reset``), and a lock taken within a run forgets what that lock's other holders write."""
        ...

    def drop(self, path: str) -> None:
        """Delete the table, data files and log (nothing happens when there is none)."""
        ...


class DeltaEngine(DeltaReader, Protocol):
    """Reads Delta snapshots into Spark and commits Spark DataFrames to Delta."""

    spark: SparkSession
    # True when every write passes through the driver (delta-rs writes Arrow from Python): data written is
    # brought there whatever its size. False when the engine writes a DataFrame where Spark computes it.
    driver_writes: bool

    def read(self, path: str, version: int | None = None, where: str | None = None) -> DataFrame | None:
        """The snapshot at ``version`` (latest when None), or None when the table does not exist.

        ``where`` is a SQL predicate on the table's columns: rows are filtered by it, and files whose
        statistics rule it out are not read at all (data skipping).
        """
        ...

    def apply_changes(
        self, path: str, df: Data, *, keys: Sequence[str], retraction: str, commit: Commit | None = None
    ) -> int | None:
        """One MERGE on ``keys`` (one commit): a row of ``df`` for which ``retraction`` (a SQL predicate on ``source``)
        holds deletes the row it names; any other replaces it, or is inserted. The table must exist.

        Returns the rows deleted, replaced or inserted, or None when the table already records ``commit``.
        """
        ...

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
        """One MERGE: insert the rows of ``df`` whose ``key`` is not in the table yet, and, among the table's rows
        ``df`` does not name, delete those ``evict`` keeps no more and clear the membership columns of the
        buffers the others leave. Creates the table if needed.
        ``on_match`` says what a row of ``df`` whose key the table holds does to the table's row.
        ``aligned``: matches are looked for only within the range ``df`` spans of a column equal keys share, so the
        target scan skips the rest (see ``match_condition``).

        Returns what it inserted and evicted, or None when the table already records ``commit``.
        """
        ...

    def source_files(self, table: str, stored: StructType, files: Sequence[tuple[int, str]]) -> DataFrame:
        """The rows of the user's table in ``files`` (each a data file as the table's log names it, with a version that
        holds it), in the columns ``stored``, each with its ``_file_name`` and ``_row_index``: what finds a row
        again."""
        ...

    def source_changes(self, table: str, first: int, last: int) -> DataFrame:
        """The Change Data Feed of the user's table from version ``first`` to ``last``: its rows with ``_change_type``
        (insert, update_preimage, update_postimage, delete) and ``_commit_version``. Raises ``LakejoinError`` when
        the table does not record its changes for those versions."""
        ...

    def optimize(self, path: str, order_by: str | None = None) -> None:
        """Compact small files; with ``order_by``, rewrite them sorted on it so file statistics stay tight."""
        ...

    def vacuum(self, path: str, retention_hours: int) -> None:
        """Delete data files no version younger than ``retention_hours`` needs (time travel stays possible within
        it)."""
        ...

    def checkpoint(self, path: str) -> None:
        """Write the table's checkpoint at its latest version and drop the log entries older than the table's log
        retention, so that opening it replays few commits. Delta on Spark over Spark Connect, and a catalog's table,
        nothing: there Delta writes one itself every ``delta.checkpointInterval`` commits."""
        ...


def as_frame(spark: SparkSession, data: Data) -> DataFrame:
    """``data`` as a DataFrame of ``spark``: an Arrow table's rows, with its schema even when it holds none (a Spark
    Connect session cannot infer a schema from no rows)."""
    if isinstance(data, DataFrame):
        return data
    if data.num_rows:
        return spark.createDataFrame(data)
    # a naive timestamp stays a TIMESTAMP: pyspark 4.1.0 (Databricks Connect 18's) would make it TIMESTAMP_NTZ
    return spark.createDataFrame([], from_arrow_schema(data.schema, prefer_timestamp_ntz=False))


@dataclass(frozen=True)
class Aligned:
    """A column that rows with equal keys share (a record's ``_ts``), and the range a MERGE's source rows span of it."""

    column: str
    low: int
    high: int


def one_of(column: str, values: Sequence[str], where: str | None = None) -> str:
    """Spark SQL (and DataFusion) for: ``column`` holds one of ``values``, and ``where`` holds."""
    found = f"{column} IN ({', '.join(literal(value) for value in sorted(set(values)))})"
    return found if where is None else f"({where}) AND {found}"


def match_condition(key: str, aligned: Aligned | None = None) -> str:
    """The MERGE's match: equal ``key`` — and, with ``aligned``, the target's value of that column within the
    source's range, which loses no match because equal keys have equal values there, and lets the MERGE skip the
    target's files outside it."""
    condition = f"target.`{key}` = source.`{key}`"
    if aligned is None:
        return condition
    return f"{condition} AND target.`{aligned.column}` >= {aligned.low} AND target.`{aligned.column}` <= {aligned.high}"


CHANGE_FEED = "delta.enableChangeDataFeed"


def no_change_feed(table: str, reason: str) -> LakejoinError:
    """The refusal of a change feed the table does not record."""
    return LakejoinError(
        f"source table {table} has no Change Data Feed for the versions lakejoin reads ({reason}): turn it on with "
        f"ALTER TABLE {table} SET TBLPROPERTIES ({CHANGE_FEED} = true), then join it from a version after that in a "
        "new warehouse"
    )


def changes_merge(keys: Sequence[str], retraction: str) -> tuple[str, str]:
    """``apply_changes``'s match condition, and the condition of a source row that is no retraction."""
    return " AND ".join(f"target.`{key}` = source.`{key}`" for key in keys), f"NOT ({retraction})"


def marker(commit: Commit, before_merge: bool = False) -> str:
    """The ``userMetadata`` of the commit that writes ``commit``: it records the write where Delta's own app transaction
    would cost too much (Delta on Spark checks one by reconstructing the table's state: docs/design.md section 3.4),
    and either engine finds it (``marked``) in the commits the log keeps; with the batch's plan when the write has one.
    ``before_merge``: the commit of no rows a session that refuses settings makes before a MERGE, which cannot carry
    a marker there (``Recorded.before_merge``). The plan comes last, so a marker without it is a prefix of one with
    it."""
    recorded = {"txn": {"appId": commit.app_id, "version": commit.version}} | (
        {"beforeMerge": True} if before_merge else {}
    )
    return json.dumps(recorded | ({} if commit.plan is None else {"plan": commit.plan}), separators=(",", ":"))


def marked(user_metadata: object, app_id: str) -> Recorded | None:
    """What a commit's ``userMetadata`` records of ``app_id``: its version and plan; None for another app's, or a
    user's text."""
    if not isinstance(user_metadata, str):
        return None
    try:
        found = json.loads(user_metadata)  # anything but lakejoin's text fails here
        if found["txn"]["appId"] != app_id:
            return None
        return Recorded(
            int(found["txn"]["version"]), True, found.get("plan"), before_merge=found.get("beforeMerge") is True
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def covers(recorded: int | None, commit: Commit) -> bool:
    """A table whose last version of ``commit.app_id`` is ``recorded`` already has the write ``commit``."""
    return recorded is not None and recorded >= commit.version


def applied(engine: DeltaEngine, path: str, commit: Commit | None) -> bool:
    """True when the table already records ``commit`` (or a later version of its app id): skip the write."""
    return commit is not None and covers(engine.txn_version(path, commit.app_id), commit)
