"""Measuring a batch's arrivals, in one Spark job, for what its writes must know before they start: each relation's
arrivals and late ones, its newest event time on time (the watermarks after the batch, and so what the state evicts
and what becomes final), the span of event times its state write touches, its bronze rules' counts (a ``fail`` rule
stops the batch here, before gold or state is written), and a change feed's counts.

Every relation's rows are narrowed to the few columns the counts need and unioned, then counted in one aggregate: a
small part of the batch's work, whatever its size. The same job counts the state rows that already hold an arrival's
id (the state's ids only, found by the arrivals' ids): none, when the batch's tuples can repeat nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from expectations.batch import EVALUATED
from pipelines.batch.read import CURRENT, Arrived
from state.batch_log import RuleCount
from state.engines.base import Aligned
from state.relations import DELETE, ID, OP, TS, Relation

PART = "_part"


@dataclass(frozen=True)
class Measured:
    """What the measuring job found, per relation name."""

    rows: dict[str, int]  # the slice's rows
    late: dict[str, int]  # below the watermark before the batch (a change feed's new versions)
    newest: dict[str, int | None]  # the newest event time on time (not late, not quarantined by a rule)
    spans: dict[str, Aligned | None]  # the event times on time span: what the state's MERGE looks at
    rules: dict[str, list[RuleCount]]  # the bronze rules' results
    quarantined: dict[str, list[str]] = field(default_factory=dict)  # the flags of the quarantine rules that broke
    changes: dict[str, dict[str, int]] = field(default_factory=dict)  # a change feed's: inserted, updated, deleted, ignored, late
    pointers: dict[str, int] = field(default_factory=dict)  # a source table's pointers, each naming one row
    held: dict[str, int] = field(default_factory=dict)  # state rows whose id an arrival has too (not counted for a change feed)

    def changed(self) -> dict[str, int]:
        """The change feeds' counts, summed over relations."""
        total: dict[str, int] = {}
        for counts in self.changes.values():
            for name, count in counts.items():
                total[name] = total.get(name, 0) + count
        return total


def late(watermark: int | None) -> Column:
    """A row below its relation's watermark before the batch."""
    return F.lit(False) if watermark is None else F.col(TS) < watermark


def set_aside(flags: list[str]) -> Column:
    """A row a quarantine rule takes out (``flags``: those rules' flags)."""
    return reduce(Column.__or__, [F.col(flag) for flag in flags], F.lit(False))


def measure(arrived: dict[Relation, Arrived], watermarks: dict[str, int], broadcast: bool) -> Measured:
    """The one job: every relation's narrowed rows, and its other parts (a change feed's raw and ignored rows, a
    source table's pointers, the state rows an arrival's id is held in), unioned and counted by part. ``broadcast``:
    the batch is small enough to broadcast its arrivals' ids to the state's."""
    parts = []
    for rel, part in arrived.items():
        parts.append(_narrowed(rel, part, watermarks.get(rel.name)))
        if part.resolved is not None:
            parts += [part.rows.select(F.lit(f"{rel.name}:rows").alias(PART)), part.resolved.ignored.select(F.lit(f"{rel.name}:ignored").alias(PART))]
        elif part.state is not None:
            ids = part.rows.select(ID)
            parts.append(part.state.select(ID).join(F.broadcast(ids) if broadcast else ids, ID, "left_semi").select(F.lit(f"{rel.name}:held").alias(PART)))
        if part.pointers is not None:
            parts.append(part.pointers.select(F.lit(f"{rel.name}:pointers").alias(PART)))
    narrowed = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    flags = [name for name in narrowed.columns if not name.startswith("_") or name.startswith("_dq_")]  # the rules' flags, a change feed's kinds
    counts = [
        F.count(F.lit(1)).alias(EVALUATED),
        F.count(F.when(F.col("_late"), 1)).alias("late"),
        F.max("_on_time").alias("newest"),
        F.min("_on_time").alias("low"),
        *[F.count(F.when(F.col(name), 1)).alias(name) for name in flags],
    ]
    found = {row[PART]: row.asDict() for row in narrowed.groupBy(PART).agg(*counts).collect()}
    return _measured(arrived, found)


def _narrowed(rel: Relation, part: Arrived, watermark: int | None) -> DataFrame:
    """The relation's flagged rows as the counts read them: late, the event time of those on time, the rules' flags,
    and a change feed's kind of change."""
    quarantining = [check.flag for check in part.checks.row_checks if check.policy == "quarantine"]
    kept = ~set_aside(quarantining)
    on_time = part.upsert & ~late(watermark) & kept
    columns = {
        PART: F.lit(rel.name),
        "_late": part.upsert & late(watermark) & kept,
        "_on_time": F.when(on_time, F.col(TS)),
        **{check.flag: F.col(check.flag) for check in part.checks.row_checks},
    }
    if part.resolved is not None:
        columns |= {"inserted": on_time & ~F.col(CURRENT), "updated": on_time & F.col(CURRENT), "deleted": (F.col(OP) == DELETE) & kept}
    return part.flagged.select(*[column.alias(name) for name, column in columns.items()])


def _measured(arrived: dict[Relation, Arrived], found: dict[str, dict]) -> Measured:
    rows, lates, newest, spans, rules, quarantined, changes, pointers, held = {}, {}, {}, {}, {}, {}, {}, {}, {}
    for rel, part in arrived.items():
        values = found.get(rel.name) or {EVALUATED: 0, "late": 0}
        changing = part.resolved is not None
        rows[rel.name] = _count(found, f"{rel.name}:rows") if changing else values[EVALUATED]
        lates[rel.name] = values["late"]
        newest[rel.name] = values.get("newest")
        spans[rel.name] = None if values.get("newest") is None else Aligned(TS, values["low"], values["newest"])
        rules[rel.name] = part.checks.results(part.flagged, values)
        quarantined[rel.name] = [check.flag for check in part.checks.row_checks if check.policy == "quarantine" and values.get(check.flag)]
        if changing:
            changes[rel.name] = {**{name: values.get(name) or 0 for name in ("inserted", "updated", "deleted")}, "ignored": _count(found, f"{rel.name}:ignored"), "late": values["late"]}
        if part.pointers is not None:
            pointers[rel.name] = _count(found, f"{rel.name}:pointers")
        if not changing:
            held[rel.name] = _count(found, f"{rel.name}:held")
    return Measured(rows, lates, newest, spans, rules, quarantined, changes, pointers, held)


def _count(found: dict[str, dict], part: str) -> int:
    return (found.get(part) or {}).get(EVALUATED) or 0
