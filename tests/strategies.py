"""Hypothesis helpers the tests share."""

from __future__ import annotations

from typing import TypeVar

from hypothesis import strategies as st

from tests.reference import Record

T = TypeVar("T")


def split(data: st.DataObject, order: list[T], most: int = 4) -> list[list[T]]:
    """``order`` cut into consecutive batches at up to ``most`` drawn places (one batch when it is that short)."""
    cuts = sorted(data.draw(st.sets(st.integers(1, len(order) - 1), max_size=most))) if len(order) > 1 else []
    return [order[start:end] for start, end in zip([0, *cuts], [*cuts, len(order)])]


def two_streams(latest: int = 6, most: int = 10) -> st.SearchStrategy[list[Record]]:
    """1 to ``most`` records of r and s, event times 0 to ``latest`` on two keys: dense enough that records match,
    tie and arrive after what they match; ids in creation order."""
    drawn = st.builds(
        Record,
        relation=st.sampled_from(["r", "s"]),
        id=st.just(""),
        ts=st.integers(0, latest),
        key=st.sampled_from(["a", "b"]),
    )
    return st.lists(drawn, min_size=1, max_size=most).map(
        lambda recs: [Record(rec.relation, f"{rec.relation}{i:02d}", rec.ts, rec.key) for i, rec in enumerate(recs)]
    )
