"""One Spark session per test run; Delta on Spark too when LAKEJOIN_TEST_SPARK_DELTA=1 and the jars resolve."""

from __future__ import annotations

import os

import pytest
from pyspark.sql import SparkSession

from pipelines.spark import LOCAL_CONF, check_java
from state.engines import make_engine, session_has_delta

SPARK_DELTA_SKIP = (
    "Delta Lake's JVM jars are not on this Spark classpath (no Maven access here): run with "
    "LAKEJOIN_TEST_SPARK_DELTA=1 on a machine that can fetch io.delta:delta-spark_2.13:4.4.1, or on Databricks"
)


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    check_java()
    builder = SparkSession.builder.master("local[2]").appName("lakejoin-tests")
    for name, value in {**LOCAL_CONF, "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"}.items():
        builder = builder.config(name, value)
    if os.environ.get("LAKEJOIN_TEST_SPARK_DELTA") == "1":
        from delta import configure_spark_with_delta_pip

        builder = configure_spark_with_delta_pip(
            builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension").config(
                "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
            )
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(params=["delta-rs", pytest.param("spark", marks=pytest.mark.spark_delta)])
def engine(request: pytest.FixtureRequest, spark: SparkSession):
    """Each Delta engine in turn; Delta on Spark skips where its jars are missing."""
    if request.param == "spark" and not session_has_delta(spark):
        pytest.skip(SPARK_DELTA_SKIP)
    return make_engine(spark, request.param)


@pytest.fixture
def deltars(spark: SparkSession):
    return make_engine(spark, "delta-rs")
