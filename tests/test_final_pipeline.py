"""Outer, semi and anti joins on the pipeline (docs/design.md section 2.9): each unmatched record's row once, in the
batch whose watermark makes it final; a semi row at the first match; the same rows whatever the arrival order, the
batch split or a crash, and the batch SQL join of each kind in the end."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expectations.reconcile import check_gold
from pipelines.commands.status import warehouse_status
from state.config import Config
from state.errors import LakejoinError
from tests.helpers import Pipeline, copied, crash_at_each
from tests.reference import Pair, Record, within
from tests.reference_final import join_kind_in_batches
from tests.strategies import split, two_streams
from tests.test_final_reference import FAR, R2, R4, R8, S1, S7, sql_join

PROPERTY = settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
WORKED = [S1, R2, R4, S7, R8]  # the design doc's worked example, one record per batch


def outer(engine, root, kind: str, lateness: int = 0, window: int = 2) -> Pipeline:  # noqa: ANN001 - an engine, a path
    return Pipeline(engine, str(root), Config.of(join=kind, window=window, allowed_lateness=lateness))


def rows(pipeline: Pipeline) -> Counter[Pair]:
    """Gold as (r id, s id, owner); a semi or anti gold has no s columns."""
    return Counter(Pair(row["_r_id"], row.get("_s_id"), row["owner"]) for row in pipeline.gold_rows())


def rows_by_batch(pipeline: Pipeline) -> dict[int, set[Pair]]:
    emitted: dict[int, set[Pair]] = {}
    for row in pipeline.gold_rows():
        emitted.setdefault(row["batch_id"], set()).add(Pair(row["_r_id"], row.get("_s_id"), row["owner"]))
    return emitted


def one_by_one(pipeline: Pipeline, order: list[Record]) -> None:
    for rec in order:
        pipeline.land([rec])
        pipeline.run(max_batch_rows=1)


def test_the_worked_example_as_a_left_join_writes_r4_with_s7s_batch_and_nothing_for_r8_yet(deltars, tmp_path):
    pipeline = outer(deltars, tmp_path, "left")
    one_by_one(pipeline, WORKED[:3])
    waiting = warehouse_status(deltars, pipeline.warehouse, pipeline.config).waiting
    assert waiting == [
        {"relation": "r", "records": 1, "oldest": "4", "until": "S's watermark passes 6"}
    ]  # r4; r2 matched s1
    one_by_one(pipeline, WORKED[3:])
    # r4 could meet an s up to ts 6: S's watermark passes 6 when s7 arrives (batch 4). r8 waits for S past 10.
    assert rows_by_batch(pipeline) == {
        2: {Pair("r2", "s1", "S")},
        4: {Pair("r4", None, "R")},
        5: {Pair("r8", "s7", "S")},
    }
    unmatched = next(row for row in pipeline.gold_rows() if row["_s_id"] is None)
    assert (unmatched["r_id"], unmatched["r_ts"], unmatched["s_id"], unmatched["s_ts"], unmatched["owner"]) == (
        "r4",
        4,
        None,
        None,
        "R",
    )
    stored = {
        row["id"]: row["_matched"]
        for row in deltars.read(pipeline.warehouse.buffers()["r_state"]).where("_in_store").collect()
    }
    assert stored == {"r8": True}  # r2 and r4 evicted once final; r8 matched s7 and waits only to be evicted


def test_on_delta_spark_the_worked_example_as_a_full_join_gives_every_row_and_validates(spark_engine, tmp_path):
    pipeline = outer(spark_engine, tmp_path, "full")
    pipeline.land([*WORKED, Record("r", "r30", 30, "x"), Record("s", "s40", 40, "y")])
    pipeline.run(max_batch_rows=2)
    # s1 and s7 matched; r4 final with s7 (batch 2), r8 matched; r30 final once S passes 32 (s40), s40 still waits.
    assert rows(pipeline) == Counter(
        [Pair("r2", "s1", "S"), Pair("r4", None, "R"), Pair("r8", "s7", "S"), Pair("r30", None, "R")]
    )
    check = check_gold(spark_engine, pipeline.warehouse, pipeline.config)
    assert check.passed, check.describe()


@PROPERTY
@given(
    data=st.data(),
    recs=two_streams(),
    kind=st.sampled_from(["left", "right", "full", "semi", "anti"]),
    lateness=st.integers(0, 3),
    window=st.integers(0, 2),
)
def test_any_arrival_order_and_batch_split_emits_each_row_once_when_final_and_ends_at_the_batch_sql_join(
    deltars, tmp_path_factory, data, recs, kind, lateness, window
):
    """Batch by batch, gold holds what the reference emits on the same batches (no row early, none twice); once
    both watermarks pass everything, gold is the batch SQL join of that kind of the records not late."""
    pipeline = outer(deltars, tmp_path_factory.mktemp(kind), kind, lateness, window)
    for landed in split(data, data.draw(st.permutations(recs)), most=3):
        pipeline.land(landed)
        pipeline.run(max_batch_rows=data.draw(st.integers(1, 6)))
    expected, _ = join_kind_in_batches(pipeline.batches(), kind, within(window), lateness, window)
    assert rows(pipeline) == Counter(expected)
    pipeline.land([Record("r", "r~", FAR, "~r"), Record("s", "s~", FAR, "~s")])  # keys that match nothing
    pipeline.run()
    late = pipeline.late_ids()
    assert rows(pipeline) == Counter(sql_join([rec for rec in recs if rec.id not in late], kind, within(window)))
    check = check_gold(deltars, pipeline.warehouse, pipeline.config)
    assert check.passed, check.describe()


def test_a_left_join_run_dying_at_each_write_in_turn_resumes_to_the_uninterrupted_result(
    deltars, tmp_path_factory, monkeypatch
):
    """One warehouse dies at every point of its batches in turn: the unmatched rows (gold) and the ``_matched`` marks
    (a store's MERGE) each land once."""
    order = [S1, R2, R4, S7, R8, Record("s", "s20", 20, "k"), Record("r", "r21", 21, "z")]
    uninterrupted = outer(deltars, tmp_path_factory.mktemp("uninterrupted"), "left")
    uninterrupted.land(order)
    crashed = copied(uninterrupted, tmp_path_factory.mktemp("crashed"))
    uninterrupted.run(max_batch_rows=2)
    steps = ["gold", "late_arrivals", "r_state", "s_state", "dq_quarantine", "commit"]
    crash_at_each(
        crashed, monkeypatch, [f"{moment}:{step}" for step in steps for moment in ("before", "after")], max_batch_rows=2
    )
    assert crashed.snapshot() == uninterrupted.snapshot()
    assert Pair("r4", None, "R") in rows(uninterrupted) and Pair("r8", "s7", "S") in rows(uninterrupted)


def test_a_full_join_keeps_its_state_flat_on_a_long_stream(deltars, tmp_path):
    """Every record leaves its store once final (its row written if it never matched): state stays a few windows'
    worth while gold gains matched and unmatched rows alike."""
    stream = [
        Record(rel, f"{rel}{t}", t, f"k{t % 5}") for t in range(60) for rel in ("r", "s") if (t + (rel == "s")) % 3
    ]
    pipeline = outer(deltars, tmp_path, "full", lateness=1, window=2)
    held = []
    for start in range(0, len(stream), 20):
        pipeline.land_chunk(stream[start : start + 20])
        pipeline.run(max_batch_rows=20)
        held.append(pipeline.state_rows())
    assert max(held) <= 2 * 2 * (2 + 1 + 10)  # per relation: store and probes, each within window + lateness + a chunk
    emitted = rows(pipeline)
    assert (
        any(row.s_id is None for row in emitted)
        and any(row.r_id is None for row in emitted)
        and any(row.r_id and row.s_id for row in emitted)
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"join": "left", "window": 2},
            "config: join: left emits each r record that never matches once no s record can still match it, which takes a 'window' and an 'allowed_lateness' for s: set both (without them that row is never final)",
        ),
        (
            {"join": "right", "allowed_lateness": 1},
            "config: join: right emits each s record that never matches once no r record can still match it, which takes a 'window' and an 'allowed_lateness' for r: set both (without them that row is never final)",
        ),
        (
            {"join": "anti", "relations": dict.fromkeys("abc"), "window": 1, "allowed_lateness": 1},
            "config: join: anti joins two relations (the first is left), got 3: a, b, c",
        ),
    ],
)
def test_a_join_whose_unmatched_rows_could_never_be_final_is_refused_in_one_line(settings, message):
    with pytest.raises(LakejoinError) as refused:
        Config.of(**settings)
    assert str(refused.value) == message


def test_a_semi_join_needs_no_window_and_writes_each_left_record_once_at_its_first_match(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(join="semi"))
    one_by_one(pipeline, [R4, Record("s", "s3", 3, "k"), Record("s", "s5", 5, "k"), Record("r", "r6", 6, "k")])
    assert rows_by_batch(pipeline) == {2: {Pair("r4", None, "R")}, 4: {Pair("r6", None, "R")}}
    assert {"_r_id", "r_id", "owner"} <= set(pipeline.gold_rows()[0]) and "_s_id" not in pipeline.gold_rows()[0]


def test_a_record_matched_after_it_was_stored_never_gives_an_unmatched_row(deltars, tmp_path):
    """r4 waits unmatched in its store; s5 matches it two batches later (the store's MERGE marks it); when S's
    watermark passes 6, r4 leaves its store with its pair already in gold and no row of its own."""
    pipeline = outer(deltars, tmp_path, "left")
    one_by_one(pipeline, [S1, R4, Record("s", "s5", 5, "k"), Record("s", "s9", 9, "k")])
    assert rows_by_batch(pipeline) == {3: {Pair("r4", "s5", "R")}}
    assert pipeline.state_rows() == 2 + 2  # s5 and s9 in S's store and R's probes: r4 is gone
