"""A Spark Connect client that refuses what Databricks serverless refuses, so lakejoin's Connect path can be run as it
would be there: every Spark setting but the six serverless lets a session set, caching and checkpointing a DataFrame,
cloning the session, global temporary views, and any read or write by path of a catalog's managed storage (Unity
Catalog's, on every compute). Connect itself has no ``sparkContext`` and no JVM on the client's side.

Refused in the client (the calls never reach the server), which is where lakejoin makes them; the server is a plain
local Spark Connect server with Delta. A refusal raises ``RefusedOnServerless``, which lakejoin never catches by name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

# The settings a serverless session takes (Databricks, "Supported Spark configuration parameters").
ALLOWED_SETTINGS = frozenset(
    {
        "spark.sql.shuffle.partitions",
        "spark.sql.session.timeZone",
        "spark.sql.ansi.enabled",
        "spark.sql.files.maxPartitionBytes",
        "spark.sql.legacy.timeParserPolicy",
        "spark.databricks.execution.timeout",
    }
)
_REFUSED_SQL = re.compile(
    r"^\s*(SET\s+(?!(?:"
    + "|".join(map(re.escape, ALLOWED_SETTINGS))
    + r")\s*=)\S|RESET\b|(UN)?CACHE\b)|\bglobal_temp\.",
    re.I,
)
REFUSED_DATAFRAME_CALLS = (
    "cache",
    "persist",
    "checkpoint",
    "localCheckpoint",
    "createGlobalTempView",
    "createOrReplaceGlobalTempView",
)


class RefusedOnServerless(Exception):
    """What the refused call would raise on serverless (there an ``AnalysisException`` or ``NOT_SUPPORTED`` error)."""


@dataclass
class Calls:
    """What the client saw, as it happens: the calls it refused, and the MERGE statements it ran."""

    refused: list[str] = field(default_factory=list)
    merges: list[str] = field(default_factory=list)


def refuse_what_serverless_refuses(managed: str | None = None) -> Calls:
    """Patch the Spark Connect client's classes for the rest of the process. ``managed``: the folder of the catalog's
    managed tables, which Unity Catalog refuses to read or write by path (a table's files, its ``_delta_log``,
    ``delta.`path``` in SQL) on every compute; its tables are reached by name."""
    from pyspark.sql.connect.catalog import Catalog
    from pyspark.sql.connect.conf import RuntimeConf
    from pyspark.sql.connect.dataframe import DataFrame
    from pyspark.sql.connect.readwriter import DataFrameReader, DataFrameWriter
    from pyspark.sql.connect.session import SparkSession

    calls = Calls()

    def refuse(what: str) -> RefusedOnServerless:
        calls.refused.append(what)
        return RefusedOnServerless(f"[NOT_SUPPORTED_WITH_SERVERLESS] {what} is not supported on serverless compute")

    def refuse_path(what: str, path: object) -> RefusedOnServerless:
        """Unity Catalog's own refusal of a path in managed storage, on every compute (Databricks' knowledge base,
        'INVALID_PARAMETER_VALUE.LOCATION_OVERLAP: overlaps with managed storage')."""
        calls.refused.append(what)
        return RefusedOnServerless(
            f"[RequestId=0 ErrorClass=INVALID_PARAMETER_VALUE.LOCATION_OVERLAP] Input path url '{path}' overlaps with "
            "managed storage within 'CheckPathAccess' call"
        )

    def refusing(name: str) -> Any:
        def call(*_: object, **__: object) -> None:
            raise refuse(name)

        return call

    set_setting, unset_setting, run_sql = RuntimeConf.set, RuntimeConf.unset, SparkSession.sql

    def set_(self: RuntimeConf, key: str, value: object) -> None:
        if key not in ALLOWED_SETTINGS:
            raise refuse(f"setting {key}")
        set_setting(self, key, value)

    def unset(self: RuntimeConf, key: str) -> None:
        if key not in ALLOWED_SETTINGS:
            raise refuse(f"setting {key}")
        unset_setting(self, key)

    def under_managed(paths: object) -> str | None:
        """The first of ``paths`` in the managed storage (None: none is)."""
        if managed is None:
            return None
        found = [paths] if isinstance(paths, str) else list(paths or [])  # type: ignore[call-overload]
        root = os.path.realpath(managed)
        return next(
            (
                path
                for path in found
                if isinstance(path, str) and os.path.realpath(path.removeprefix("file:")).startswith(root)
            ),
            None,
        )

    def sql(self: SparkSession, query: str, *args: object, **kwargs: object) -> DataFrame:
        if _REFUSED_SQL.search(query):
            raise refuse(f"SQL {query[:60]!r}")
        if (where := under_managed(re.findall(r"delta\.`([^`]*)`", query))) or "_delta_log" in query:
            raise refuse_path(f"a path in managed storage in SQL {query[:80]!r}", where or query[:80])
        if query.lstrip().upper().startswith("MERGE"):
            calls.merges.append(query)
        return run_sql(self, query, *args, **kwargs)

    def by_path(cls: type, name: str) -> None:
        original = getattr(cls, name)

        def read_or_write(self: object, *paths: object, **options: object) -> object:
            where = under_managed([*paths, options.get("path")])
            if where is not None or any("_delta_log" in str(path) for path in paths):
                raise refuse_path(f"{cls.__name__}.{name} of {where or paths[0]} (a path in managed storage)", where)
            return original(self, *paths, **options)

        setattr(cls, name, read_or_write)

    for name in ("load", "parquet", "json", "text", "csv", "orc"):
        by_path(DataFrameReader, name)
    for name in ("save", "parquet", "json", "text", "csv", "orc"):
        by_path(DataFrameWriter, name)
    RuntimeConf.set, RuntimeConf.unset, SparkSession.sql = set_, unset, sql  # type: ignore[method-assign]
    SparkSession.cloneSession = refusing("cloneSession")  # type: ignore[method-assign]
    for name in REFUSED_DATAFRAME_CALLS:
        setattr(DataFrame, name, refusing(name))
    Catalog.cacheTable = refusing("cacheTable")  # type: ignore[method-assign]
    Catalog.dropGlobalTempView = refusing("dropGlobalTempView")  # type: ignore[method-assign]
    return calls
