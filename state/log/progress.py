"""Idle relations and declared progress (docs/design.md section 2.12): watermarks that move without arrivals.

A relation with ``idle_after`` that has nothing waiting to be joined and no arrival for that long is **idle**: for
the finality of the other relations' rows and for eviction, its watermark is taken as the lowest watermark among
the relations that are not idle (Flink's rule). A user may **declare** that no record of X older than T will come
(``lakejoin advance``): T acts as X's watermark. Either way X's watermark only moves forward, and a record of X
that arrives below it later is late, with the reason.

Both are decided when a batch is planned, from the times the plan records (the clock, each idle relation's last
arrival, the declared progress), so a resumed batch decides the same way whatever the clock says then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa

from state.clock import micros
from state.engines import DeltaEngine
from state.engines.table import Table, Tables
from state.join.bounds import Watermarks, every_mark
from state.join.relations import Relation
from state.layout import Warehouse

DECLARED_SCHEMA = pa.schema(
    [
        ("relation", pa.string()),
        ("to", pa.int64()),
        ("declared", pa.string()),
        ("declared_at", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass(frozen=True)
class Progress:
    """What a plan decided about watermarks that move without arrivals."""

    clock: int | None = None  # the time the plan read, microseconds since the epoch
    idle: dict[str, int] = field(
        default_factory=dict
    )  # relation -> its last arrival, for the relations idle in the batch
    declared: dict[str, int] = field(default_factory=dict)  # relation -> declared progress, on the event-time axis


def decide(tables: Tables, idle_after: dict[Relation, float], joined_up_to: int, clock: datetime) -> Progress:
    """Which relations are idle at ``clock`` (``idle_after``: relation -> seconds; one with arrivals after
    ``joined_up_to`` in the arrival order, still to be joined, is not), and the progress declared so far."""
    last = last_arrivals(tables.ingest_log, tables.batches) if idle_after else {}
    now = micros(clock)
    idle = {
        rel.name: last[rel.name]
        for rel, seconds in idle_after.items()
        if rel.name in last
        and now - last[rel.name] >= seconds * 1_000_000
        and (tables.bronze[rel].max_value("_arrival_seq") or 0) <= joined_up_to
    }
    return Progress(now, idle, declared(tables.progress))


def moves(progress: Progress, marks: Watermarks, relations: Sequence[Relation]) -> bool:
    """Whether ``progress`` raises some watermark of ``marks``: then a batch of no arrivals is worth its commit."""
    return raised(marks, marks, progress, relations, {}, str)[0] != marks


def last_arrivals(ingest_log: Table, batches: Table) -> dict[str, int]:
    """Per relation, when rows of it last landed: an ingest's (the ingest log's ``ingested_at``), or a batch's that
    landed its files (the batch log's ``recorded_at``), whichever is newer."""
    last: dict[str, int] = {}
    log = ingest_log.rows(where="rows_landed > 0 OR (rows_landed IS NULL AND refused IS NULL)")
    for name, moment in (
        [] if log is None else zip(log.column("relation").to_pylist(), log.column("ingested_at").to_pylist())
    ):
        last[name] = max(last.get(name, 0), micros(moment))
    schema = batches.schema()
    logged = batches.rows() if schema is not None and "landed" in schema.fieldNames() else None
    for landed, moment in (
        [] if logged is None else zip(logged.column("landed").to_pylist(), logged.column("recorded_at").to_pylist())
    ):
        for name, rows in landed or []:
            if rows:
                last[name] = max(last.get(name, 0), micros(moment))
    return last


def declared(progress: Table) -> dict[str, int]:
    """Per relation, the highest progress declared (``lakejoin advance``)."""
    rows = progress.rows()
    if rows is None or rows.num_rows == 0:
        return {}
    highest = rows.select(["relation", "to"]).group_by("relation").aggregate([("to", "max")])
    return dict(zip(highest["relation"].to_pylist(), highest["to_max"].to_pylist()))


def declare(engine: DeltaEngine, warehouse: Warehouse, rel: Relation, to: int, shown: str, clock: datetime) -> None:
    """Record that no record of ``rel`` older than ``to`` (``shown`` as the user gave it) will come."""
    row = {"relation": rel.name, "to": to, "declared": shown, "declared_at": clock}
    engine.append(warehouse.progress, pa.Table.from_pylist([row], DECLARED_SCHEMA))


def raised(
    own: Watermarks,
    before: Watermarks,
    progress: Progress,
    relations: Sequence[Relation],
    reasons: dict[str, str],
    as_time: Callable[[int], str],
) -> tuple[Watermarks, dict[str, str]]:
    """The watermarks after a batch: ``own`` (what the relations' own arrivals give, never below ``before``), each
    idle relation's raised to the lowest watermark of those not idle, each declared one to its declaration. With them,
    why each raised watermark stands (``reasons`` before the batch; a relation whose own arrivals moved its watermark
    has none any more), for the reasons of its late records (``as_time`` renders an event time)."""
    after = dict(own)
    why = {name: reason for name, reason in reasons.items() if own.get(name) == before.get(name)}
    live = every_mark([own.get(rel.name) for rel in relations if rel.name not in progress.idle])
    floor = min(live) if live else None
    for rel in relations:
        name, mark = rel.name, after.get(rel.name)
        if name in progress.idle and floor is not None and (mark is None or floor > mark):
            after[name], mark = floor, floor
            why[name] = f"{rel.label} had been idle since {instant(progress.idle[name])}"
        to = progress.declared.get(name)
        if to is not None and (mark is None or to > mark):
            after[name] = to
            why[name] = f"{rel.label} was declared complete up to {as_time(to)} (lakejoin advance)"
    return after, why


def instant(micros: int) -> str:
    """An instant recorded in microseconds, as ISO-8601 UTC to the second."""
    return datetime.fromtimestamp(micros / 1_000_000, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
