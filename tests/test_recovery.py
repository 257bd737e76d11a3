"""A run that dies right before or right after any write of a batch, then reruns, gives the same result."""

from __future__ import annotations

from collections import Counter

import pytest

from state.config import Config
from state.engines import make_engine
from state.faults import CRASH_AT, InjectedCrash
from tests.helpers import Pipeline, copied, crash_at_each
from tests.racing import losses
from tests.reference import Pair, Record, batch_join

STEPS = ["gold", "late_arrivals", "r_state", "s_state", "dq_quarantine", "commit"]
POINTS = [f"{moment}:{step}" for step in STEPS for moment in ("before", "after")]

FIRST = [Record("s", "s1", 1, "a"), Record("r", "r2", 2, "a"), Record("r", "r3", 3, "b"), Record("s", "s4", 4, "b")]
LATER = [
    Record("r", "r5", 5, "a"),
    Record("r", "r1", 1, "b"),
    Record("s", "s9", 9, "a"),
    Record("s", "s6", 6, "b"),
    Record("s", "s0", 0, "a"),
    Record("r", "r99", 99, "a"),
]
# Bounded: batch 4 finds s6 and s0 below S's watermark (late); batch 3 evicts from every buffer.
# r99 breaks bronze_ts_plausible (ts_max 50): batch 4 quarantines it.
BOUNDED = Config.of(allowed_lateness=2, window=4, expectations={"ts_max": 50})
LATE = {"s6", "s0"}
IMPLAUSIBLE = {"r99"}


def in_window(r: Record, s: Record) -> bool:
    return r.key == s.key and abs(r.ts - s.ts) <= BOUNDED.window


def bounded(engine, root) -> Pipeline:
    return Pipeline(engine, str(root), BOUNDED)


def first_part_joined(pipeline: Pipeline) -> None:
    pipeline.land(FIRST)
    pipeline.run(max_batch_rows=3)
    pipeline.land(LATER)


@pytest.fixture(scope="module")
def started(spark, tmp_path_factory) -> Pipeline:
    """Where every delta-rs crash starts (the first part joined, the rest landed): built once, copied by each test."""
    pipeline = bounded(make_engine(spark, "delta-rs"), tmp_path_factory.mktemp("started"))
    first_part_joined(pipeline)
    return pipeline


@pytest.fixture(scope="module")
def uninterrupted(spark, tmp_path_factory, started) -> dict[str, Counter]:
    pipeline = copied(started, tmp_path_factory.mktemp("uninterrupted"))
    pipeline.run(max_batch_rows=3)
    return pipeline.snapshot()


@pytest.mark.parametrize("points", [POINTS[0::2], POINTS[1::2]], ids=["before", "after"])
def test_runs_dying_before_or_after_each_write_in_turn_then_a_rerun_equal_an_uninterrupted_run(
    deltars, tmp_path, monkeypatch, points, started, uninterrupted
):
    """Each run resumes what the last left and dies at the next point: the first crash meets a batch not begun, each
    later one a batch resumed (Delta on Spark below meets every point in one sequence)."""
    pipeline = copied(started, tmp_path, deltars)
    crash_at_each(pipeline, monkeypatch, points, max_batch_rows=3)
    assert pipeline.snapshot() == uninterrupted


def test_without_a_window_a_run_dying_right_after_a_state_merge_resumes_to_the_uninterrupted_batch_log(
    deltars, tmp_path_factory, monkeypatch
):
    """Unbounded state has no eviction: the resumed batch still records that its MERGE evicted 0 rows from the
    table the dead run had already merged (a kill -9 between two MERGEs once left the table out of the log)."""
    uninterrupted = Pipeline(deltars, str(tmp_path_factory.mktemp("uninterrupted")))
    first_part_joined(uninterrupted)
    crashed = copied(uninterrupted, tmp_path_factory.mktemp("crashed"))
    uninterrupted.run(max_batch_rows=3)
    crash_at_each(crashed, monkeypatch, ["after:s_state"], max_batch_rows=3)
    assert crashed.snapshot() == uninterrupted.snapshot()


def test_on_delta_spark_a_run_dying_at_each_write_in_turn_resumes_to_the_uninterrupted_result(
    spark_engine, tmp_path, monkeypatch, uninterrupted
):
    """Every crash point on Delta on Spark, in one warehouse: each rerun resumes the batch the last one left
    unfinished and dies at the next point, then a clean run finishes. The result equals delta-rs's uninterrupted run."""
    pipeline = bounded(spark_engine, tmp_path)
    first_part_joined(pipeline)
    crash_at_each(pipeline, monkeypatch, POINTS, max_batch_rows=3)
    assert pipeline.snapshot() == uninterrupted


