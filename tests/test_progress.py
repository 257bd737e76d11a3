"""A silent stream does not stall the others: idle relations and declared progress (state/log/progress.py).

The clock is set (state/clock.py), so "fifteen minutes later" takes no time: ingest records each arrival's time
by it, and a batch's plan records the time it decided by.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from pipelines.api import Pipeline as Api
from pipelines.commands.status import warehouse_status
from pipelines.definition import record, settle
from state.clock import set_now
from state.config import Config
from state.errors import LakejoinError
from state.faults import CRASH_AT, InjectedCrash
from tests.helpers import Pipeline
from tests.reference import Pair, Record

START = datetime(2026, 11, 25, 9, 0, tzinfo=timezone.utc)
QUIET = {"s": {"required": ["key"], "idle_after": "15 minutes"}}


@pytest.fixture(autouse=True)
def clock():
    """Every test starts at START and leaves the real clock behind it."""
    set_now(START)
    yield
    set_now(None)


def at(minutes: int) -> None:
    set_now(START + timedelta(minutes=minutes))


def rows(pipeline: Pipeline) -> Counter[Pair]:
    return Counter(Pair(row["_r_id"], row.get("_s_id"), row["owner"]) for row in pipeline.gold_rows())


def land_then_run(pipeline: Pipeline, *records: Record) -> None:
    pipeline.land(list(records))
    pipeline.run()


def left_join(deltars, root, relations: dict | None = None) -> Pipeline:  # noqa: ANN001 - an engine, a path
    return Pipeline(deltars, str(root), Config.of(join="left", window=2, allowed_lateness=0, relations=relations))


def stopped_payments(pipeline: Pipeline) -> None:
    """s1 matches r2; r4 waits for S's watermark to pass 6; then S goes quiet while R goes on with r8."""
    land_then_run(pipeline, Record("s", "s1", 1, "k"), Record("r", "r2", 2, "k"), Record("r", "r4", 4, "k"))
    at(1)
    land_then_run(pipeline, Record("r", "r8", 8, "k"))


def test_a_left_joins_waiting_rows_come_out_once_the_stopped_relation_is_idle_and_only_then(deltars, tmp_path) -> None:
    pipeline = left_join(deltars, tmp_path, QUIET)
    stopped_payments(pipeline)
    at(10)
    assert pipeline.run() == [] and rows(pipeline) == Counter(
        {Pair("r2", "s1", "S"): 1}
    )  # S quiet for 10 minutes: not idle yet
    at(16)
    (released,) = pipeline.run()  # S idle: its watermark is R's, 8, so r4 (4 + window 2 < 8) is final
    assert released.arrivals == {"r": 0, "s": 0} and rows(pipeline) == Counter(
        {Pair("r2", "s1", "S"): 1, Pair("r4", None, "R"): 1}
    )
    status = warehouse_status(deltars, pipeline.warehouse, pipeline.config)
    assert status.idle == {"s": "2026-11-25T09:00:00Z"} and status.watermarks["s"] == 8
    at(20)
    assert pipeline.run() == []  # nothing moved since: no batch, r4's row stays once
    land_then_run(pipeline, Record("s", "s3", 3, "k"))  # S resumes with a record below the watermark it was given
    (late,) = pipeline.engine.read(pipeline.warehouse.late_arrivals).collect()
    assert (
        late["id"] == "s3"
        and late["reason"] == "ts below the watermark of S (S had been idle since 2026-11-25T09:00:00Z)"
    )
    assert rows(pipeline) == Counter({Pair("r2", "s1", "S"): 1, Pair("r4", None, "R"): 1})


def test_without_idle_after_the_waiting_rows_wait(deltars, tmp_path) -> None:
    pipeline = left_join(deltars, tmp_path)
    stopped_payments(pipeline)
    at(60 * 24)
    assert pipeline.run() == [] and rows(pipeline) == Counter({Pair("r2", "s1", "S"): 1})


