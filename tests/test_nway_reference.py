"""The N-way store/probe protocol of docs/design.md section 2.8, on the pure-Python reference: worked three-way
orders, and properties over 3 and 4 relations (arrival orders, batch splits, bounded state)."""

from __future__ import annotations

from collections import Counter
from itertools import product

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import (
    Match,
    Record,
    banded,
    eviction_cutoff,
    join_all,
    join_each_record,
    join_in_batches,
    late_in_batches,
    produced_per_arrival,
    respects_lateness,
)
from tests.strategies import split

THREE = ("trades", "quotes", "news")


def rec(name: str, ts: int, key: str = "k") -> Record:
    return Record(name, f"{name[0]}{ts}", ts, key, rank=THREE.index(name))


T2, T6, Q4, N1, N5 = rec("trades", 2), rec("trades", 6), rec("quotes", 4), rec("news", 1), rec("news", 5)


def match(t: Record, q: Record, n: Record, owner: str) -> Match:
    return Match((("trades", t.id), ("quotes", q.id), ("news", n.id)), owner)


# All five share a key: four tuples, each owned by the relation of its oldest member.
A = match(T2, Q4, N1, "news")
B = match(T2, Q4, N5, "trades")
C = match(T6, Q4, N1, "news")
D = match(T6, Q4, N5, "quotes")


def produced(order: list[Record]) -> dict[str, Counter]:
    return {record.id: Counter(found) for record, found in produced_per_arrival(order, THREE) if found}


def test_in_time_order_each_tuple_comes_from_its_last_member_probing_the_owners_store():
    assert produced([N1, T2, Q4, N5, T6]) == {
        "q4": Counter([A]),  # q4 probes the news store: n1 stored, t2 in its probe buffer
        "n5": Counter([B]),  # n5 probes the trades store: t2 stored, q4 in its probe buffer
        "t6": Counter([C, D]),  # t6 probes the news store (n1 oldest) and the quotes store (q4 oldest)
    }


def test_a_delayed_probe_completes_at_each_owner_and_not_at_the_store_of_a_newer_record():
    # n5 arrives after t6, which is newer: the trades store does not join n5 with t6; (t6, q4, n5) is the quotes store's.
    assert produced([N1, T2, Q4, T6, N5]) == {"q4": Counter([A]), "t6": Counter([C]), "n5": Counter([B, D])}


def test_a_delayed_store_of_the_middle_member_produces_every_tuple_once():
    # q4 arrives last: it probes the news and trades stores (A, C, B) and, as the oldest of (t6, q4, n5), its own
    # store joins the buffered probes newer than it (D).
    assert produced([N1, T2, N5, T6, Q4]) == {"q4": Counter([A, B, C, D])}


def test_every_order_of_the_three_way_example_gives_the_same_four_tuples():
    for order in ([N1, T2, Q4, N5, T6], [T6, N5, Q4, T2, N1], [Q4, T6, N1, N5, T2], [N5, T2, T6, N1, Q4]):
        assert Counter(join_each_record(order, THREE)) == Counter([A, B, C, D])


def test_equal_times_are_ordered_by_the_listed_relations():
    t, q, n = rec("trades", 3), rec("quotes", 3), rec("news", 3)
    assert join_each_record([n, q, t], THREE) == [match(t, q, n, "trades")]


def test_for_two_relations_the_cutoffs_are_those_of_the_two_way_join():
    marks = {"r": 10, "s": 20}
    assert eviction_cutoff("r", "r", ("r", "s"), marks, 3) == 17  # r's store: s's watermark minus the window
    assert eviction_cutoff("r", "s", ("r", "s"), marks, None) == 10  # r's probes: r's watermark, window or not


def test_with_three_relations_a_probe_stays_without_a_window():
    # A stored trade older than a buffered quote can still meet any future news record.
    assert eviction_cutoff("trades", "quotes", THREE, {"trades": 10, "quotes": 10, "news": 10}, None) is None
    assert eviction_cutoff("trades", "quotes", THREE, {"trades": 10, "quotes": 10, "news": 30}, 5) == 10
    assert eviction_cutoff("trades", "quotes", THREE, {"trades": 10, "quotes": 10, "news": 12}, 5) == 7


def abcd(spec: str) -> list[Record]:
    """Records written ``a0 b1 c9``: relation letter, then ts; all share a key."""
    return [Record(word[0], word, int(word[1:]), "k", rank="abcd".index(word[0])) for word in spec.split()]


def test_a_stored_record_waits_for_the_slowest_other_relation():
    # After the first batch b is far ahead of a0's window but c is not: c2 still completes (a0, b1, c2).
    first, second = abcd("a0 b1 c0 b8"), abcd("c2")
    found, _ = join_in_batches([first, second], "abc", banded(2), lateness=0, window=2)
    assert Counter(found) == expected_tuples(first + second, "abc", 2)
    assert Match((("a", "a0"), ("b", "b1"), ("c", "c2")), "a") in found


def test_a_probe_waits_for_the_slowest_third_relation():
    # a's watermark is past b1 (no future a is older than it) and c is far ahead, but d is not: d2 completes
    # (a0, b1, c2, d2) at a's store, from b1 and c2 in its probe buffers.
    first, second = abcd("a0 b1 c2 c9 d0 a5"), abcd("d2")
    found, _ = join_in_batches([first, second], "abcd", banded(2), lateness=0, window=2)
    assert Counter(found) == expected_tuples(first + second, "abcd", 2)
    assert Match((("a", "a0"), ("b", "b1"), ("c", "c2"), ("d", "d2")), "a") in found


