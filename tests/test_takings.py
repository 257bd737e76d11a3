"""What a pipeline keeps of its tables' logs between calls: only what no other lakejoin writer can have changed. Each
taking of a warehouse lock has an epoch; a taking that finds no other taking of either lock since the pipeline's own
last one keeps what the pipeline saw (state/log/lock.py ``Takings``), anything else forgets it."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from benchmarks.small import records, write_jsonl
from pipelines.api import Pipeline
from pipelines.silver import look_again
from state.engines import spark_delta
from state.engines.public_log import PublicLog
from state.errors import LakejoinError
from state.layout import Warehouse
from state.log import lock
from state.log.lock import INGEST, JOIN, Takings, hold
from tests.conftest import require_spark_delta


def unchanged(root: str, job: str, takings: Takings | None = None) -> bool:
    with hold(root, job, takings=takings) as held:
        return held.unchanged


def test_a_taking_is_unchanged_only_when_no_other_taking_came_since_the_pipeline_s_own(tmp_path):
    root, mine = str(tmp_path), Takings()
    assert not unchanged(root, INGEST, mine)  # nothing seen yet
    assert unchanged(root, INGEST, mine)
    assert unchanged(root, JOIN, mine)
    unchanged(root, JOIN)  # another pipeline's run
    assert not unchanged(root, INGEST, mine)
    assert unchanged(root, INGEST, mine)
    unchanged(root, INGEST)  # another pipeline's ingest
    assert not unchanged(root, JOIN, mine)
    assert unchanged(root, JOIN, mine)


def test_a_lock_held_by_another_at_the_taking_leaves_it_changed_until_a_taking_finds_it_free(tmp_path):
    root, mine = str(tmp_path), Takings()
    unchanged(root, INGEST, mine)
    taken, release = threading.Event(), threading.Event()

    def another_run() -> None:  # a lock held through another open file, as another process holds it
        with hold(root, JOIN):
            taken.set()
            release.wait()

    holder = threading.Thread(target=another_run, daemon=True)
    holder.start()
    taken.wait()
    try:
        assert not unchanged(root, INGEST, mine)  # the run may be writing now
        assert not unchanged(root, INGEST, mine)  # and still may
    finally:
        release.set()
        holder.join()
    assert not unchanged(root, INGEST, mine)  # what was seen while it ran may be older than what it wrote
    assert unchanged(root, INGEST, mine)


def test_a_pipeline_s_own_lock_taken_within_another_of_its_own_is_no_other_taking(tmp_path):
    root, mine = str(tmp_path), Takings()
    unchanged(root, INGEST, mine)
    unchanged(root, JOIN, mine)
    with hold(root, JOIN, takings=mine) as run:
        assert run.unchanged
        assert unchanged(root, INGEST, mine)  # a run's landing takes the ingest lock within its own
        assert mine.peek(root, INGEST)
        unchanged(root, INGEST)  # an ingest of another pipeline while the run runs
        assert not mine.peek(root, INGEST)
        assert mine.peek(root, INGEST)
    assert unchanged(root, INGEST, mine)


def test_a_lock_whose_holder_died_holding_it_or_of_a_lakejoin_before_epochs_leaves_every_taking_changed(tmp_path):
    root, mine = str(tmp_path), Takings()
    unchanged(root, JOIN, mine)
    unchanged(root, INGEST, mine)
    with open(lock.lock_path(root, JOIN), "w", encoding="utf-8") as died:  # not marked released
        died.write(f"pid 1 on elsewhere since 2026-12-07 00:00:00 UTC\n{lock.EPOCH}{mine.seen[JOIN]}\n")
    assert not unchanged(root, INGEST, mine)
    assert not unchanged(root, INGEST, mine)
    with open(lock.lock_path(root, JOIN), "w", encoding="utf-8") as older:
        older.write("pid 1 on elsewhere since 2026-12-07 00:00:00 UTC")
    assert not unchanged(root, INGEST, mine)


def test_a_thread_taking_a_lock_it_holds_is_refused_rather_than_waiting_on_itself(tmp_path):
    root = str(tmp_path)
    with hold(root, INGEST), pytest.raises(LakejoinError, match="already holds the ingest lock"):
        unchanged(root, INGEST)
    assert not unchanged(root, INGEST)  # and the lock was left as it was: free


def test_what_is_kept_is_forgotten_once_older_than_its_age_limit(tmp_path, monkeypatch):
    root, mine = str(tmp_path), Takings()
    unchanged(root, INGEST, mine)
    monkeypatch.setattr(lock, "KEPT_SECONDS", 0)
    assert not unchanged(root, INGEST, mine)


def test_a_run_looking_again_keeps_what_no_ingest_changed_until_its_age_limit_then_forgets_every_table(
    tmp_path, monkeypatch
):
    """A run that holds its lock for hours (``run --follow``, a long backlog) forgets what it kept once it is older
    than its age limit, whatever the ingest lock says: VACUUM may have removed what a kept version reads."""
    refreshed: list[tuple[str, ...]] = []
    engine, warehouse, mine = (
        SimpleNamespace(refresh=lambda *paths: refreshed.append(paths)),
        Warehouse(str(tmp_path)),
        Takings(),
    )
    unchanged(str(tmp_path), INGEST, mine)
    look_again(engine, warehouse, mine)
    look_again(engine, warehouse, mine, ingest_unchanged=True)
    assert refreshed == []
    unchanged(str(tmp_path), INGEST)  # another pipeline's ingest
    look_again(engine, warehouse, mine)
    assert refreshed == [tuple(warehouse.beside_runs())]
    monkeypatch.setattr(lock, "KEPT_SECONDS", 0)
    look_again(engine, warehouse, mine, ingest_unchanged=True)
    assert refreshed[-1] == ()


def test_an_object_store_folder_has_no_lock_so_no_taking_is_unchanged():
    mine = Takings()
    assert not unchanged("s3://bucket/warehouse", INGEST, mine)
    assert not unchanged("s3://bucket/warehouse", INGEST, mine)


@pytest.mark.spark_delta
def test_a_pipeline_that_keeps_its_tables_between_calls_joins_what_another_pipeline_ingested_meanwhile(
    spark, tmp_path, monkeypatch
):
    """On the public reader (every Databricks run), where a kept head saves a Spark job a table: a pipeline's run after
    another pipeline's ingests joins their rows, as a run of a pipeline of its own would."""
    require_spark_delta(spark)
    monkeypatch.setattr(spark_delta, "log_reader", PublicLog)
    root = str(tmp_path / "warehouse")
    config = {"relations": {"r": {}, "s": {}}, "engine": "spark"}
    mine, another = Pipeline(root, config, spark=spark), Pipeline(root, config, spark=spark)
    ingested = {"r": [], "s": []}
    for cycle, pipeline in enumerate((mine, another)):
        for name in ("r", "s"):
            ingested[name] += records(name, 2 * cycle, 2)
            pipeline.ingest(name, write_jsonl(str(tmp_path / f"{name}{cycle}.jsonl"), ingested[name][-2:]))
        mine.run()  # the second after another's ingests: its own lock's taking follows its own last one
    gold = spark.read.format("delta").load(f"{root}/gold/join_results").select("r_id", "s_id").collect()
    expected = {(r["id"], s["id"]) for r in ingested["r"] for s in ingested["s"] if r["key"] == s["key"]}
    assert sorted(tuple(row) for row in gold) == sorted(expected)


