"""What the Delta-on-Spark engine reads of a table's log, and the two ways it reads it.

The engine's writes and data reads are Spark SQL and the DataFrame API, which every session has. Its look-ups in a
table's log (the latest version, the schema, which commit recorded an app's write, a source table's commits) have two
readers behind one interface:

- ``jvm.JvmLog``, in a classic session off Databricks whose Delta is the line lakejoin pins: Delta's own log in the
  driver's JVM, in milliseconds and without Spark jobs. It is the one place lakejoin reaches into the JVM.
- ``public_log.PublicLog`` everywhere else (Spark Connect, a Databricks runtime, another Delta): ``DESCRIBE HISTORY``,
  ``DESCRIBE DETAIL`` and reads by name, what Delta and Unity Catalog promise; no table's files are read by path.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from state.engines.base import Actions, Recorded
from state.layout import is_table_name


@dataclass(frozen=True)
class Head:
    """A table's latest commit as one read of its log found it."""

    version: int
    stamp: str  # with the version, tells this commit from one of a table recreated at the same path (``reset``)
    handle: Any = None  # what the reader needs to answer more about this version (a JVM snapshot), or None


@dataclass(frozen=True)
class Listed:
    """A version's data files as its checksum lists them, each with its statistics (Delta's JSON, or None)."""

    files: list[str]
    schema: StructType
    stats: list[str | None]

    def maximum(self, column: str) -> tuple[int | None] | None:
        """The greatest value of a number column, from the files' statistics alone (as a 1-tuple: None when every value
        is null); None when some file's statistics do not say, and a Spark job must find it."""
        return greatest(self.stats, column)

    def holding(self, column: str, values: Sequence[str]) -> list[str]:
        """The files whose statistics leave room for one of ``values`` in a text column. Delta keeps a prefix of a
        text's minimum and maximum (and may end a cut maximum with a high character): a value below the kept minimum,
        or whose prefix of the kept maximum's length sorts above it, is not in the file."""
        found = []
        for path, text in zip(self.files, self.stats):
            stats = json.loads(text) if text else {}
            low, high = stats.get("minValues", {}).get(column), stats.get("maxValues", {}).get(column)
            if "numRecords" in stats and stats.get("nullCount", {}).get(column) == stats["numRecords"]:
                continue  # only nulls
            if low is None or high is None or any(low <= value and value[: len(high)] <= high for value in values):
                found.append(path)
        return found


def greatest(file_stats: Iterable[str | None], column: str) -> tuple[int | None] | None:
    """The greatest value of a number column in files of these statistics (Delta's JSON), as a 1-tuple (None when
    every value is null); None when some file's statistics do not say."""
    found = []
    for text in file_stats:
        stats = json.loads(text) if text else {}
        if column in stats.get("maxValues", {}):
            found.append(int(stats["maxValues"][column]))
        elif "numRecords" not in stats or stats.get("nullCount", {}).get(column) != stats["numRecords"]:
            return None
    return (max(found, default=None),)


def greatest_after(before: int | None, commits: Iterable[Actions], column: str) -> tuple[int | None] | None:
    """The greatest value of a number column after ``commits``, given the one before: the files they add can only
    raise it. None when a commit deletes rows (the greatest may be gone) or an added file's statistics do not say;
    a compaction's removes change no data and keep it."""
    added = []
    for actions in commits:
        for action in actions:
            if "remove" in action and action["remove"].get("dataChange", True):
                return None
            if "add" in action:
                added.append(action["add"].get("stats"))
    found = greatest(added, column)
    if found is None:
        return None
    return (max((value for value in (before, found[0]) if value is not None), default=None),)


class DeltaLogReader(Protocol):
    def head(self, table: str) -> Head | None:
        """The table's latest commit; None when there is no Delta table."""

    def schema(self, table: str, head: Head) -> StructType: ...

    def files(self, table: str, head: Head, version: int | None) -> Listed | None:
        """The data files of ``version`` (default: the head's), its schema and the files' statistics, when they can be
        read as plain Parquet without planning a Delta read; None when the engine must read through Delta."""

    def rows_committed(self, table: str, head: Head) -> int | None:
        """The rows the append that made ``head`` committed, from the commit's metrics; None without them."""

    # Whether ``committed`` can build a head from what a commit reports: the engine reads the version back from the
    # session only for a reader that uses it.
    builds_own_heads: bool

    def committed(
        self, table: str, before: Head, version: int, metadata: str | None, rows: Callable[[], int] | None
    ) -> Head | None:
        """The head after the engine's own commit of ``version`` (carrying ``metadata``, ``rows`` rows for an append)
        on top of ``before``, without reading the log; None when the log must be read (another commit came between)."""

    def recorded(self, table: str, head: Head, app_id: str, after: int | None = None) -> Recorded:
        """The newest commit's record of ``app_id`` (its marker, with the plan it carries, or an app transaction);
        else, once the commits the log keeps are read, the state's app transaction. With ``after``, only the commits
        after that version are read, and none of them recording the app is ``NOT_AFTER``."""

    def table_id(self, table: str, head: Head) -> str:
        """The table's Delta id (its metadata's), which a source table's ingests record."""

    def source_snapshot(self, table: str, head: Head, version: int | None) -> tuple[int, Actions]: ...

    def source_commits(self, table: str, after: int) -> Iterator[tuple[int, Actions]]: ...

    def remove(self, path: str) -> None:
        """Delete a path table's folder, so that a table created there again starts at version 0."""

    def checkpoint(self, table: str) -> None:
        """Write the table's checkpoint at its latest version and clean up its expired log entries, where the reader
        can."""


def is_connect(spark: SparkSession) -> bool:
    """A Spark Connect client session: no JVM on this side."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


# The setting a MERGE's marker needs (state/engines/spark_delta.py): what a restricted session refuses first.
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_RESTRICTED: weakref.WeakKeyDictionary[SparkSession, bool] = weakref.WeakKeyDictionary()
_RESTRICTED_LOCK = threading.Lock()


def is_restricted(spark: SparkSession) -> bool:
    """A session that refuses what Databricks serverless and standard access mode refuse: most Spark settings, a
    clone of the session, caching. Asked once per session, of a Connect session only (a classic one has a JVM of
    its own, where nothing is refused): can a clone of it take the setting a MERGE's marker needs?"""
    if not is_connect(spark):
        return False
    with _RESTRICTED_LOCK:
        known = _RESTRICTED.get(spark)
        if known is None:
            try:
                spark.cloneSession().conf.set(USER_METADATA, "")
                known = False
            except Exception:  # noqa: BLE001 - serverless refuses with errors of several types; any refusal counts
                known = True
            _RESTRICTED[spark] = known
        return known


def sql_name(table: str) -> str:
    """``table`` in SQL: a catalog name as it is, a path as ``delta.`path```."""
    return table if is_table_name(table) else "delta.`" + table.replace("`", "``") + "`"


def data_file(root: str, path: str) -> str:
    """A data file named in a Delta log (relative or an absolute URI, percent-encoded either way) as Spark reads it."""
    return unquote(path) if urlparse(path).scheme else f"{root.rstrip('/')}/{unquote(path)}"
