"""Hypothesis helpers the tests share."""

from __future__ import annotations

from typing import TypeVar

from hypothesis import strategies as st

T = TypeVar("T")


def split(data: st.DataObject, order: list[T], most: int = 4) -> list[list[T]]:
    """``order`` cut into consecutive batches at up to ``most`` drawn places (one batch when it is that short)."""
    cuts = sorted(data.draw(st.sets(st.integers(1, len(order) - 1), max_size=most))) if len(order) > 1 else []
    return [order[start:end] for start, end in zip([0, *cuts], [*cuts, len(order)])]
