"""Joins whose rows wait to be final (docs/design.md section 2.9), on the pure-Python reference: outer, semi and anti
joins against the batch SQL join of each kind, the as-of join against pandas' ``merge_asof``; worked examples."""

from __future__ import annotations

from collections import Counter

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import Pair, Record, late_in_batches, within
from tests.reference_final import KINDS, asof_in_batches, join_kind_in_batches
from tests.strategies import split

FAR = 10**6  # a time every watermark passes once records this late in time arrive: everything before is final


def flushed(batches: list[list[Record]]) -> list[list[Record]]:
    """``batches`` and one more whose records (keys that match nothing) push both watermarks past every record."""
    return [*batches, [Record("r", "r~", FAR, None), Record("s", "s~", FAR, "~")]]


def sql_join(records: list[Record], kind: str, predicate) -> list[Pair]:  # noqa: ANN001 - (r, s) -> bool
    """The batch SQL join of ``kind`` (LEFT/RIGHT/FULL OUTER, LEFT SEMI, LEFT ANTI), as gold rows."""
    rs = [rec for rec in records if rec.relation == "r"]
    ss = [rec for rec in records if rec.relation == "s"]
    matches = [(r, s) for r in rs for s in ss if predicate(r, s)]
    matched = {rec.id for pair in matches for rec in pair}
    pairs = [Pair(r.id, s.id, "R" if r.older_than(s) else "S") for r, s in matches]
    left_rows = [Pair(r.id, None, "R") for r in rs if r.id not in matched]
    right_rows = [Pair(None, s.id, "S") for s in ss if s.id not in matched]
    return {
        "inner": pairs,
        "left": pairs + left_rows,
        "right": pairs + right_rows,
        "full": pairs + left_rows + right_rows,
        "semi": [Pair(r.id, None, "R") for r in rs if r.id in matched],
        "anti": left_rows,
    }[kind]


def real(rows: list[Pair]) -> Counter:
    return Counter(row for row in rows if "~" not in f"{row.r_id}{row.s_id}")


# The design doc's worked example: R = {r2, r4, r8}, S = {s1, s7}, one key; with a window of 2, r4 matches nothing.
R2, R4, R8 = (Record("r", f"r{ts}", ts, "k") for ts in (2, 4, 8))
S1, S7 = (Record("s", f"s{ts}", ts, "k") for ts in (1, 7))


def per_batch(order: list[Record], kind: str) -> list[list[Pair]]:
    """Rows each one-record batch emits (lateness 0, window 2)."""
    emitted = []
    for n in range(1, len(order) + 1):
        rows, _ = join_kind_in_batches([[rec] for rec in order[:n]], kind, within(2), lateness=0, window=2)
        emitted.append(rows[len([row for batch in emitted for row in batch]) :])
    return emitted


def test_the_worked_example_as_a_left_join_emits_r4_once_s7_makes_it_final():
    # r4 can match an s up to ts 6; S's watermark passes 6 when s7 arrives, so r4's row comes with s7's batch.
    assert per_batch([S1, R2, R4, S7, R8], "left") == [
        [],
        [Pair("r2", "s1", "S")],
        [],
        [Pair("r4", None, "R")],
        [Pair("r8", "s7", "S")],
    ]


def test_the_worked_example_as_a_full_join_in_any_order_has_the_same_rows():
    expected = Counter([Pair("r2", "s1", "S"), Pair("r8", "s7", "S"), Pair("r4", None, "R")])
    for order in ([S1, R2, R4, S7, R8], [S1, R2, R4, R8, S7], [R8, S7, R4, R2, S1]):
        rows, waiting = join_kind_in_batches(
            flushed([[rec] for rec in order]), "full", within(2), lateness=10, window=2
        )
        assert real(rows) == expected
        assert [rec.id for rec in waiting.waiting["r"] + waiting.waiting["s"]] == ["r~", "s~"]


