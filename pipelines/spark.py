"""The Spark session lakejoin computes with: the ambient one on a cluster, a Spark Connect server's, else a local one.

A local session gets Delta Lake (for the ``spark`` engine) from a folder of its JVM jars named by
``LAKEJOIN_DELTA_JARS``; without one it has no Delta and lakejoin uses delta-rs. On Databricks the
runtime's session already has Delta and is used as it is. ``SPARK_REMOTE`` (or ``remote``) names a Spark Connect
server (``sc://host:15002``; Databricks Connect's URL): lakejoin is then its client and starts no JVM.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import socket
import subprocess
import warnings
from collections.abc import Iterator

from pyspark import StorageLevel
from pyspark.logger import PySparkLogger
from pyspark.sql import DataFrame, SparkSession

from state.engines.delta_log import is_connect, is_restricted
from state.errors import LakejoinError, first_line

MIN_JAVA = 17
DELTA_JARS = "LAKEJOIN_DELTA_JARS"
REMOTE = "SPARK_REMOTE"
DATABRICKS = "DATABRICKS_RUNTIME_VERSION"  # set in every Databricks runtime's processes
MASTER = (
    "LAKEJOIN_MASTER"  # the master lakejoin starts its session on: local[2] by default, spark://host:7077 for a cluster
)
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
    # A batch's plans name their joins (its arrivals broadcast into scans of the state), so adaptive execution has
    # nothing to re-plan, and it would run each shuffle of a plan as a job of its own: a batch of a few rows pays
    # ~0.3 s for that (benchmarks/small.py).
    "spark.sql.adaptive.enabled": "false",
}

# A local session's driver listens on the machine's network address by default (its RPC endpoint and its block
# manager, with Spark's authentication off) though nothing off the machine needs it: loopback only. A cluster's
# executors must reach the driver, so on a cluster master Spark's defaults (or the user's settings) stand.
LOOPBACK = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}

# Delta's two session settings, and what keeps its log work proportionate in a local session: a snapshot's
# state is rebuilt in 50 tasks by default, several Spark jobs per commit for a table of a few files.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "1",
    # VACUUM lists files in this many tasks (10,000 by default)
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
}


def delta_jars(folder: str | None) -> list[str]:
    """The jar files of ``folder`` (Delta Lake's ``delta-spark`` and ``delta-storage``); [] when no folder is named."""
    if not folder:
        return []
    jars = sorted(glob.glob(os.path.join(folder, "*.jar")))
    if not any(os.path.basename(jar).startswith("delta-spark") for jar in jars):
        raise LakejoinError(
            f"{DELTA_JARS}={folder} holds no delta-spark jar: point it at Delta Lake's JVM jars, or unset it to use "
            "delta-rs"
        )
    return jars


def local_conf(extra: dict[str, str] | None = None, master: str = LOCAL) -> dict[str, str]:
    """The settings of a session lakejoin starts: its defaults, loopback only in local mode, and Delta when its jars are
    named: on the driver's class path in local mode, shipped to the executors with ``spark.jars`` on a cluster (as
    ``spark-submit --jars`` does). ``extra`` wins over all of them."""
    jars = delta_jars(os.environ.get(DELTA_JARS))
    on_cluster = not master.startswith("local")
    placed = {"spark.jars": ",".join(jars)} if on_cluster else {"spark.driver.extraClassPath": os.pathsep.join(jars)}
    delta = {**placed, **DELTA_CONF} if jars else {}
    return {**LOCAL_CONF, **({} if on_cluster else LOOPBACK), **delta, **(extra or {})}


def quiet_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with its driver JVM logging only errors; Java options already there are kept, a log4j file named in them
    wins."""
    options = conf.get(JAVA_OPTIONS, "").strip()
    if (
        "log4j2.configurationFile=" in options
        or "log4j.configurationFile=" in options
        or not os.path.isfile(QUIET_LOG4J)
    ):
        return conf
    quoted = QUIET_LOG4J.replace("\\", "\\\\").replace('"', '\\"')  # the launcher splits the options as a shell would
    return {**conf, JAVA_OPTIONS: f'{options} "-Dlog4j2.configurationFile={quoted}"'.strip()}


def check_java() -> None:
    """Fail with a plain message when there is no Java, or one too old for Spark 4."""
    if SparkSession.getActiveSession() is not None:
        return
    java = shutil.which("java")
    if java is None:
        raise LakejoinError(
            f"Java {MIN_JAVA}+ is required by Spark and was not found: install openjdk-{MIN_JAVA}-jre-headless"
        )
    banner = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    major = 0 if match is None else int(match.group(1) if match.group(1) != "1" else match.group(2) or 0)
    if major < MIN_JAVA:
        raise LakejoinError(
            f"Java {MIN_JAVA}+ is required by Spark, found {banner.splitlines()[0] if banner else java}: install "
            f"openjdk-{MIN_JAVA}-jre-headless"
        )


# PySpark logs every analysis error it raises, as JSON on stderr, even one the caller catches and explains.
QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def _quiet_python_loggers() -> None:
    for name in QUERY_CONTEXT_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL)


def get_spark(
    master: str | None = None,
    conf: dict[str, str] | None = None,
    app_name: str = "lakejoin",
    verbose: bool = False,
    remote: str | None = None,
) -> SparkSession:
    """The active session if there is one (Databricks, tests), else a Spark Connect session when ``remote`` or
    ``SPARK_REMOTE`` names a server, else, on Databricks, the runtime's session, else one lakejoin starts on ``master``
    (default ``LAKEJOIN_MASTER``, else local[2]) tuned for small batches.

    A local session's JVM logs only errors unless ``verbose``, which leaves Spark's default logging (its start-up
    lines).
    """
    if not verbose:
        _quiet_python_loggers()
    remote = remote or os.environ.get(REMOTE)
    if remote:
        return connect(remote, verbose)
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if (
        DATABRICKS in os.environ
    ):  # a job's task: the runtime's own session (a cluster's or serverless'), never a local one
        return SparkSession.builder.getOrCreate()
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


def stop_session(spark: SparkSession) -> None:
    """Stop a session lakejoin started. A Spark Connect client first waits for the release requests of its last
    executions: pyspark's ``stop`` releases the session before they are sent, and the server logs an ERROR for each
    one that arrives after."""
    if is_connect(spark):
        from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator

        ExecutePlanResponseReattachableIterator.shutdown()
    spark.stop()


# How long lakejoin waits for a Spark Connect server's port to accept a connection before calling it unreachable.
CONNECT_SECONDS = 10.0


def connect(url: str, verbose: bool = False) -> SparkSession:
    """A Spark Connect session on the server at ``url``, or one line naming the server within about 20 seconds when
    nothing there answers: Spark Connect's own client retries an unreachable server for ten minutes or more. Only the
    first call is hurried: a server that answers slowly, or asks to be called back (a cluster starting), is waited
    for, and later calls keep Spark Connect's retries. gRPC's own log says only errors unless ``verbose``."""
    from pyspark.errors import PySparkException

    if not verbose:
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # read when gRPC loads, below
    shown = _without_secrets(url)
    try:
        from pyspark.sql.connect.client.core import DefaultChannelBuilder

        address = DefaultChannelBuilder(url)
    except ImportError as exc:
        raise LakejoinError(
            f"Spark Connect needs its client libraries: pip install 'pyspark[connect]' ({exc})"
        ) from None
    except (PySparkException, ValueError) as exc:
        raise LakejoinError(
            f"{shown} is not a Spark Connect URL ({first_line(exc)}): give one as sc://host:15002"
        ) from None
    _require_listening(address.url.hostname or "", address.url.port or DefaultChannelBuilder.default_port(), shown)
    spark = SparkSession.builder.remote(url).getOrCreate()
    client = spark.client
    patient = client.get_retry_policies()
    client.set_retry_policies(hurried_retries())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PySpark warns "[RETRIES_EXCEEDED]" before raising: the error says it
            spark.version  # the first call: one round trip, whose failure nothing inside PySpark swallows
    except (PySparkException, ValueError) as exc:
        client.close()  # else Python's exit calls the server again, with the ten-minute retries
        raise LakejoinError(f"cannot reach the Spark Connect server at {shown}: {_grpc_details(exc)}") from None
    client.set_retry_policies(patient)
    return spark


def _require_listening(host: str, port: int, shown: str) -> None:
    """Refuse at once an address where nothing accepts connections (a closed port, a host that drops them, a name
    that does not resolve). Behind a proxy the server is reached through it, so only gRPC can tell."""
    if any(os.environ.get(name) for name in ("grpc_proxy", "https_proxy", "HTTPS_PROXY")):
        return
    try:
        socket.create_connection((host.strip("[]"), port), timeout=CONNECT_SECONDS).close()
    except TimeoutError:
        raise LakejoinError(
            f"cannot reach the Spark Connect server at {shown}: no answer in {CONNECT_SECONDS:g} s; check the host and "
            "port"
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise LakejoinError(
            f"cannot reach the Spark Connect server at {shown}: {reason}; check the host and port, and that the server "
            "runs"
        ) from None


def hurried_retries() -> list:
    """Retries for a first call, and for every call to ``lakejoin serve``'s local server (up or gone, never slow to
    answer): a server's own request to wait (it answered) is honoured as Spark Connect does; no answer at all is tried
    four more times, about 8 s in all."""
    from pyspark.sql.connect.client.retries import DefaultPolicy, extract_retry_info

    class ServerAskedToWait(DefaultPolicy):
        def can_retry(self, e: BaseException) -> bool:
            return extract_retry_info(e) is not None

    class NoAnswer(DefaultPolicy):
        def __init__(self) -> None:
            super().__init__(
                max_retries=4,
                initial_backoff=500,
                backoff_multiplier=2.0,
                max_backoff=4000,
                jitter=0,
                recognize_server_retry_delay=False,
            )

    return [ServerAskedToWait(), NoAnswer()]


def _without_secrets(url: str) -> str:
    """``url`` as it may be printed: a token in its parameters (Databricks Connect's ``;token=``) masked."""
    return re.sub(r"(;\s*token=)[^;]*", r"\1…", url, flags=re.I)


def _grpc_details(exc: BaseException) -> str:
    """What gRPC said went wrong (its ``details``), not the multi-line dump PySpark's message is."""
    found = re.search(r'details = "([^"]*)"', str(exc))
    return found.group(1) if found else first_line(exc)


@contextlib.contextmanager
def held(frame: DataFrame) -> Iterator[DataFrame]:
    """``frame`` computed once for the several reads a block makes of it (kept in memory, spilling to disk), released
    after: for a plan whose evaluation costs more than its rows (a change feed's gold rows, a DataFrame's ingest).
    A session that caches nothing (Databricks serverless) computes it for each read instead."""
    if is_restricted(frame.sparkSession):
        yield frame
        return
    cached = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        yield cached
    finally:
        cached.unpersist()
