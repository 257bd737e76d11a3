"""The pure-Python reference against docs/design.md's worked example and the batch join, over many cases."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import Pair, Record, batch_join, join_in_arrival_order

R2, R4, R8 = (Record("r", f"r{ts}", ts, "k") for ts in (2, 4, 8))
S1, S7 = (Record("s", f"s{ts}", ts, "k") for ts in (1, 7))

SIX_PAIRS = Counter(
    [
        Pair("r2", "s1", "S"),
        Pair("r4", "s1", "S"),
        Pair("r8", "s1", "S"),
        Pair("r8", "s7", "S"),
        Pair("r2", "s7", "R"),
        Pair("r4", "s7", "R"),
    ]
)


def test_every_order_of_the_worked_example_gives_the_same_six_pairs():
    for order in ([S1, R2, R4, S7, R8], [S1, R2, R4, R8, S7], [S1, R2, S7, R4, R8], [R8, S7, R4, R2, S1]):
        assert Counter(join_in_arrival_order(order)) == SIX_PAIRS


def test_a_delayed_probe_leaves_the_newer_pair_to_the_other_store():
    pairs = join_in_arrival_order([S1, R2, R4, R8, S7])
    assert Pair("r8", "s7", "S") in pairs  # by the delayed store of s7, not the probe of r8


records = st.lists(
    st.builds(
        Record,
        relation=st.sampled_from(["r", "s"]),
        id=st.just(""),
        ts=st.integers(0, 6),
        key=st.one_of(st.none(), st.sampled_from(["a", "b", "c"])),
    ),
    max_size=14,
).map(lambda recs: [Record(rec.relation, f"{rec.relation}{i}", rec.ts, rec.key) for i, rec in enumerate(recs)])


@settings(max_examples=400, deadline=None)
@given(data=st.data(), recs=records)
def test_any_arrival_order_equals_the_batch_join_with_owners(data, recs):
    order = data.draw(st.permutations(recs))
    assert Counter(join_in_arrival_order(order)) == Counter(batch_join(recs))


@settings(max_examples=200, deadline=None)
@given(data=st.data(), recs=records)
def test_non_equi_predicates_hold_too(data, recs):
    def predicate(r: Record, s: Record) -> bool:
        return r.key is not None and s.key is not None and r.key < s.key

    order = data.draw(st.permutations(recs))
    assert Counter(join_in_arrival_order(order, predicate)) == Counter(batch_join(recs, predicate))
