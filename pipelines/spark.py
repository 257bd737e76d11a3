"""The Spark session lakejoin computes with: local by default, the ambient one on a cluster."""

from __future__ import annotations

import re
import shutil
import subprocess

from pyspark.sql import SparkSession

from state.errors import LakejoinError

MIN_JAVA = 17

LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "4g",
}


def check_java() -> None:
    """Fail with a plain message when there is no Java, or one too old for Spark 4."""
    if SparkSession.getActiveSession() is not None:
        return
    java = shutil.which("java")
    if java is None:
        raise LakejoinError(f"Java {MIN_JAVA}+ is required by Spark and was not found: install openjdk-{MIN_JAVA}-jre-headless")
    banner = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    major = 0 if match is None else int(match.group(1) if match.group(1) != "1" else match.group(2) or 0)
    if major < MIN_JAVA:
        raise LakejoinError(f"Java {MIN_JAVA}+ is required by Spark, found {banner.splitlines()[0] if banner else java}: install openjdk-{MIN_JAVA}-jre-headless")


def get_spark(master: str = "local[2]", conf: dict[str, str] | None = None) -> SparkSession:
    """The active session if there is one (Databricks, tests), else a local one tuned for small batches."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    builder = SparkSession.builder.master(master).appName("lakejoin")
    for name, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(name, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
