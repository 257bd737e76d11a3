"""What each step of a few-row cycle costs, counted (benchmarks/costs.py): Spark jobs, JVM round trips and Delta
commits, held to a budget on each engine and on both of Delta on Spark's log readers, as Django's ``assertNumQueries``
holds queries. Counts do not depend on the machine's load, so a change that raises one fails here, saying which step
and by how much; lower a budget with the change that earns it. Timings are benchmarks' (docs/benchmarks.md)."""

from __future__ import annotations

import os

import pytest
from deltalake import DeltaTable

from benchmarks.costs import Cost, Cycles, counted
from benchmarks.profile import profiled
from benchmarks.small import records, write_jsonl
from pipelines.api import Pipeline
from state.engines import spark_delta
from state.engines.jvm import JvmLog
from state.engines.public_log import PublicLog
from tests.conftest import require_spark_delta

# Per step, on the second cycle of two records per relation (benchmarks/costs.py Cycles): the most measured in the tests'
# session and in a session of its own (make bench-costs).
BUDGETS: dict[str, dict[str, Cost]] = {
    "delta-rs": {
        "ingest": Cost(jobs=8, round_trips=786, commits=4),
        "run": Cost(jobs=8, round_trips=682, commits=4),
        "micro-batch": Cost(jobs=16, round_trips=1744, commits=8),
        "landing run": Cost(jobs=13, round_trips=1438, commits=6),
    },
    "spark, JVM log reader": {
        "ingest": Cost(jobs=12, round_trips=1640, commits=4),
        "run": Cost(jobs=15, round_trips=1600, commits=4),
        "micro-batch": Cost(jobs=27, round_trips=3720, commits=8),
        "landing run": Cost(jobs=22, round_trips=2630, commits=6),
    },
    # A look-up of a table's newest commit is a Spark job (DESCRIBE HISTORY), a step's each: 82 / 77 / 159 / 92 jobs
    # before the pipeline kept its engine and a look-up ran the command alone, 52 / 52 / 104 / 63 before a lock taken
    # within a run forgot only what others write beside it, a look-up kept the commits its markers are among and the
    # logs' own appends carried their maxima, an ingest pinned from its lock on, 42 / 37 / 79 / 56 before a write took
    # the version it committed from its session instead of looking it up, 38 / 33 / 71 / 50 before a DataFrame's
    # append carried the maxima known of its table, 34 / 33 / 67 / 46 before a snapshot's rows read again (the
    # definition, at each call) were kept, 30 / 31 / 61 / 46 before a pipeline kept what it saw across calls whose
    # lock takings found no other (make bench-costs)
    "spark, public log reader": {
        "ingest": Cost(jobs=18, round_trips=926, commits=4),
        "run": Cost(jobs=21, round_trips=836, commits=4),
        "micro-batch": Cost(jobs=39, round_trips=2034, commits=8),
        "landing run": Cost(jobs=34, round_trips=1768, commits=6),
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
    """Each reader's second cycle on pipelines of its own (a pipeline keeps its engine, and so its reader): what a
    classic session off Databricks pays, then what a Databricks runtime pays."""
    require_spark_delta(spark)
    found = {}
    for name, reader in (("spark, JVM log reader", JvmLog), ("spark, public log reader", PublicLog)):
        monkeypatch.setattr(spark_delta, "log_reader", reader)
        cycles = Cycles(spark, "spark", str(tmp_path / reader.__name__), floor=False)
        cycles.next()
        found[name] = over_budget(cycles.next(), BUDGETS[name])
    assert found == {"spark, JVM log reader": {}, "spark, public log reader": {}}


def over_budget(costs: dict[str, Cost], budgets: dict[str, Cost]) -> dict[str, list[str]]:
    return {step: found for step, cost in costs.items() if (found := cost.over(budgets[step]))}


@pytest.mark.spark_delta
@pytest.mark.parametrize("reader", [JvmLog, PublicLog], ids=["JVM log reader", "public log reader"])
def test_a_cycle_costs_as_much_after_a_long_history_as_after_a_short_one(spark, tmp_path, monkeypatch, reader):
    """Bronze's history grows with every ingest, and no run's record is among its commits (only a landing batch writes
    bronze): a run's search for one reads the commits since the last batch, not the whole history. Compared at the same
    checkpoint phase (each table checkpointed where its history ends): on the JVM reader each commit read is calls to
    the JVM (before: ingest 5.8 times the calls after 100 commits), on the public reader a deeper ``DESCRIBE HISTORY``
    would be a Spark job more. The other writer takes no lakejoin lock, so the pipeline, which keeps what it saw of
    its tables across calls, learns of its commits at its next write of each table, and reads what they changed at the
    next look: the cycle after that one is compared."""
    require_spark_delta(spark)
    monkeypatch.setattr(spark_delta, "log_reader", reader)
    found = {}
    for commits in (0, 100):
        root = str(tmp_path / f"after-{commits}")
        pipeline = Pipeline(root, config={"relations": {"r": {}, "s": {}}, "engine": "spark"}, spark=spark)
        for cycle in range(4):
            if cycle == 1:
                for relation in ("r", "s"):
                    _lengthen(os.path.join(root, "bronze", relation), commits)
            files = {
                name: write_jsonl(
                    str(tmp_path / "files" / f"{commits}-{name}-{cycle}.jsonl"), records(name, 2 * cycle, 2)
                )
                for name in ("r", "s")
            }
            with counted(spark, root) as found[commits]:
                for name, path in files.items():
                    pipeline.ingest(name, path)
                pipeline.run()
    assert found[100].over(found[0]) == []


def _lengthen(path: str, commits: int) -> None:
    """``commits`` commits of another writer (a compaction, then changes of a property), then a checkpoint."""
    target = DeltaTable(path).version() + commits
    if commits:
        DeltaTable(path).optimize.compact()
    while DeltaTable(path).version() < target:
        DeltaTable(path).alter.set_table_properties({"delta.checkpointInterval": "100"})
    DeltaTable(path).create_checkpoint()


def test_a_profile_names_each_job_and_each_collect_by_the_line_past_the_engine_that_asked_for_it(spark, tmp_path):
    """``make bench-profile``'s names: the line that called the engine, not the engine's own line that called Spark
    (PySpark's name for a job), so that a step's jobs say which of its parts they are."""
    from state.engines import make_engine

    engine = make_engine(spark, "delta-rs")
    table, rows = str(tmp_path / "t"), spark.createDataFrame([("a", 1)], "id string, ts bigint")
    with profiled(spark, str(tmp_path)) as profile:
        engine.append(table, rows)  # the engine hands the rows to delta-rs from the driver: a collect, a job
        spark.range(3).collect()
    line = f"tests/test_costs.py:{_line_of('engine.append(table, rows)')}"
    assert (profile.commits, len(profile.collects)) == (1, 2) and profile.seconds > 0
    assert profile.collects[0] == f"toArrow at {line}"
    assert profile.collects[1].startswith("collect at tests/test_costs.py")
    assert f"toArrow at {line}" in profile.jobs, profile.jobs


def _line_of(text: str) -> int:
    with open(__file__, encoding="utf-8") as source:
        return next(number for number, line in enumerate(source, 1) if text in line and "_line_of" not in line)
