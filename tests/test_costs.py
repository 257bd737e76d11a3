"""What each step of a few-row cycle costs, counted (benchmarks/costs.py): Spark jobs, JVM round trips and Delta
commits, held to a budget on each engine and on both of Delta on Spark's log readers, as Django's ``assertNumQueries``
holds queries. Counts do not depend on the machine's load, so a change that raises one fails here, saying which step
and by how much; lower a budget with the change that earns it. Timings are benchmarks' (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from benchmarks.costs import Cost, Cycles
from state.engines import spark_delta
from state.engines.jvm import JvmLog
from state.engines.public_log import PublicLog
from tests.conftest import require_spark_delta

# Per step, on the second cycle of two records per relation (benchmarks/costs.py Cycles; the public reader's on the
# third, after the JVM reader's): the most measured in the tests' session and in a session of its own (make bench-costs).
BUDGETS: dict[str, dict[str, Cost]] = {
    "delta-rs": {
        "ingest": Cost(jobs=8, round_trips=786, commits=4),
        "run": Cost(jobs=8, round_trips=682, commits=4),
        "micro-batch": Cost(jobs=16, round_trips=1744, commits=8),
        "landing run": Cost(jobs=13, round_trips=1438, commits=6),
    },
    "spark, JVM log reader": {
        "ingest": Cost(jobs=14, round_trips=2012, commits=4),
        "run": Cost(jobs=16, round_trips=1863, commits=4),
        "micro-batch": Cost(jobs=30, round_trips=4422, commits=8),
        "landing run": Cost(jobs=22, round_trips=2862, commits=6),
    },
    # Its jobs grow with the tables' history (a look-up of a table's newest commits is a Spark job): an ingest ran 82
    # on a second cycle of its own (make bench-costs), 83 on the tests' third cycle
    "spark, public log reader": {
        "ingest": Cost(jobs=83, round_trips=1966, commits=4),
        "run": Cost(jobs=77, round_trips=1900, commits=4),
        "micro-batch": Cost(jobs=159, round_trips=4138, commits=8),
        "landing run": Cost(jobs=92, round_trips=2788, commits=6),
    },
}


def test_each_step_of_a_few_row_cycle_stays_within_its_budget_on_delta_rs(spark, tmp_path):
    cycles = Cycles(spark, "delta-rs", str(tmp_path), floor=False)
    cycles.next()
    assert over_budget(cycles.next(), BUDGETS["delta-rs"]) == {}


@pytest.mark.spark_delta
def test_each_step_of_a_few_row_cycle_stays_within_its_budget_on_delta_on_spark_with_each_log_reader(
    spark, tmp_path, monkeypatch
):
    """The JVM reader's cycle, then the public reader's on the same tables: what a Databricks runtime pays."""
    require_spark_delta(spark)
    monkeypatch.setattr(spark_delta, "log_reader", JvmLog)
    cycles = Cycles(spark, "spark", str(tmp_path), floor=False)
    cycles.next()
    found = {"spark, JVM log reader": over_budget(cycles.next(), BUDGETS["spark, JVM log reader"])}
    monkeypatch.setattr(spark_delta, "log_reader", PublicLog)
    found["spark, public log reader"] = over_budget(cycles.next(), BUDGETS["spark, public log reader"])
    assert found == {"spark, JVM log reader": {}, "spark, public log reader": {}}


def over_budget(costs: dict[str, Cost], budgets: dict[str, Cost]) -> dict[str, list[str]]:
    return {step: found for step, cost in costs.items() if (found := cost.over(budgets[step]))}
