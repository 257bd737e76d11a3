"""lakejoin on a Databricks runtime relies only on what Delta and Unity Catalog promise: in a classic session with the
runtime's variable set and Delta's internals refused (tests/databricks_runtime.py), the acceptance checks of a
workspace (pipelines/commands/acceptance.py: a change-feed join over two ingests and their batches, the lock) pass on a catalog
warehouse, which then is maintained; the engine is chosen without asking the session. Every kind of join there is
a scenario run on demand (``LAKEJOIN_WHERE_IT_RUNS``)."""

from __future__ import annotations

import pytest

from pipelines.api import Pipeline
from pipelines.commands.acceptance import CONFIG, accept
from state.engines import make_engine
from tests.conftest import require_spark_delta
from tests.databricks_runtime import ON_DEMAND, databricks_runtime
from tests.where_spark_runs import serverless_kinds

pytestmark = pytest.mark.spark_delta


def test_on_a_databricks_runtime_a_catalog_warehouse_joins_exactly_without_delta_internals(
    spark, tmp_path, monkeypatch
):
    require_spark_delta(spark)
    spark.sql(f"CREATE SCHEMA lj_runtime LOCATION '{tmp_path / 'lj_runtime'}'")
    try:
        with databricks_runtime(monkeypatch) as refused:
            outcomes = {outcome.guarantee: outcome for outcome in accept(spark, "spark_catalog.lj_runtime")}
            path_read = outcomes.pop(next(guarantee for guarantee in outcomes if "path read" in guarantee))
            assert all(outcome.passed for outcome in outcomes.values()), [
                outcome.line() for outcome in outcomes.values()
            ]
            assert not path_read.passed and "was read by path" in path_read.seen, (
                "a local catalog lets it: the check sees that"
            )
            with Pipeline("spark_catalog.lj_runtime", CONFIG, spark=spark) as pipeline:
                assert pipeline.maintain()
                assert pipeline.status()["last_committed_batch"] >= 2
        assert refused == []
    finally:
        spark.sql("DROP SCHEMA IF EXISTS lj_runtime CASCADE")


@ON_DEMAND
def test_on_a_databricks_runtime_every_kind_of_join_is_exact_on_catalog_warehouses(spark, tmp_path, monkeypatch):
    """The kinds of the serverless scenario (tests/where_spark_runs.py), each against its reference: inner, three-way,
    synchronized, left and full outer, as-of, an idle relation released, a managed source table read by name."""
    require_spark_delta(spark)
    try:
        with databricks_runtime(monkeypatch) as refused:
            kinds = serverless_kinds(str(tmp_path), spark)
        assert refused == []
        assert set(kinds) == {"inner", "left", "full", "asof", "three-way", "synchronized", "idle", "table"}
        for kind, joined in kinds.items():
            assert joined["gold"] == joined["expected"] and joined["gold"], kind
    finally:
        for (name,) in spark.sql("SHOW SCHEMAS IN spark_catalog LIKE 'lj_kind_*|lj_sources'").collect():
            spark.sql(f"DROP SCHEMA IF EXISTS spark_catalog.{name} CASCADE")


def test_on_a_databricks_runtime_the_engine_is_chosen_without_touching_the_session(spark, monkeypatch):
    require_spark_delta(spark)
    with databricks_runtime(monkeypatch):
        monkeypatch.setattr(type(spark), "sql", lambda *_: pytest.fail("the engine's choice ran a query"))
        assert make_engine(spark).name == "spark"
