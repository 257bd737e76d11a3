"""``lakejoin status`` reports a warehouse without changing it; ``lakejoin reset`` rebuilds silver and gold from bronze."""

from __future__ import annotations

from collections import Counter

import pytest

from pipelines.commands.reset import reset
from pipelines.commands.status import warehouse_status
from state.faults import CRASH_AT, InjectedCrash
from tests.helpers import Pipeline, lakejoin
from tests.reference import Record, batch_join

RECORDS = [
    Record("r", "r1", 1, "a"),
    Record("s", "s2", 2, "a"),
    Record("r", "r3", 3, "b"),
    Record("s", "s4", 4, "b"),
    Record("r", "r0", 0, "b"),
    Record("s", "s5", 5, "a"),
]


def landed(engine, root) -> Pipeline:
    pipeline = Pipeline(engine, str(root))
    pipeline.land(RECORDS)
    return pipeline


@pytest.fixture
def pipeline(deltars, tmp_path) -> Pipeline:
    return landed(deltars, tmp_path)


def test_status_shows_tables_batches_and_pending_arrivals(pipeline, monkeypatch):
    pipeline.run(max_batch_rows=2)
    pipeline.land([Record("r", "r9", 9, "a"), Record("s", "s8", 8, "a"), Record("s", "s7", 7, "b")])
    monkeypatch.setenv(CRASH_AT, "before:gold")
    with pytest.raises(InjectedCrash):
        pipeline.run(max_batch_rows=2)
    monkeypatch.delenv(CRASH_AT)
    before = pipeline.versions()

    status = warehouse_status(pipeline.engine, pipeline.warehouse, pipeline.config)

    assert pipeline.versions() == before
    tables = {table.name: (table.version, table.rows) for table in status.tables}
    assert tables["bronze/r"][1] == 4 and tables["bronze/s"][1] == 5
    # A batch's outputs commit at once: the crash at gold's write leaves batch 4's MERGEs committed.
    assert tables["silver/r_state"][1] == 4  # R's records, in its store and in S's probe buffer
    assert tables["gold/join_results"] == (2, len(batch_join(RECORDS)))
    assert tables["quarantine/ingest"] == (None, None)
    assert (status.last_committed_batch, status.unfinished_batch, status.joined_up_to) == (3, 4, 6)
    assert status.pending == {"r": 1, "s": 2}
    assert status.problem is None and status.running is None
    text = status.describe()
    assert "unfinished batch: 4" in text and "pending arrivals: 1 R, 2 S" in text and "consistency: OK" in text


def test_status_names_what_a_run_would_refuse(pipeline):
    pipeline.run(max_batch_rows=2)
    pipeline.engine.drop(pipeline.warehouse.gold)
    status = warehouse_status(pipeline.engine, pipeline.warehouse, pipeline.config)
    assert status.problem.startswith("gold/join_results is missing")
    assert status.last_committed_batch == 3


def test_reset_then_run_rebuilds_the_same_gold_and_state(engine, tmp_path):
    pipeline = landed(engine, tmp_path)
    pipeline.run(max_batch_rows=2)
    before = pipeline.snapshot()
    versions = pipeline.versions()
    derived = {pipeline.warehouse.name_of(path) for path in pipeline.warehouse.derived_tables()}
    bronze = {name: version for name, version in versions.items() if name not in derived}

    dropped = reset(pipeline.engine, pipeline.warehouse)

    assert set(dropped) == {name for name in derived if versions.get(name) is not None}
    after_reset = pipeline.versions()
    assert all(after_reset[name] is None for name in dropped)
    assert {name: after_reset[name] for name in bronze} == bronze
    pipeline.run(max_batch_rows=2)
    assert pipeline.snapshot() == before
    assert pipeline.gold_pairs() == Counter(batch_join(RECORDS))


def test_status_show_and_reset_answer_from_the_cli_without_starting_a_jvm(pipeline):
    """They read (or drop) Delta tables only, so delta-rs answers alone: with Spark unable to start (no SPARK_HOME to
    launch from), each still succeeds."""
    pipeline.run(max_batch_rows=4)
    warehouse, no_spark = pipeline.warehouse.root, {"SPARK_HOME": "/nonexistent"}
    unconfirmed = lakejoin("reset", "--warehouse", warehouse, cwd=pipeline.root, env=no_spark)
    assert unconfirmed.returncode == 2 and "rerun with --yes to confirm" in unconfirmed.stderr
    assert pipeline.engine.version(pipeline.warehouse.gold) is not None
    status = lakejoin("status", "--warehouse", warehouse, "--json", cwd=pipeline.root, env=no_spark)
    assert status.returncode == 0, status.stderr[-2000:]
    assert '"last_committed_batch": 2' in status.stdout and '"problem": null' in status.stdout
    shown = lakejoin("show", "--warehouse", warehouse, "--limit", "2", cwd=pipeline.root, env=no_spark)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert shown.stdout.splitlines()[0].split()[-4:] == [
        "_r_id",
        "_r_ts",
        "_s_id",
        "_s_ts",
    ]  # the records' columns first
    assert len(shown.stdout.splitlines()) == 4 and "--limit N shows more" in shown.stdout  # header, 2 rows, the hint
    dropped = lakejoin("reset", "--warehouse", warehouse, "--yes", cwd=pipeline.root, env=no_spark)
    assert dropped.returncode == 0, dropped.stderr[-2000:]
    pipeline.engine.refresh()  # forget the tables this process holds open
    assert pipeline.engine.version(pipeline.warehouse.gold) is None
    assert (shown.stderr, dropped.stderr) == ("", "")


def test_status_read_by_delta_rs_alone_equals_the_engines_own(engine, tmp_path):
    """What ``lakejoin status`` reads without Spark (DeltaRsReader) is what either engine reads, a Spark-written
    warehouse included."""
    from state.engines.deltars import DeltaRsReader

    pipeline = landed(engine, tmp_path)
    pipeline.run(max_batch_rows=2)
    pipeline.land([Record("r", "r9", 9, "a")])
    by_engine = warehouse_status(pipeline.engine, pipeline.warehouse, pipeline.config)
    alone = warehouse_status(DeltaRsReader(), pipeline.warehouse, pipeline.config)
    assert alone == by_engine
    assert alone.pending == {"r": 1, "s": 0}
