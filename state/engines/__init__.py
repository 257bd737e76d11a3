"""Delta I/O behind one small interface (docs/design.md section 5).

Spark computes in every mode; an engine only reads Delta snapshots into Spark DataFrames and commits
DataFrames to Delta tables. ``delta-rs`` is the embedded default; ``spark`` (Delta on Spark) is used
when the session has Delta configured (Databricks, or a cluster started with the Delta jars).
"""

from __future__ import annotations

import os

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from state.engines.delta_log import is_connect
from state.engines.base import Actions, Data, DeltaEngine, Eviction, Memberships, Merged, OnMatch, Txn, as_frame
from state.errors import LakejoinError

ENGINE_NAMES = ("auto", "delta-rs", "spark")


def session_has_delta(spark: SparkSession) -> bool:
    """True when the session is set up for Delta and Delta is there: in a classic session, Delta's SQL extension
    configured (or a Databricks runtime, which builds Delta in without that setting) and its classes loading in the
    JVM; in a Spark Connect session, the server answering a Delta command as Delta does."""
    if is_connect(spark):
        return _server_knows_delta(spark)
    configured = "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")
    if not configured and "DATABRICKS_RUNTIME_VERSION" not in os.environ:
        return False
    from state.engines.jvm import has_delta_classes

    return has_delta_classes(spark)


def _server_knows_delta(spark: SparkSession) -> bool:
    """``DESCRIBE HISTORY`` of a folder that holds no table: Delta says it is not a Delta table, Spark alone cannot
    parse the command."""
    try:
        spark.sql("DESCRIBE HISTORY delta.`/lakejoin-probe-of-delta/none`").collect()
    except AnalysisException as exc:  # a parse error too; a failure to reach the server is raised as it is
        return (exc.getCondition() or "").startswith("DELTA_")
    return True


def make_engine(spark: SparkSession, name: str = "auto") -> DeltaEngine:
    """The engine called ``name``; ``auto`` picks Delta on Spark when the session has it, else delta-rs."""
    if name not in ENGINE_NAMES:
        raise LakejoinError(f"unknown engine {name!r}: use one of {', '.join(ENGINE_NAMES)}")
    if name == "auto":
        name = "spark" if session_has_delta(spark) else "delta-rs"
    if name == "spark":
        if not session_has_delta(spark):
            raise LakejoinError(
                "engine 'spark' needs a Spark session with Delta Lake configured "
                "(io.delta:delta-spark jars and spark.sql.extensions); use engine 'delta-rs' here"
            )
        from state.engines.spark_delta import SparkDeltaEngine

        return SparkDeltaEngine(spark)
    from state.engines.deltars import DeltaRsEngine

    return DeltaRsEngine(spark)


__all__ = ["as_frame", "Actions", "Data", "DeltaEngine", "Eviction", "Memberships", "Merged", "OnMatch", "Txn", "make_engine", "session_has_delta", "ENGINE_NAMES"]