@pytest.mark.spark_delta
def test_a_following_run_joins_what_another_pipeline_ingests_between_its_looks(spark, tmp_path, monkeypatch):
    """A following run holds its lock and keeps what it saw from one look for arrivals to the next: an ingest of
    another pipeline between two looks is found by the next (the ingest lock's epoch), not only after a batch."""
    require_spark_delta(spark)
    monkeypatch.setattr(spark_delta, "log_reader", PublicLog)
    root = str(tmp_path / "warehouse")
    config = {"relations": {"r": {}, "s": {}}, "engine": "spark"}
    mine, another = Pipeline(root, config, spark=spark), Pipeline(root, config, spark=spark)
    ingested = {name: records(name, 0, 2) for name in ("r", "s")}
    for name, rows in ingested.items():
        mine.ingest(name, write_jsonl(str(tmp_path / f"{name}0.jsonl"), rows))
    expected = {(r["id"], s["id"]) for r in records("r", 0, 4) for s in records("s", 0, 4) if r["key"] == s["key"]}
    gold = f"{root}/gold/join_results"

    def ingest_after_the_first_look_then_stop() -> None:
        time.sleep(3)  # the first look, its batch and its look for more are done by then
        for name in ("r", "s"):
            another.ingest(name, write_jsonl(str(tmp_path / f"{name}1.jsonl"), records(name, 2, 2)))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and spark.read.format("delta").load(gold).count() < len(expected):
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)  # as the scheduler stops a following run

    first_batch = threading.Event()
    feeder = threading.Thread(target=lambda: first_batch.wait() and ingest_after_the_first_look_then_stop())
    feeder.start()
    try:
        mine.run(follow=0.5, progress=lambda item: first_batch.set())
    finally:
        first_batch.set()
        feeder.join()
    joined = spark.read.format("delta").load(gold).select("r_id", "s_id").collect()
    assert sorted(tuple(row) for row in joined) == sorted(expected)