def test_records_exactly_at_a_cutoff_stay():
    # a0 + window 2 equals the slowest other watermark (2): a b at ts 2 may still come, and completes (a0, b2b, c2).
    first, second = abcd("a0 b2 c2"), [Record("b", "b2b", 2, "k", rank=1)]
    found, _ = join_in_batches([first, second], "abc", banded(2), lateness=0, window=2)
    assert Counter(found) == expected_tuples(first + second, "abc", 2)
    # b5 equals a's watermark and c8 - window 3: an a at ts 5 may still come, older than b5 by rank.
    first, second = abcd("a5 b5 c8"), [Record("a", "a5b", 5, "k", rank=0)]
    found, _ = join_in_batches([first, second], "abc", banded(3), lateness=0, window=3)
    assert Counter(found) == expected_tuples(first + second, "abc", 3)
    assert Match((("a", "a5b"), ("b", "b5"), ("c", "c8")), "a") in found


def relations_of(n: int) -> tuple[str, ...]:
    return tuple("abcd"[:n])


KEYS = st.one_of(st.none(), st.sampled_from(["x", "y"]))


@st.composite
def streams(draw, n: int, per_relation: int, keys: st.SearchStrategy = KEYS, latest: int = 8) -> list[Record]:  # noqa: ANN001 - hypothesis's draw
    """Up to ``per_relation`` records of each of ``n`` relations, keys drawn from ``keys``, times up to ``latest``."""
    names = relations_of(n)
    records = []
    for rank, name in enumerate(names):
        for i in range(draw(st.integers(0, per_relation))):
            records.append(Record(name, f"{name}{i}", draw(st.integers(0, latest)), draw(keys), rank=rank))
    return records


def expected_tuples(records: list[Record], names: str, window: int | None = None) -> Counter:
    """The N-way join written out on its own: one record per relation, one key, every two within the window;
    owned by the relation of the member with the least (ts, rank, id)."""
    by_relation = [[rec for rec in records if rec.relation == name] for name in names]
    found = Counter()
    for members in product(*by_relation):
        keys = {rec.key for rec in members}
        times = [rec.ts for rec in members]
        if None not in keys and len(keys) == 1 and (window is None or max(times) - min(times) <= window):
            owner = min(members, key=lambda rec: (rec.ts, rec.rank, rec.id)).relation
            found[Match(tuple((rec.relation, rec.id) for rec in members), owner)] += 1
    return found


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.sampled_from([3, 4]))
def test_any_arrival_order_gives_the_n_way_join_each_tuple_once_owned_by_its_oldest_member(data, n):
    records = data.draw(streams(n, 3 if n == 3 else 2))
    order = data.draw(st.permutations(records))
    assert Counter(join_each_record(order, relations_of(n))) == expected_tuples(records, relations_of(n))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.sampled_from([3, 4]))
def test_any_batch_split_gives_the_n_way_join(data, n):
    records = data.draw(streams(n, 3 if n == 3 else 2))
    batches = split(data, data.draw(st.permutations(records)))
    found, _ = join_in_batches(batches, relations_of(n))
    assert Counter(found) == expected_tuples(records, relations_of(n))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_non_equi_predicate_holds_for_three_relations(data):
    def rising(members: dict[str, Record]) -> bool:
        keys = [members[name].key for name in "abc"]
        return None not in keys and keys[0] <= keys[1] <= keys[2] and keys[0] != keys[2]

    records = data.draw(streams(3, 3))
    batches = split(data, data.draw(st.permutations(records)))
    expected = Counter(join_all(records, "abc", rising))
    assert Counter(join_each_record(data.draw(st.permutations(records)), "abc", rising)) == expected
    assert Counter(join_in_batches(batches, "abc", rising)[0]) == expected


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.sampled_from([3, 4]), lateness=st.integers(0, 3), window=st.integers(0, 4))
def test_bounded_buffers_give_the_join_of_what_was_not_late(data, n, lateness, window):
    records = data.draw(streams(n, 3 if n == 3 else 2))
    batches = split(data, data.draw(st.permutations(records)))
    late = late_in_batches(batches, lateness)
    kept = [record for record in records if record not in late]
    found, _ = join_in_batches(batches, relations_of(n), banded(window), lateness, window)
    assert Counter(found) == expected_tuples(kept, relations_of(n), window)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.sampled_from([3, 4]), lateness=st.integers(0, 2), window=st.integers(0, 3))
def test_bounded_buffers_hold_on_one_key_in_small_batches(data, n, lateness, window):
    # Every record shares the key and most batches hold one record: each cutoff is tested against many watermarks.
    records = data.draw(streams(n, 3, keys=st.just("k"), latest=6))
    batches = split(data, data.draw(st.permutations(records)), most=len(records))
    kept = [record for record in records if record not in late_in_batches(batches, lateness)]
    found, _ = join_in_batches(batches, relations_of(n), banded(window), lateness, window)
    assert Counter(found) == expected_tuples(kept, relations_of(n), window)


def test_a_long_three_way_stream_keeps_its_state_flat():
    # 300 records per relation in time order, one per relation at each time, 10 keys in turn; batches of 30.
    records = [
        Record(name, f"{name}{t}", t, f"k{t % 10}", rank=rank) for t in range(300) for rank, name in enumerate("abc")
    ]
    assert respects_lateness(records, 2)
    batches = [records[i : i + 30] for i in range(0, len(records), 30)]
    found, held = join_in_batches(batches, "abc", banded(12), lateness=2, window=12)
    # Records of different keys never join: the one-shot join key by key is the whole join, and quick.
    expected = sum(
        (expected_tuples([r for r in records if r.key == key], "abc", 12) for key in {r.key for r in records}),
        Counter(),
    )
    assert Counter(found) == expected and len(expected) > 300
    assert max(held) == max(held[:5])  # what the first batches hold is all any batch holds
