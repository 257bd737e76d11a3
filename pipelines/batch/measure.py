"""Measuring a batch's arrivals, in one Spark job, for what its writes must know before they start: each relation's
arrivals and late ones, its newest event time on time (the watermarks after the batch, and so what the state evicts
and what becomes final), the span of event times its state write touches, its bronze rules' counts (a ``fail`` rule
stops the batch here, before gold or state is written), and a change feed's counts.

Every relation's rows are narrowed to the few columns the counts need and unioned, then counted in one aggregate: a
small part of the batch's work, whatever its size. The same job counts the state rows that already hold an arrival's
id (the state's ids only, found by the arrivals' ids): none, when the batch's tuples can repeat nowhere.

A batch whose arrivals are only the rows its files land needs no such job: its bronze writes count the same
aggregates as they write those rows (``watch``), and the batch takes their counts (``watched``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from expectations.batch import EVALUATED, TableChecks
from pipelines.batch.context import Batch
from pipelines.batch.land import Landing
from pipelines.batch.read import CURRENT, Arrived, bronze_checks
from pipelines.bronze import Watch
from pipelines.classify import holds_digests
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
    found = {row[PART]: row.asDict() for row in narrowed.groupBy(PART).agg(*_counts(flags)).collect()}
    return _measured(arrived, found)


def _counts(flags: list[str]) -> list[Column]:
    """The aggregates of rows carrying ``_signals``' columns (``flags``: the rules' flags, a change feed's kinds)."""
    return [
        F.count(F.lit(1)).alias(EVALUATED),
        F.count(F.when(F.col("_late"), 1)).alias("late"),
        F.max("_on_time").alias("newest"),
        F.min("_on_time").alias("low"),
        *[F.count(F.when(F.col(name), 1)).alias(name) for name in flags],
    ]


def _signals(checks: TableChecks, watermark: int | None, upsert: Column | None = None, changes: bool = False) -> dict[str, Column]:
    """What the counts read of a relation's flagged rows: late, the event time of those on time, the rules' flags, and
    (``changes``) a change feed's kind of change (``upsert``: a row that is a version of its record; None: every row)."""
    upsert = F.lit(True) if upsert is None else upsert
    kept = ~set_aside([check.flag for check in checks.row_checks if check.policy == "quarantine"])
    on_time = upsert & ~late(watermark) & kept
    columns = {
        "_late": upsert & late(watermark) & kept,
        "_on_time": F.when(on_time, F.col(TS)),
        **{check.flag: F.col(check.flag) for check in checks.row_checks},
    }
    if changes:
        columns |= {"inserted": on_time & ~F.col(CURRENT), "updated": on_time & F.col(CURRENT), "deleted": (F.col(OP) == DELETE) & kept}
    return columns


def _narrowed(rel: Relation, part: Arrived, watermark: int | None) -> DataFrame:
    """The relation's flagged rows as the counts read them, named by the relation."""
    columns = {PART: F.lit(rel.name), **_signals(part.checks, watermark, part.upsert, part.resolved is not None)}
    return part.flagged.select(*[column.alias(name) for name, column in columns.items()])


def watch(batch: Batch, states: dict[Relation, DataFrame | None]) -> Callable[[Relation, DataFrame], Watch | None]:
    """What a batch's bronze writes count for its measure, when its arrivals are only the rows it lands: the same
    aggregates as ``measure``'s over the same rows, observed as they are written, so no job of its own reads them back.

    A landing's accepted rows hold each id once (its repeats are skipped or set aside) and no id its state holds
    (checked against it, ``held_digests``), so the id's unique rule is proven on them and no state row holds an
    arrival's id. Left to ``measure`` (None): a batch with arrivals ingested before it, a change feed or a source table,
    a state table whose rows carry no digest (so not checked against), and a rule on a column the landed rows lack (null
    when read back). Bronze's rules take no setting on the event-time axis, so the batch's config as planned does."""
    plan = batch.plan
    lands_only = bool(plan.files) and plan.ingested_to == plan.seq_from

    def counted(rel: Relation, rows: DataFrame) -> Watch | None:
        spec, state = batch.config.spec(rel.name), states[rel]
        if not lands_only or spec.changes is not None or spec.table is not None or (state is not None and not holds_digests(state)):
            return None
        checks = bronze_checks(batch, rel).proven_unique([ID])
        present = {name.lower() for name in rows.columns}
        if any(name.lower() not in present for check in checks.row_checks for name in check.reads):
            return None
        signals = _signals(checks, plan.watermarks.get(rel.name))
        return Watch(lambda frame: checks.flagged(frame).withColumns(signals), _counts([check.flag for check in checks.row_checks]))

    return counted


def watched(arrived: dict[Relation, Arrived], landed: list[Landing]) -> Measured | None:
    """The batch's measure as its bronze writes counted it (``watch``); None when they did not count all of it (a
    relation's rows written before, in a resumed batch) and ``measure`` must."""
    found = {}
    for landing in landed:
        if landing.watched is not None:
            found[landing.relation] = landing.watched
        elif landing.landed:
            return None
    if not found or any(part.resolved is not None or part.pointers is not None for part in arrived.values()):
        return None
    return _measured(arrived, found)


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