def test_a_record_is_not_final_while_the_other_watermark_is_within_the_window():
    # s1 arrives, then r4: r4 could still meet an s up to ts 6, and S's watermark is 1 - 0 = 1.
    rows, finality = join_kind_in_batches([[S1], [R4]], "left", within(2), lateness=0, window=2)
    assert rows == [] and finality.waiting["r"] == [R4]


def test_a_record_exactly_at_its_cutoff_still_waits():
    # S's watermark is 6 after the first batch, so r4 (window 2) could still meet an s at ts 6: it is not final yet.
    first = [Record("r", "r4", 4, "k"), Record("s", "s6a", 6, "z")]
    rows, _ = join_kind_in_batches([first, [Record("s", "s6b", 6, "k")]], "left", within(2), lateness=0, window=2)
    assert rows == [Pair("r4", "s6b", "R")]


def test_a_semi_row_comes_at_the_first_match_only():
    rows, _ = join_kind_in_batches(
        [[R4], [Record("s", "s3", 3, "k")], [Record("s", "s5", 5, "k")]], "semi", within(2), lateness=5, window=2
    )
    assert rows == [Pair("r4", None, "R")]


records = st.lists(
    st.builds(
        Record,
        relation=st.sampled_from(["r", "s"]),
        id=st.just(""),
        ts=st.integers(0, 9),
        key=st.one_of(st.none(), st.sampled_from(["a", "b"])),
    ),
    max_size=12,
).map(lambda recs: [Record(rec.relation, f"{rec.relation}{i}", rec.ts, rec.key) for i, rec in enumerate(recs)])


@settings(max_examples=400, deadline=None)
@given(data=st.data(), recs=records, kind=st.sampled_from(KINDS), lateness=st.integers(0, 4), window=st.integers(0, 3))
def test_every_kind_gives_the_batch_sql_join_of_what_was_not_late_each_row_once(data, recs, kind, lateness, window):
    batches = split(data, data.draw(st.permutations(recs)))
    late = late_in_batches(batches, lateness)
    rows, _ = join_kind_in_batches(flushed(batches), kind, within(window), lateness, window)
    assert real(rows) == Counter(sql_join([rec for rec in recs if rec not in late], kind, within(window)))


def test_an_outer_join_keeps_its_state_flat_on_a_long_stream():
    stream = [
        Record(rel, f"{rel}{t}", t, f"k{t % 7}") for t in range(400) for rel in ("r", "s") if (t + (rel == "s")) % 3
    ]
    rows, finality = join_kind_in_batches(
        [stream[i : i + 20] for i in range(0, len(stream), 20)], "full", within(3), lateness=2, window=3
    )
    assert sum(len(waiting) for waiting in finality.waiting.values()) <= 2 * (3 + 2 + 20)
    assert any(row.s_id is None for row in rows) and any(row.r_id is None for row in rows)


# The as-of join: each left record with the latest right record of its key at or before its time.

A_KEYS = st.sampled_from(["a", "b"])
asof_records = st.lists(
    st.builds(Record, relation=st.sampled_from(["r", "s"]), id=st.just(""), ts=st.integers(0, 9), key=A_KEYS),
    max_size=12,
).map(lambda recs: [Record(rec.relation, f"{rec.relation}{i:02d}", rec.ts, rec.key) for i, rec in enumerate(recs)])


def merge_asof(records: list[Record], tolerance: int | None, keep_unmatched: bool) -> list[Pair]:
    """pandas' backward ``merge_asof`` by key, exact times allowed; equal right times ordered by id (the total order)."""
    left = pd.DataFrame(
        [(r.id, r.ts, r.key) for r in records if r.relation == "r"], columns=["r_id", "ts", "key"]
    ).sort_values("ts")
    right = pd.DataFrame(
        [(s.id, s.ts, s.key) for s in records if s.relation == "s"], columns=["s_id", "ts", "key"]
    ).sort_values(["ts", "s_id"])
    if left.empty:
        return []
    if right.empty:
        return [Pair(r_id, None, "R") for r_id in left["r_id"]] if keep_unmatched else []
    merged = pd.merge_asof(
        left, right, on="ts", by="key", direction="backward", allow_exact_matches=True, tolerance=tolerance
    )
    return [
        Pair(row.r_id, None if pd.isna(row.s_id) else row.s_id, "R")
        for row in merged.itertuples()
        if keep_unmatched or not pd.isna(row.s_id)
    ]