def test_the_uninterrupted_run_is_the_batch_join_of_what_was_on_time(uninterrupted):
    pairs = Counter(Pair(row["r_id"], row["s_id"], row["owner"]) for row in map(dict, uninterrupted["gold"].elements()))
    on_time = [rec for rec in FIRST + LATER if rec.id not in LATE | IMPLAUSIBLE]
    assert pairs == Counter(batch_join(on_time, in_window))
    assert {late[1] for late in uninterrupted["late_arrivals"]} == LATE
    assert {(row[1], row[3]) for row in uninterrupted["dq_quarantine"]} == {("bronze_ts_plausible", "r99")}
    evicted = [
        count for batch in uninterrupted["batches"] for _, count in batch[5] or ()
    ]  # (..., late, evicted, rules)
    # Batch 3 moves both watermarks (R 3, S 7): r2 leaves R's store and S's probe buffer, so r_state deletes it; s1
    # leaves R's probe buffer and r3 S's, each staying in its own store (their columns are cleared); its own arrivals
    # already below every cutoff (r1) are never stored.
    assert sum(evicted) == 1


def test_an_ingest_that_dies_before_its_log_entry_is_not_joined_until_retried(deltars, tmp_path, monkeypatch):
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land(FIRST)
    pipeline.run(max_batch_rows=3)
    late_file = pipeline.write_file(
        [{"id": rec.id, "ts": rec.ts, "key": rec.key, "payload": rec.payload} for rec in LATER[:2]]
    )
    monkeypatch.setenv(CRASH_AT, "before:ingest_log")
    with pytest.raises(InjectedCrash):
        pipeline.ingest("r", late_file)  # r5, r1 reach bronze, the file is not logged
    monkeypatch.delenv(CRASH_AT)
    assert pipeline.run(max_batch_rows=3) == []  # an unfinished ingest is not pending yet
    pipeline.ingest("r", late_file)  # the retry logs the file; its rows are duplicates of what landed
    pipeline.land(LATER[2:])
    pipeline.run(max_batch_rows=3)
    assert pipeline.gold_pairs() == Counter(batch_join(FIRST + LATER))  # no expectations config: r99 is plausible


def compaction_of(pipeline: Pipeline, path: str, won: list[str]):  # noqa: ANN201 - a racer
    """An OPTIMIZE of ``path`` by another writer, which must commit (the race happened), noted in ``won``; a table of
    one file is Z-ordered, which rewrites it."""
    from deltalake import DeltaTable

    def optimize() -> None:
        table = DeltaTable(path)
        before = table.version()
        if len(table.file_uris()) > 1:
            table.optimize.compact()
        else:  # one file: nothing to compact, a Z-order rewrites it
            table.optimize.z_order([table.schema().fields[0].name])
        assert DeltaTable(path).version() == before + 1, f"OPTIMIZE of {path} committed nothing: no race"
        won.append(pipeline.warehouse.name_of(path))

    return optimize


def test_a_write_that_loses_a_race_to_optimize_is_retried_from_its_last_commit_and_the_result_is_exact(
    deltars, tmp_path, monkeypatch, started, uninterrupted
):
    """An OPTIMIZE commits to each table between a batch's read of it and its commit, as predictive optimization may:
    the state MERGEs lose their race (delta-rs: a concurrent transaction added data), the batch is retried from its
    last committed write, and the run ends exact, the retries counted. An append (gold of an inner join, the batch
    log) cannot lose a race to a compaction (Delta's conflict rules: INSERT and COMPACTION cannot conflict): it
    meets one and commits."""
    from state.faults import racing

    pipeline = copied(started, tmp_path, deltars)
    warehouse, won = pipeline.warehouse, []
    raced = [warehouse.gold, warehouse.batches, *(warehouse.state(rel) for rel in pipeline.config.joined)]
    lost = losses(monkeypatch.setattr, type(pipeline.engine))
    with racing({f"opened:{path}": compaction_of(pipeline, path, won) for path in raced}):
        reports = pipeline.run(max_batch_rows=3)
    assert sorted(won) == sorted(warehouse.name_of(path) for path in raced)
    assert sorted(set(lost)) == sorted(raced[2:]), "each state table's MERGE lost, the appends committed"
    assert sum(report.races for report in reports) > 0
    assert pipeline.snapshot() == uninterrupted


