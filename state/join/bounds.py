"""Bounded state (docs/design.md section 4): watermarks, late arrivals, and what each buffer may evict.

Event times are numbers on one axis here (``_ts``, state/event_time.py), written ``ts`` below. The
watermark of X after a batch is ``max(ts of X seen) - allowed_lateness(X)``; a batch classifies its
arrivals against the watermarks before it. Every arrival that is not late has ``ts >= watermark``, which
is what makes eviction safe:

- a probe ``y`` in X's probe buffer can only meet a future X arrival older than it, so it goes once
  ``y.ts < watermark(X)`` (with three or more relations, also once no third relation's future member can
  complete a tuple with it: docs/design.md section 2.8);
- with a band window W, a record ``x`` in X's store can only meet a future arrival of another relation Y with
  ``y.ts <= x.ts + W``, so it goes once ``x.ts + W < watermark(Y)`` for every other Y.

Both are "``ts`` below a cutoff", applied by the same MERGE that inserts the batch's arrivals.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.engines import Eviction
from state.event_time import INTEGER, render
from state.join.relations import TS, Relation, others

Watermarks = dict[str, int]  # relation name -> watermark; a relation without one is absent


def every_mark(marks: Sequence[int | None]) -> list[int] | None:
    """``marks`` when every one is known, else None: a bound over several relations waits for each one's watermark."""
    known = [mark for mark in marks if mark is not None]
    return known if len(known) == len(marks) else None


def split_late(arrivals: DataFrame, watermark: int | None) -> tuple[DataFrame, DataFrame]:
    """``arrivals`` as (on time, late): late rows have ``ts`` below the relation's watermark."""
    if watermark is None:
        return arrivals, arrivals.limit(0)
    late = F.col(TS) < watermark
    return arrivals.where(~late), arrivals.where(late)


def late_rows(
    late: DataFrame,
    rel: Relation,
    watermark: int | None,
    lateness: str | None,
    event_time: str,
    kind: str | None,
    batch_id: int,
    raised: str | None = None,
) -> DataFrame:
    """What ``quarantine/late_arrivals`` keeps of late records: the record, why, and the watermark then (a number
    on the event-time axis; the reason gives it as the event time reads). ``raised``: why the watermark stands above
    the relation's own records (an idle relation, declared progress: state/log/progress.py)."""
    as_time = "" if kind in (None, INTEGER) else f", {render(watermark, kind)}"
    why = raised or f"newest {rel.label} {event_time} seen minus allowed lateness {lateness}"
    reason = f"{event_time} below the watermark of {rel.label}{as_time} ({why})"
    return late.withColumns(
        {
            "relation": F.lit(rel.name),
            "reason": F.lit(reason),
            "watermark": F.lit(watermark).cast("bigint"),
            "batch_id": F.lit(batch_id).cast("bigint"),
        }
    )


def advance(before: Watermarks, newest: dict[str, int | None], lateness: dict[str, int]) -> Watermarks:
    """The watermarks after a batch, from each relation's newest on-time ``ts`` in it: they only move forward, and only
    for relations with a lateness."""
    after = dict(before)
    for name, top in newest.items():
        if name not in lateness or top is None:
            continue
        candidate = top - lateness[name]
        after[name] = max(candidate, before.get(name, candidate))
    return after


def store_eviction(
    rel: Relation, relations: Sequence[Relation], marks: Watermarks, window: int | None
) -> Eviction | None:
    """Records in ``rel``'s store that no future member of another relation can be within the band window of: once
    every other relation's watermark is past ``ts + W`` (never without a window)."""
    needed = every_mark([marks.get(other.name) for other in others(rel, relations)])
    if window is None or not needed:
        return None
    return Eviction(TS, min(needed) - window)


def probe_eviction(
    store: Relation, holds: Relation, relations: Sequence[Relation], marks: Watermarks, window: int | None
) -> Eviction | None:
    """Probes of ``holds`` in ``store``'s buffer that no future tuple can take: no future record of ``store`` is
    older (``ts`` below its watermark) and, with three or more relations, no future member of a third relation
    can complete a tuple with a stored record older than the probe (``ts + W`` below its watermark)."""
    thirds = every_mark([marks.get(third.name) for third in relations if third not in (store, holds)])
    own = marks.get(store.name)
    if own is None or thirds is None:
        return None
    if not thirds:
        return Eviction(TS, own)
    if window is None:
        return None
    return Eviction(TS, min([own, *(mark - window for mark in thirds)]))
