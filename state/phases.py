"""Seconds per phase of a micro-batch, so a run (and the benchmarks) show where a batch's time goes.

A phase is a read, the rules, the join, or one write (``state.faults.step`` times each). A batch's writes run
at once on threads, so its phases overlap: their seconds may add up to more than the batch's.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

_seconds: Counter[str] = Counter()
_guard = threading.Lock()


@contextmanager
def timed(phase: str) -> Iterator[None]:
    """Add the wall-clock seconds of the block to ``phase`` (also when it raises)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        with _guard:
            _seconds[phase] += time.perf_counter() - started


def take() -> dict[str, float]:
    """The seconds of every phase since the last ``take``, which starts counting again."""
    with _guard:
        taken = dict(_seconds)
        _seconds.clear()
    return taken
