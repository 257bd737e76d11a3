"""Spans of time as the config gives them: an integer, or a duration text such as ``"10 minutes"``."""

from __future__ import annotations

import re
from datetime import timedelta

from state.errors import LakejoinError

_UNITS = {
    "microsecond": timedelta(microseconds=1),
    "millisecond": timedelta(milliseconds=1),
    "second": timedelta(seconds=1),
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
    "week": timedelta(weeks=1),
}
_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]+?)s?\s*$")


def duration(value: object, setting: str) -> int | timedelta:
    """A config span: an integer (integer event time) or a duration text such as ``"10 minutes"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, timedelta) and value >= timedelta(0):
        return value
    match = _DURATION.match(value.lower()) if isinstance(value, str) else None
    if match is None or match.group(2) not in _UNITS:
        raise LakejoinError(
            f"config: {setting!r} must be a non-negative integer (integer event time) or a duration such as "
            f"'10 minutes' (units: {', '.join(_UNITS)}), got {value!r}"
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


def describe_span(span: int | timedelta) -> str:
    if isinstance(span, int):
        return str(span)
    for unit, size in reversed(_UNITS.items()):
        if span % size == timedelta(0):
            count = span // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return str(span)