def test_an_asof_match_that_arrives_after_its_left_record_is_taken():
    q3 = Record("s", "s3", 3, "k")
    rows, _ = asof_in_batches(flushed([[Record("s", "s1", 1, "k")], [R4], [q3]]), lateness=3)
    assert real(rows) == Counter([Pair("r4", "s3", "R")])


def test_several_right_updates_in_one_batch_and_an_equal_time_take_the_latest():
    updates = [Record("s", f"s{n}", ts, "k") for n, ts in ((1, 2), (2, 4), (3, 4), (4, 5))]
    rows, _ = asof_in_batches(flushed([[R4, *updates]]), lateness=0)
    assert real(rows) == Counter([Pair("r4", "s3", "R")])  # ts 4 equals r4's; of s2 and s3 the total order takes s3


def test_a_left_record_at_the_right_watermark_waits_for_an_equal_time_right_record():
    # S's watermark is 5 (lateness 0): an s at ts 5 may still come, and the later one wins the tie by id.
    r5, s1, s2 = Record("r", "r5", 5, "k"), Record("s", "s1", 5, "k"), Record("s", "s2", 5, "k")
    rows, held = asof_in_batches([[s1], [r5], [s2]], lateness=0)
    assert (
        rows == [] and held[-1] == 2
    )  # r5 waits; s2 supersedes s1 at the floor (equal time, later id): as state/join/asof.py
    assert real(asof_in_batches(flushed([[s1], [r5], [s2]]), lateness=0)[0]) == Counter([Pair("r5", "s2", "R")])


def test_tolerance_and_the_left_variant_keep_a_row_without_a_match():
    rows, _ = asof_in_batches(flushed([[Record("s", "s1", 1, "k"), R4]]), lateness=0, tolerance=2, keep_unmatched=True)
    assert real(rows) == Counter([Pair("r4", None, "R")])


def test_a_right_record_stays_while_a_left_record_within_tolerance_may_still_come():
    # After the first batch the left watermark is 4: a left at ts 4 may still come, and s2 is within 2 of it.
    first = [Record("r", "r4a", 4, "z"), Record("s", "s2", 2, "k")]
    rows, _ = asof_in_batches(flushed([first, [Record("r", "r4b", 4, "k")]]), lateness=0, tolerance=2)
    assert real(rows) == Counter([Pair("r4b", "s2", "R")])


@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    recs=asof_records,
    lateness=st.integers(0, 4),
    tolerance=st.one_of(st.none(), st.integers(0, 3)),
    keep=st.booleans(),
)
def test_the_asof_join_gives_merge_asof_of_what_was_not_late_each_left_once(data, recs, lateness, tolerance, keep):
    batches = split(data, data.draw(st.permutations(recs)))
    late = late_in_batches(batches, lateness)
    rows, _ = asof_in_batches(flushed(batches), lateness, tolerance, keep)
    assert real(rows) == Counter(merge_asof([rec for rec in recs if rec not in late], tolerance, keep))


def test_the_asof_join_keeps_its_state_flat_on_a_long_stream():
    stream = [Record(rel, f"{rel}{t:04d}", t, f"k{t % 5}") for t in range(1000) for rel in ("r", "s")]
    _, held = asof_in_batches([stream[i : i + 40] for i in range(0, len(stream), 40)], lateness=3)
    assert max(held) == max(held[:5])
