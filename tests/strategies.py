"""Hypothesis helpers the reference tests share."""

from __future__ import annotations

from hypothesis import strategies as st

from tests.reference import Record


def split(data: st.DataObject, order: list[Record], most: int = 4) -> list[list[Record]]:
    """``order`` cut into consecutive non-empty batches at up to ``most`` drawn places."""
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=most)))
    bounds = [0, *cuts, len(order)]
    return [order[a:b] for a, b in zip(bounds, bounds[1:]) if a < b]