def test_an_as_of_joins_trades_waiting_for_quotes_that_stopped_come_out_once_the_quotes_are_idle(
    deltars, tmp_path
) -> None:
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(join="asof", allowed_lateness=0, relations=QUIET))
    land_then_run(pipeline, Record("s", "s1", 1, "k"), Record("r", "r3", 3, "k"))
    at(1)
    land_then_run(pipeline, Record("r", "r5", 5, "k"))
    assert rows(pipeline) == Counter()  # r3 waits for S's watermark to reach 3
    at(16)
    pipeline.run()
    assert rows(pipeline) == Counter(
        {Pair("r3", "s1", "R"): 1}
    )  # S idle: its watermark is R's, 5; r5 waits for S past 5


def test_a_batch_resumed_after_a_crash_keeps_its_idle_decision_whatever_the_clock_says_then(
    deltars, tmp_path_factory, monkeypatch
) -> None:
    uninterrupted, crashed = (
        left_join(deltars, tmp_path_factory.mktemp(name), QUIET) for name in ("uninterrupted", "crashed")
    )
    for pipeline in (uninterrupted, crashed):
        at(0)
        stopped_payments(pipeline)
    at(16)
    uninterrupted.run()
    monkeypatch.setenv(CRASH_AT, "before:gold")
    with pytest.raises(InjectedCrash):
        crashed.run()  # planned at 16 minutes, S idle; died before writing
    monkeypatch.delenv(CRASH_AT)
    at(5)  # a clock by which S would not be idle: the resumed batch decides by its plan
    crashed.run()
    assert rows(crashed) == rows(uninterrupted) == Counter({Pair("r2", "s1", "S"): 1, Pair("r4", None, "R"): 1})


def declaring(pipeline: Pipeline, spark) -> Api:  # noqa: ANN001 - a SparkSession
    """The API on ``pipeline``'s warehouse, its config recorded as the command line records it."""
    record(pipeline.engine, pipeline.warehouse, settle(pipeline.engine, pipeline.warehouse, pipeline.config, "run"))
    return Api(pipeline.warehouse.root, pipeline.config, spark=spark)


def test_declared_progress_bounds_an_inner_joins_state_and_releases_a_left_joins_rows(
    spark, deltars, tmp_path_factory
) -> None:
    inner = Pipeline(deltars, str(tmp_path_factory.mktemp("inner")), Config.of(window=2, allowed_lateness=0))
    api = declaring(inner, spark)
    land_then_run(inner, Record("s", "s1", 1, "k"), *[Record("r", f"r{t}", t, "k") for t in range(2, 12)])
    assert inner.buffer_rows()["r_store"] == 10  # S's watermark stays at 1: every r may still meet an s
    assert api.advance("s", 10) == "s: no record older than 10 will come; the next run takes it as S's watermark"
    inner.run()
    assert inner.buffer_rows()["r_store"] == 4  # S at 10: an r below 8 can meet no s any more
    land_then_run(inner, Record("s", "s9", 9, "k"))
    (late,) = inner.engine.read(inner.warehouse.late_arrivals).collect()
    assert late["reason"] == "ts below the watermark of S (S was declared complete up to 10 (lakejoin advance))"

    left = left_join(deltars, tmp_path_factory.mktemp("left"))
    api = declaring(left, spark)
    stopped_payments(left)
    api.advance("s", "7")
    left.run()
    assert rows(left) == Counter({Pair("r2", "s1", "S"): 1, Pair("r4", None, "R"): 1})  # 4 + 2 < 7: final; r8 waits
    assert warehouse_status(deltars, left.warehouse, left.config).declared == {"s": "7"}


def test_idle_after_is_a_duration_or_a_number_of_seconds_and_anything_else_is_refused_in_one_line() -> None:
    assert Config.of(relations={"s": {"idle_after": "15 minutes"}}).spec("s").idle_after == 900.0
    assert Config.of(relations={"s": {"idle_after": 30}}).spec("s").idle_after == 30.0
    with pytest.raises(
        LakejoinError,
        match=r"^config: relations.s.idle_after must be a duration such as '15 minutes' or a number of seconds, got 'soon'$",
    ):
        Config.of(relations={"s": {"idle_after": "soon"}})
