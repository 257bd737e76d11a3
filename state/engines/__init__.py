"""Delta I/O behind one small interface (docs/design.md section 5).

Spark computes in every mode; an engine only reads Delta snapshots into Spark DataFrames and commits
DataFrames to Delta tables. ``delta-rs`` is the embedded default; ``spark`` (Delta on Spark) is used
when the session has Delta configured (Databricks, or a cluster started with the Delta jars).
"""

from __future__ import annotations

import os

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from state.engines.base import Actions, Commit, Data, DeltaEngine, Eviction, Memberships, Merged, OnMatch, as_frame
from state.engines.delta_log import is_connect
from state.errors import LakejoinError

ENGINE_NAMES = ("auto", "delta-rs", "spark")


def on_databricks() -> bool:
    """A Databricks runtime's process (a job's task, a notebook, serverless): Delta is built in."""
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def session_has_delta(spark: SparkSession) -> bool:
    """True when the session is set up for Delta and Delta is there: in a classic session, Delta's SQL extension
    configured (or a Databricks runtime, which builds Delta in without that setting) and its classes loading in the
    JVM; in a Spark Connect session, the server's Delta extension, or else the server answering a Delta command as
    Delta does."""
    if is_connect(spark):
        return _connect_knows_delta(spark)
    configured = "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")
    if not configured and not on_databricks():
        return False
    from state.engines.jvm import has_delta_classes

    return has_delta_classes(spark)


def _connect_knows_delta(spark: SparkSession) -> bool:
    """The server's extensions name Delta's; else ``DESCRIBE HISTORY`` of a folder that holds no table: Delta says it
    is not a Delta table, Spark alone cannot parse the command. Any other failure is one line."""
    if "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or ""):
        return True
    try:
        spark.sql("DESCRIBE HISTORY delta.`/lakejoin-probe-of-delta/none`").collect()
    except AnalysisException as exc:  # a parse error too; a failure to reach the server is raised as it is
        return (exc.getCondition() or "").startswith("DELTA_")
    except Exception as exc:  # noqa: BLE001 - a refusal of the probe's path (serverless limits DBFS) has many types
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LakejoinError(
            f"cannot tell whether the Spark Connect server has Delta ({first}): set engine: spark in the config if it "
            "does"
        ) from None
    return True


def make_engine(spark: SparkSession, name: str = "auto", catalog: bool = False) -> DeltaEngine:
    """The engine called ``name``; ``auto`` picks Delta on Spark when the session has it, else delta-rs. A warehouse
    in a catalog (``catalog``) or a Databricks runtime means Delta on Spark, decided without asking the session."""
    if name not in ENGINE_NAMES:
        raise LakejoinError(f"unknown engine {name!r}: use one of {', '.join(ENGINE_NAMES)}")
    known = catalog or on_databricks()
    if name == "auto":
        name = "spark" if known or session_has_delta(spark) else "delta-rs"
    if name == "spark":
        if not known and not session_has_delta(spark):
            raise LakejoinError(
                "engine 'spark' needs a Spark session with Delta Lake configured "
                "(io.delta:delta-spark jars and spark.sql.extensions); use engine 'delta-rs' here"
            )
        from state.engines.spark_delta import SparkDeltaEngine

        return SparkDeltaEngine(spark)
    from state.engines.deltars import DeltaRsEngine

    return DeltaRsEngine(spark)


__all__ = [
    "as_frame",
    "Actions",
    "Data",
    "DeltaEngine",
    "Eviction",
    "Memberships",
    "Merged",
    "OnMatch",
    "Commit",
    "make_engine",
    "on_databricks",
    "session_has_delta",
    "ENGINE_NAMES",
]
