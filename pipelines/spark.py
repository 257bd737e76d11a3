"""The Spark session lakejoin computes with: the ambient one on a cluster, a Spark Connect server's, else a local one.

A local session gets Delta Lake (for the ``spark`` engine) from a folder of its JVM jars named by
``LAKEJOIN_DELTA_JARS``; without one it has no Delta and lakejoin uses delta-rs. On Databricks the
runtime's session already has Delta and is used as it is. ``SPARK_REMOTE`` (or ``remote``) names a Spark Connect
server (``sc://host:15002``; Databricks Connect's URL): lakejoin is then its client and starts no JVM.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess

from pyspark.logger import PySparkLogger
from pyspark.sql import SparkSession

from state.errors import LakejoinError

MIN_JAVA = 17
DELTA_JARS = "LAKEJOIN_DELTA_JARS"
REMOTE = "SPARK_REMOTE"
MASTER = "LAKEJOIN_MASTER"  # the master lakejoin starts its session on: local[2] by default, spark://host:7077 for a cluster
LOCAL = "local[2]"
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The driver JVM's log4j2 configuration unless get_spark(verbose=True): errors only, no start-up chatter.
QUIET_LOG4J = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-quiet.properties")

LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "4g",
    # PySpark 4 records the Python call site of every DataFrame function for its error messages: five JVM round
    # trips per F.col or F.lit, ~0.1 s of a 10,000-row ingest. lakejoin's errors name what is wrong themselves.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

# Delta's two session settings, and what keeps its log work proportionate in a local session: a snapshot's
# state is rebuilt in 50 tasks by default, several Spark jobs per commit for a table of a few files.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",  # VACUUM lists files in this many tasks (10,000 by default)
}


def delta_jars(folder: str | None) -> list[str]:
    """The jar files of ``folder`` (Delta Lake's ``delta-spark`` and ``delta-storage``); [] when no folder is named."""
    if not folder:
        return []
    jars = sorted(glob.glob(os.path.join(folder, "*.jar")))
    if not any(os.path.basename(jar).startswith("delta-spark") for jar in jars):
        raise LakejoinError(f"{DELTA_JARS}={folder} holds no delta-spark jar: point it at Delta Lake's JVM jars, or unset it to use delta-rs")
    return jars


def local_conf(extra: dict[str, str] | None = None, master: str = LOCAL) -> dict[str, str]:
    """The settings of a session lakejoin starts: its defaults, and Delta when its jars are named: on the driver's class
    path in local mode, shipped to the executors with ``spark.jars`` on a cluster (as ``spark-submit --jars`` does)."""
    jars = delta_jars(os.environ.get(DELTA_JARS))
    on_cluster = not master.startswith("local")
    placed = {"spark.jars": ",".join(jars)} if on_cluster else {"spark.driver.extraClassPath": os.pathsep.join(jars)}
    delta = {**placed, **DELTA_CONF} if jars else {}
    return {**LOCAL_CONF, **delta, **(extra or {})}


def quiet_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with its driver JVM logging only errors; Java options already there are kept, a log4j file named in them wins."""
    options = conf.get(JAVA_OPTIONS, "").strip()
    if "log4j2.configurationFile=" in options or "log4j.configurationFile=" in options or not os.path.isfile(QUIET_LOG4J):
        return conf
    quoted = QUIET_LOG4J.replace("\\", "\\\\").replace('"', '\\"')  # the launcher splits the options as a shell would
    return {**conf, JAVA_OPTIONS: f'{options} "-Dlog4j2.configurationFile={quoted}"'.strip()}


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


# PySpark logs every analysis error it raises, as JSON on stderr, even one the caller catches and explains.
QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def _quiet_python_loggers() -> None:
    for name in QUERY_CONTEXT_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def get_spark(
    master: str | None = None, conf: dict[str, str] | None = None, app_name: str = "lakejoin", verbose: bool = False, remote: str | None = None
) -> SparkSession:
    """The active session if there is one (Databricks, tests), else a Spark Connect session when ``remote`` or
    ``SPARK_REMOTE`` names a server, else one lakejoin starts on ``master`` (default ``LAKEJOIN_MASTER``, else
    local[2]) tuned for small batches.

    A local session's JVM logs only errors unless ``verbose``, which leaves Spark's default logging (its start-up lines).
    """
    if not verbose:
        _quiet_python_loggers()
    remote = remote or os.environ.get(REMOTE)
    if remote:
        return connect(remote)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    master = master or os.environ.get(MASTER) or LOCAL
    settings = local_conf(conf, master)
    if not verbose:
        from state.engines.jvm import start_driver_jvm

        settings = quiet_conf(settings)
        start_driver_jvm({"spark.master": master, "spark.app.name": app_name, **settings})
    builder = SparkSession.builder.master(master).appName(app_name)
    for name, value in settings.items():
        builder = builder.config(name, value)
    return builder.getOrCreate()


def connect(url: str) -> SparkSession:
    """A Spark Connect session on the server at ``url``; one line naming the server when it cannot be reached."""
    from pyspark.errors import PySparkException

    try:
        spark = SparkSession.builder.remote(url).getOrCreate()
        spark.sql("SELECT 1").collect()  # the first call reaches the server
    except ImportError as exc:
        raise LakejoinError(f"Spark Connect needs its client libraries: pip install 'pyspark[connect]' ({exc})") from None
    except (PySparkException, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise LakejoinError(f"cannot reach the Spark Connect server at {url}: {first}") from None
    return spark