def test_with_change_feeds_gold_s_merge_that_loses_a_race_to_optimize_is_retried_and_gold_stays_exact(
    deltars, tmp_path, monkeypatch
):
    """delta-rs: a batch that takes results out of gold (one MERGE) and merges both state tables meets an OPTIMIZE of
    each table it writes, gold/changes and the batch log included; gold is the join of the current records."""
    from state.faults import racing
    from tests.test_changes import CONFIG, RETRACTING, current_gold, reference_gold

    pipeline = Pipeline(deltars, str(tmp_path), Config.of(**CONFIG))
    for relation, row in RETRACTING[:2]:
        pipeline.ingest(relation, pipeline.write_file([row]))
    pipeline.run()
    for relation, row in RETRACTING[2:4]:  # r's o1 moves to another key: the batch takes (o1, p1) out of gold
        pipeline.ingest(relation, pipeline.write_file([row]))
    warehouse, won = pipeline.warehouse, []
    raced = [warehouse.gold, warehouse.gold_changes, warehouse.batches, *map(warehouse.state, pipeline.config.joined)]
    monkeypatch.setattr("pipelines.silver.RACE_BACKOFF", 0.0)
    lost = losses(monkeypatch.setattr, type(pipeline.engine))
    with racing({f"opened:{path}": compaction_of(pipeline, path, won) for path in raced}):
        reports = pipeline.run()
    assert sorted(won) == sorted(warehouse.name_of(path) for path in raced)
    merged = [warehouse.gold, *raced[3:]]
    assert sorted(set(lost)) == sorted(merged), "gold's and the state tables' MERGEs lost, the appends committed"
    assert sum(report.races for report in reports) > 0
    assert current_gold(pipeline) == reference_gold(RETRACTING[:4])


def test_a_lost_race_is_told_from_other_failures_by_what_each_delta_says():
    """Delta on Spark's words as a classic session and a Spark Connect client raise them (a MERGE after a concurrent
    OPTIMIZE, Delta 4.4), and delta-rs's CommitFailedError under the engine's one-line error; nothing else is retried."""
    from deltalake.exceptions import CommitFailedError

    from state.errors import LakejoinError, lost_a_race

    classic = Exception(
        "[DELTA_CONCURRENT_APPEND.WITHOUT_HINT] Transaction conflict detected. a concurrent OPTIMIZE added data to "
        "table delta.`/w/silver/r_state` committed at version 5."
    )
    connect = Exception(
        "(io.delta.exceptions.ConcurrentDeleteReadException) [DELTA_CONCURRENT_DELETE_READ.WITHOUT_HINT]"
    )
    try:
        raise LakejoinError("cannot merge into /w/silver/r_state: Commit failed") from CommitFailedError(
            "Failed to commit transaction: Commit failed: a concurrent transactions added new data."
        )
    except LakejoinError as wrapped:
        rs = wrapped
    assert lost_a_race(classic) and lost_a_race(connect) and lost_a_race(rs)
    assert not lost_a_race(LakejoinError("cannot merge into /w/silver/r_state: Schema error: no field named key"))
    assert not lost_a_race(Exception("[DELTA_TABLE_NOT_FOUND] Delta table `main`.`x` doesn't exist."))


def test_on_delta_spark_a_write_that_loses_a_race_to_optimize_is_retried_and_the_result_is_exact(
    spark_engine, tmp_path, monkeypatch, uninterrupted
):
    """Delta on Spark: each state table's MERGE meets an OPTIMIZE committed between its read and its commit
    (DELTA_CONCURRENT_APPEND) and the batch is resumed from its last committed write; gold's and the batch log's
    appends meet one too and commit (a blind append and a compaction never conflict). The run ends as it would have
    without the races."""
    from tests.racing import APPEND, MERGE, race_writes

    pipeline = bounded(spark_engine, tmp_path)
    first_part_joined(pipeline)
    warehouse = pipeline.warehouse
    writes = [(MERGE, warehouse.state(rel)) for rel in pipeline.config.joined]
    writes += [(APPEND, warehouse.gold), (APPEND, warehouse.batches)]
    flags = tmp_path / "flags"
    flags.mkdir()
    won, lost = race_writes(monkeypatch.setattr, writes, flags), losses(monkeypatch.setattr, type(spark_engine))
    reports = pipeline.run(max_batch_rows=3)
    assert sorted(won) == sorted(table for _, table in writes)
    assert sorted(set(lost)) == sorted(table for kind, table in writes if kind == MERGE), "the MERGEs lost"
    assert sum(report.races for report in reports) > 0
    assert pipeline.snapshot() == uninterrupted


@pytest.mark.spark_delta
def test_on_a_catalog_warehouse_every_write_of_change_batches_meets_an_optimize_and_gold_stays_exact(spark, tmp_path):
    """Change feeds on a catalog warehouse (tables reached by name): gold's MERGE taking results out and putting the
    batch's in, and the state tables' MERGEs, each lose a race to an OPTIMIZE and are retried; gold/changes' and the
    batch log's appends meet one and commit. Gold after the run is the join of the current records."""
    from tests.conftest import require_spark_delta
    from tests.racing import raced_change_batches

    require_spark_delta(spark)
    spark.sql(f"CREATE SCHEMA lj_raced LOCATION '{tmp_path / 'schema'}'")
    try:
        raced = raced_change_batches(spark, "spark_catalog.lj_raced", tmp_path)
    finally:
        spark.sql("DROP SCHEMA IF EXISTS lj_raced CASCADE")
    assert raced["won"] == raced["writes"], "an OPTIMIZE committed inside each write"
    assert raced["lost"] == raced["merges"], "the MERGEs lost their race, the appends committed"
    assert raced["races"] > 0 and raced["gold"] == raced["expected"]
