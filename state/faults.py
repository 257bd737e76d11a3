"""Fault injection for tests: ``LAKEJOIN_CRASH_AT=before:gold`` makes a run die right before gold's write, and
``racing`` makes another writer commit to a table while a write to it is under way.

Every write of a batch is a step (``plan``, ``gold``, each state table, ``commit``); the variable names a
moment (``before`` or ``after``) and a step, or a moment inside one a write names itself (``reached``: ``opened:PATH``
once a write has read the table it commits to). Unset, as in production, it costs two dictionary lookups.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from state.phases import timed

CRASH_AT = "LAKEJOIN_CRASH_AT"
_RACERS: dict[str, Callable[[], None]] = {}


class InjectedCrash(BaseException):
    """Not an ``Exception``: nothing in lakejoin catches it, so the run stops as if the process died."""


@contextmanager
def step(name: str) -> Iterator[None]:
    """Mark one write of a batch, so a test can crash the run right before or right after it; its seconds are the
    phase ``name`` (state/phases.py)."""
    reached(f"before:{name}")
    with timed(name):
        yield
    reached(f"after:{name}")


def reached(point: str) -> None:
    """A run crashes here when the variable names ``point``; a racer waiting at ``point`` commits, once."""
    if os.environ.get(CRASH_AT) == point:
        raise InjectedCrash(point)
    if (racer := _RACERS.pop(point, None)) is not None:
        racer()


@contextmanager
def racing(racers: dict[str, Callable[[], None]]) -> Iterator[None]:
    """Each of ``racers`` (by point) runs once, when a write reaches its point: another writer of the table (an
    OPTIMIZE) that commits between the write's read of the table and its commit."""
    _RACERS.update(racers)
    try:
        yield
    finally:
        for point in racers:
            _RACERS.pop(point, None)
