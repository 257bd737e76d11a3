"""Delta I/O behind one small interface (docs/design.md section 5).

Spark computes in every mode; an engine only reads Delta snapshots into Spark DataFrames and commits
DataFrames to Delta tables. ``delta-rs`` is the embedded default; ``spark`` (Delta on Spark) is used
when the session has Delta configured (Databricks, or a cluster started with the Delta jars).
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

from state.engines.base import Actions, Data, DeltaEngine, Eviction, Memberships, Merged, OnMatch, Txn
from state.errors import LakejoinError

ENGINE_NAMES = ("auto", "delta-rs", "spark")


def session_has_delta(spark: SparkSession) -> bool:
    """True when Delta's classes load in the session's JVM and the session is set up for them: Delta's SQL
    extension configured, or a Databricks runtime (which builds Delta in without that setting).

    Spark's own class loader is asked, not the system one: it also sees jars added with ``spark.jars`` or
    ``spark.jars.packages`` (how ``configure_spark_with_delta_pip`` and ``--packages`` load Delta)."""
    configured = "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")
    if not configured and "DATABRICKS_RUNTIME_VERSION" not in os.environ:
        return False
    try:
        spark._jvm.org.apache.spark.util.Utils.classForName("io.delta.tables.DeltaTable", True, False)  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - py4j raises a generic error for a missing class
        return False
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


__all__ = ["Actions", "Data", "DeltaEngine", "Eviction", "Memberships", "Merged", "OnMatch", "Txn", "make_engine", "session_has_delta", "ENGINE_NAMES"]
