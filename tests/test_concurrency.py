"""Processes racing on one warehouse: two runs never share a batch, ingest during a run is safe, kill -9 loses nothing."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from collections import Counter

import pytest

from state.engines import make_engine
from state.log.lock import JOIN, hold
from tests.conftest import require_delta_jars
from tests.helpers import Pipeline, lakejoin, start_lakejoin
from tests.reference import Record, batch_join


def stream(count: int, seed: int, prefix: str = "") -> list[Record]:
    """``count`` records per relation over 5 keys with random timestamps, arriving in four runs (four files)."""
    rng = random.Random(seed)
    half = count // 2
    return [
        Record(side, f"{prefix}{side}{i}", rng.randrange(100), f"k{rng.randrange(5)}")
        for start in (0, half)
        for side in "rs"
        for i in range(start, start + half)
    ]


@pytest.fixture(scope="module")
def pristine(spark, tmp_path_factory) -> tuple[str, list[Record]]:
    """A warehouse with 40 arrivals landed and none joined, ingested once and copied by each test."""
    pipeline = Pipeline(make_engine(spark, "delta-rs"), str(tmp_path_factory.mktemp("pristine")))
    records = stream(20, seed=3)
    pipeline.land(records)
    return pipeline.warehouse.root, records


@pytest.fixture
def landed(deltars, tmp_path, pristine) -> tuple[Pipeline, list[Record]]:
    pipeline = Pipeline(deltars, str(tmp_path))
    shutil.copytree(pristine[0], pipeline.warehouse.root)
    return pipeline, pristine[1]


# How long a fresh ``lakejoin run`` of the landed warehouse (ten batches) on Delta on Spark takes to start Spark and
# to finish.
RUN_SECONDS = (10.0, 40.0)


def run_args(pipeline: Pipeline, *extra: str) -> list[str]:
    return ["run", "--warehouse", pipeline.warehouse.root, "--max-batch-rows", "4", *extra]


def test_a_run_finding_the_warehouse_busy_does_nothing_and_exits_3(landed):
    pipeline, _ = landed
    before = pipeline.versions()
    with hold(pipeline.warehouse.root, JOIN):
        busy = lakejoin(*run_args(pipeline), cwd=pipeline.root)
    assert busy.returncode == 3
    assert (
        busy.stderr.strip()
        .splitlines()[-1]
        .startswith(f"lakejoin: error: another 'lakejoin run' holds {pipeline.warehouse.root} (pid {os.getpid()}")
    )
    assert "--wait SECONDS" in busy.stderr
    assert pipeline.versions() == before


def test_a_run_with_wait_queues_behind_the_holder_then_joins(landed):
    pipeline, records = landed
    with hold(pipeline.warehouse.root, JOIN):
        queued = start_lakejoin(*run_args(pipeline, "--wait", "120", "--max-batch-rows", "40"), cwd=pipeline.root)
        time.sleep(12)  # long enough for its Spark session to start and reach the lock
        assert queued.poll() is None and pipeline.engine.version(pipeline.warehouse.batches) is None
    out, err = queued.communicate(timeout=300)
    assert queued.returncode == 0, err[-2000:]
    assert pipeline.gold_pairs() == Counter(batch_join(records))


def test_two_runs_started_together_never_both_process_a_batch(landed):
    pipeline, records = landed
    runs = [start_lakejoin(*run_args(pipeline), cwd=pipeline.root) for _ in range(2)]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 3], [err[-1500:] for _, _, err in results]
    worker_out = next(out for code, out, _ in results if code == 0)
    assert worker_out.count("batch ") == 10
    assert "this one did nothing" in next(err for code, _, err in results if code == 3)
    assert pipeline.gold_pairs() == Counter(batch_join(records))


def test_a_following_run_joins_what_is_ingested_while_it_runs_and_ctrl_c_ends_it_cleanly(landed):
    pipeline, records = landed
    more = stream(10, seed=4, prefix="late-")
    following = start_lakejoin(  # a batch for what was landed, one for what lands while it follows
        *run_args(pipeline, "--follow", "--trigger", "0.5", "--max-batch-rows", "40"), cwd=pipeline.root
    )
    first_line = following.stdout.readline()  # the first batch is committed: the run is under way
    assert first_line.startswith("batch 1"), following.stderr.read()[-2000:]
    pipeline.land(more)  # a later trigger finds these
    arrivals = len(records) + len(more)
    deadline = time.monotonic() + 300
    while pipeline.engine.max_value(pipeline.warehouse.batches, "seq_to") != arrivals and time.monotonic() < deadline:
        time.sleep(0.5)
    assert following.poll() is None  # still following, with nothing pending
    os.killpg(
        following.pid, signal.SIGINT
    )  # Ctrl-C in a terminal: the whole group, whose JVM ignores it (PySpark sees to that)
    out, err = following.communicate(timeout=120)
    assert following.returncode == 0, err[-2000:]
    summary = out.strip().splitlines()[-1]
    assert f"batches: {arrivals} arrivals" in summary, out[-2000:]
    assert pipeline.gold_pairs() == Counter(batch_join(records + more))


@pytest.mark.spark_delta
def test_kill_9_at_random_moments_then_a_clean_rerun_gives_the_uninterrupted_result(
    landed, deltars, pristine, tmp_path_factory
):
    """On Delta on Spark, the engine of every Databricks run; a delta-rs process is killed at a random moment by
    tests/test_api.py's streams (and on demand tests/test_serve.py's commands), and both engines die at each write."""
    pipeline, records = landed
    require_delta_jars()
    uninterrupted = Pipeline(deltars, str(tmp_path_factory.mktemp("uninterrupted")))
    shutil.copytree(pristine[0], uninterrupted.warehouse.root)
    uninterrupted.run(max_batch_rows=4)

    victim = start_lakejoin(*run_args(pipeline), cwd=pipeline.root, engine="spark")
    time.sleep(random.Random(9).uniform(*RUN_SECONDS))  # within the run: Spark's start, then ten batches
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate()
    rerun = lakejoin(*run_args(pipeline), cwd=pipeline.root, engine="spark")

    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert pipeline.snapshot() == uninterrupted.snapshot()
    assert pipeline.gold_pairs() == Counter(batch_join(records))
