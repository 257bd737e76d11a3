"""Fault injection for tests: ``LAKEJOIN_CRASH_AT=before:gold`` makes a run die right before gold's write.

Every write of a batch is a step (``plan``, ``gold``, each state table, ``commit``); the variable names a
moment (``before`` or ``after``) and a step, or a moment inside one a write names itself (``reached``). Unset, as in
production, it costs one dictionary lookup.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from state.phases import timed

CRASH_AT = "LAKEJOIN_CRASH_AT"


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
    """A run crashes here when the variable names ``point``."""
    if os.environ.get(CRASH_AT) == point:
        raise InjectedCrash(point)
