"""One Spark session per test run, with Delta on Spark when ``LAKEJOIN_DELTA_JARS`` names Delta's JVM jars."""

from __future__ import annotations

import os
import tempfile

import pytest
from pyspark.sql import SparkSession

from pipelines.spark import DELTA_JARS, check_java, local_conf
from state.engines import make_engine, session_has_delta

# Run on demand (LAKEJOIN_WHERE_IT_RUNS=1), each of these starts servers of its own and takes minutes: they start
# first, so that the two xdist workers end together instead of one waiting out the last of them.
LONGEST_FIRST = ("test_where_spark_runs",)

# The tests' commands never find a developer's 'lakejoin serve': theirs is a server a test starts, in a home of its own.
os.environ["LAKEJOIN_HOME"] = tempfile.mkdtemp(prefix="lakejoin-tests-home-")


QUICK_JVM = "spark.driver.defaultJavaOptions"


def _quick_jvms() -> None:
    """The JVMs of the tests' commands and servers, which live seconds to minutes, compile with the JIT's first tier
    only: Spark generates new code for every query, which the second tier compiles again and again (a third less CPU
    for a JVM of 80 s). Set through Spark's defaults file, which every spark-submit reads and lakejoin's own settings do
    not override; the tests' session, which lives the whole run, sets it back (``QUICK_JVM``): there the second tier's
    code pays back its compiling (a suite with it at the first tier took a fifth more CPU per test)."""
    if "SPARK_CONF_DIR" in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="lakejoin-tests-spark-conf-")
    with open(os.path.join(folder, "spark-defaults.conf"), "w", encoding="utf-8") as defaults:
        defaults.write(f"{QUICK_JVM} -XX:TieredStopAtLevel=1\n")
    os.environ["SPARK_CONF_DIR"] = folder


_quick_jvms()

# A second view of what the suite tests once, minutes long: run on demand (LAKEJOIN_LONG_TESTS=1), so that the suite
# fits CI's time.
LONG_TESTS = "LAKEJOIN_LONG_TESTS"
SECOND_VIEW = pytest.mark.skipif(
    not os.environ.get(LONG_TESTS),
    reason=f"a second view of what the suite tests once, minutes long: set {LONG_TESTS}=1",
)

SPARK_DELTA_SKIP = (
    f"Delta Lake's JVM jars are not on this Spark session's class path: set {DELTA_JARS} to a folder holding "
    "delta-spark_2.13-4.4.x.jar and delta-storage-4.4.x.jar (.ci/run does on a machine that has them)"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(
        key=lambda item: item.module.__name__.rpartition(".")[2] not in LONGEST_FIRST
    )  # stable: the rest keep their order


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    check_java()
    builder = SparkSession.builder.master("local[2]").appName("lakejoin-tests")
    for name, value in local_conf(
        {"spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g", QUICK_JVM: ""}
    ).items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def require_spark_delta(spark: SparkSession) -> None:
    if not session_has_delta(spark):
        pytest.skip(SPARK_DELTA_SKIP)


@pytest.fixture(params=["delta-rs", pytest.param("spark", marks=pytest.mark.spark_delta)])
def engine(request: pytest.FixtureRequest, spark: SparkSession):
    """Each Delta engine in turn; Delta on Spark skips where its jars are missing."""
    if request.param == "spark":
        require_spark_delta(spark)
    return make_engine(spark, request.param)


@pytest.fixture
def deltars(spark: SparkSession):
    return make_engine(spark, "delta-rs")


@pytest.fixture
def spark_engine(spark: SparkSession):
    """Delta on Spark, for the pipeline tests that run on it too; skips where its jars are missing."""
    require_spark_delta(spark)
    return make_engine(spark, "spark")


@pytest.fixture(params=["delta-rs", pytest.param("spark", marks=pytest.mark.spark_delta)])
def cli_engine(request: pytest.FixtureRequest) -> str:
    """The engine a ``lakejoin`` process runs on (tests/helpers.py gives it Delta's jars, or not)."""
    if request.param == "spark":
        require_delta_jars()
    return request.param


def require_delta_jars() -> None:
    """A ``lakejoin`` process the test starts runs on Delta on Spark only where Delta's jars are named."""
    if not os.environ.get(DELTA_JARS):
        pytest.skip(SPARK_DELTA_SKIP)
