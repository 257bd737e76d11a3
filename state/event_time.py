"""Event time on one integer axis, whatever its type (docs/design.md section 2.7).

A relation's event time may be a TIMESTAMP, a DATE or an integer. Ingest records it as it is, and also as
``_ts``, a number on the axis of its kind: microseconds since the epoch for timestamps, days since the epoch
for dates, the value itself for integers. Watermarks, eviction cutoffs, owners and the total order all work
on ``_ts``, so they are the same code for every kind; durations in the config ("10 minutes") are converted
to the axis once, when a run starts.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone

from pyspark.sql.types import (
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    TimestampNTZType,
    TimestampType,
)

from state.engines.table import Table
from state.errors import LakejoinError
from state.join.relations import Relation
from state.names import literal
from state.spans import describe_span

TIMESTAMP, DATE, INTEGER = "timestamp", "date", "integer"
# The Spark type each kind is kept as in bronze.
STORED_TYPE: dict[str, DataType] = {TIMESTAMP: TimestampType(), DATE: DateType(), INTEGER: LongType()}
INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
INTEGER_TEXT = r"^[+-]?[0-9]+$"
DATE_TEXT = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def kind_of(data_type: DataType) -> str | None:
    """The kind a stored column's type gives its event time; None for a type that is no event time."""
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        return TIMESTAMP
    if isinstance(data_type, DateType):
        return DATE
    if isinstance(data_type, INTEGRAL):
        return INTEGER
    return None


def as_event_time(value: str, kind: str) -> str:
    """``value`` (SQL, of any type; text as ISO-8601 or digits) as the kind's stored type; null where it does not
    parse."""
    text = f"trim(CAST({value} AS STRING))"
    if kind == INTEGER:
        return f"CASE WHEN {text} RLIKE {literal(INTEGER_TEXT)} THEN try_cast({text} AS BIGINT) END"
    # Spark would read "2026" as a year and cut the time off "2026-01-02T23:30:00+05:00" for a date: neither is kept.
    readable = f"{text} RLIKE {literal(DATE_TEXT)}" if kind == DATE else f"NOT ({text} RLIKE {literal(INTEGER_TEXT)})"
    return f"CASE WHEN {readable} THEN try_cast({value} AS {STORED_TYPE[kind].simpleString()}) END"


def on_axis(stored: str, kind: str) -> str:
    """A stored event time (SQL) as its number on the axis (``_ts``)."""
    if kind == TIMESTAMP:
        return f"unix_micros(CAST({stored} AS TIMESTAMP))"
    if kind == DATE:
        return f"CAST(unix_date({stored}) AS BIGINT)"
    return f"CAST({stored} AS BIGINT)"


def span_on_axis(span: int | timedelta, kind: str, setting: str) -> int:
    """``span`` in the axis units of ``kind``; a duration for integer time (or a non-zero integer for timestamps and
    dates) is a config error."""
    if kind == INTEGER:
        if isinstance(span, timedelta):
            raise LakejoinError(
                f"config: {setting!r} is a duration ({describe_span(span)}) but the event time is an integer: "
                "give it in the event time's own units, as an integer"
            )
        return span
    if span == 0:  # zero is zero in any unit
        return 0
    if not isinstance(span, timedelta):
        raise LakejoinError(
            f"config: {setting!r} is the integer {span} but the event time is a {kind}: give a duration such as '10 "
            "minutes'"
        )
    if kind == DATE:
        if span % timedelta(days=1):
            raise LakejoinError(
                f"config: {setting!r} is {describe_span(span)} but the event time is a date: give whole days"
            )
        return span.days
    return span // timedelta(microseconds=1)


def render_span(value: int, kind: str | None) -> str:
    """A span on the axis as the config would give it (``10 minutes`` for timestamps, an integer for integer time)."""
    if kind == TIMESTAMP:
        return describe_span(timedelta(microseconds=value))
    if kind == DATE:
        return describe_span(timedelta(days=value))
    return str(value)


def bronze_kind(bronze: dict[Relation, Table], event_times: dict[str, str]) -> str | None:
    """The kind of event time the warehouse's bronze tables hold (``event_times``: relation -> its column); None
    before anything landed. Ingest keeps every relation on one kind."""
    for rel, table in bronze.items():
        schema = table.schema()
        if schema is not None and event_times[rel.name] in schema.fieldNames():
            return kind_of(schema[event_times[rel.name]].dataType)
    return None


def on_axis_value(value: object, kind: str | None, setting: str) -> int:
    """An event time a user gives (an integer, a date, a timestamp or their ISO-8601 text) on the axis of ``kind``
    (None: bronze holds none yet, so the value's own kind)."""
    text = value.isoformat() if isinstance(value, (date, datetime)) else str(value).strip()
    if re.match(INTEGER_TEXT, text) and kind in (None, INTEGER):
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise LakejoinError(
            f"{setting} {value!r} is not an event time: give an ISO-8601 timestamp or date, or an integer for integer "
            "event time"
        ) from None
    if kind == INTEGER:
        raise LakejoinError(f"{setting} {value!r} is a time, but the event time is an integer: give an integer")
    if kind == DATE:
        return (moment.date() - date(1970, 1, 1)).days
    aware = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
    return (aware - _EPOCH) // timedelta(microseconds=1)


def render(value: int | None, kind: str | None) -> str | None:
    """A number on the axis as the user's event time reads (a watermark in ``status`` and quarantine reasons)."""
    if value is None or kind in (None, INTEGER):
        return None if value is None else str(value)
    if kind == DATE:
        return (date(1970, 1, 1) + timedelta(days=value)).isoformat()
    return (_EPOCH + timedelta(microseconds=value)).isoformat().replace("+00:00", "Z")
