"""The one clock lakejoin reads for processing time (when a relation has gone idle, when progress was declared).

Everything that asks "what time is it" asks ``now()``, so a test sets the time with ``set_now`` (or, for a
``lakejoin`` process, ``LAKEJOIN_NOW``, an ISO-8601 instant) instead of waiting for it.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

NOW = "LAKEJOIN_NOW"
_set: datetime | None = None


def now() -> datetime:
    """The current time, in UTC: the one ``set_now`` gave, else ``LAKEJOIN_NOW``, else the system's."""
    if _set is not None:
        return _set
    given = os.environ.get(NOW)
    if given:
        moment = datetime.fromisoformat(given.replace("Z", "+00:00"))
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return datetime.now(timezone.utc)


def set_now(moment: datetime | None) -> None:
    """Make ``now()`` return ``moment`` (None: the real time again)."""
    global _set
    _set = moment


def micros(moment: datetime) -> int:
    """An instant as microseconds since the epoch (how the batch log records the times a plan used); one without
    a time zone is UTC, as lakejoin writes every time."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return int(aware.timestamp() * 1_000_000)
