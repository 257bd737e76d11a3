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

from pyspark.sql import DataFrame, SparkSession

from expectations.batch import EVALUATED, TableChecks
from pipelines.batch.context import Batch
from pipelines.batch.land import Landing
from pipelines.batch.read import CURRENT, Arrived, bronze_checks
from pipelines.bronze.classify import holds_digests
from pipelines.bronze.write import Watch
from state.engines.base import Aligned
from state.join.relations import DELETE, ID, OP, TS, Relation
from state.log.batch_log import RuleCount
from state.names import literal, quoted

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
    changes: dict[str, dict[str, int]] = field(
        default_factory=dict
    )  # a change feed's: inserted, updated, deleted, ignored, late
    pointers: dict[str, int] = field(default_factory=dict)  # a source table's pointers, each naming one row
    held: dict[str, int] = field(
        default_factory=dict
    )  # state rows whose id an arrival has too (not counted for a change feed)

    def changed(self) -> dict[str, int]:
        """The change feeds' counts, summed over relations."""
        total: dict[str, int] = {}
        for counts in self.changes.values():
            for name, count in counts.items():
                total[name] = total.get(name, 0) + count
        return total


def late(watermark: int | None) -> str:
    """A row below its relation's watermark before the batch (Spark SQL)."""
    return "false" if watermark is None else f"{TS} < {watermark}"


def set_aside(flags: list[str]) -> str:
    """A row a quarantine rule takes out (``flags``: those rules' flags), in Spark SQL."""
    return "(" + " OR ".join([*map(quoted, flags), "false"]) + ")"


def measure(
    spark: SparkSession, arrived: dict[Relation, Arrived], watermarks: dict[str, int], broadcast: bool
) -> Measured:
    """The one job, as one statement: every relation's narrowed rows, and its other parts (a change feed's raw and
    ignored rows, a source table's pointers, the state rows an arrival's id is held in), unioned and counted by part.
    ``broadcast``: the batch is small enough to broadcast its arrivals' ids to the state's. Built as SQL text, so the
    plan costs a few calls to Spark whatever the relations and rules."""
    signals = {
        rel: _signals(part.checks, watermarks.get(rel.name), part.upsert, part.resolved is not None)
        for rel, part in arrived.items()
    }
    flags = list(
        dict.fromkeys(name for columns in signals.values() for name in columns if name not in ("_late", "_on_time"))
    )
    frames: dict[str, DataFrame] = {}

    def part_of(
        label: str, frame: DataFrame, columns: dict[str, str] | None = None, semi_join: DataFrame | None = None
    ) -> str:
        """One part's rows as the counts read them: every signal column, null where the part has none (``semi_join``:
        only the rows whose id it holds, broadcast to them when the batch is small)."""
        name = f"part{len(frames)}"
        frames[name] = frame
        columns = columns or {}
        listed = ", ".join(
            f"{columns.get(signal, 'NULL')} AS {quoted(signal)}" for signal in ("_late", "_on_time", *flags)
        )
        if semi_join is None:
            return f"SELECT {literal(label)} AS {PART}, {listed} FROM {{{name}}}"
        frames[f"{name}_ids"] = semi_join
        hint = "/*+ BROADCAST(ids) */ " if broadcast else ""
        return (
            f"SELECT {hint}{literal(label)} AS {PART}, {listed} FROM {{{name}}} AS held LEFT SEMI JOIN {{{name}_ids}} "
            f"AS ids ON held.{ID} = ids.{ID}"
        )

    parts = []
    for rel, part in arrived.items():
        parts.append(part_of(rel.name, part.flagged, signals[rel]))
        if part.resolved is not None:
            parts += [part_of(f"{rel.name}:rows", part.rows), part_of(f"{rel.name}:ignored", part.resolved.ignored)]
        elif part.state is not None:
            parts.append(part_of(f"{rel.name}:held", part.state.select(ID), semi_join=part.rows.select(ID)))
        if part.pointers is not None:
            parts.append(part_of(f"{rel.name}:pointers", part.pointers))
    query = f"SELECT {PART}, {', '.join(_counts(flags))} FROM ({' UNION ALL '.join(parts)}) GROUP BY {PART}"
    found = {row[PART]: row.asDict() for row in spark.sql(query, **frames).collect()}
    return _measured(arrived, found)


def _counts(flags: list[str]) -> list[str]:
    """The aggregates of rows carrying ``_signals``' columns (``flags``: the rules' flags, a change feed's kinds), in
    Spark SQL."""
    return [
        f"count(1) AS {EVALUATED}",
        "count(CASE WHEN _late THEN 1 END) AS late",
        "max(_on_time) AS newest",
        "min(_on_time) AS low",
        *[f"count(CASE WHEN {quoted(name)} THEN 1 END) AS {quoted(name)}" for name in flags],
    ]


def _signals(checks: TableChecks, watermark: int | None, upsert: str = "true", changes: bool = False) -> dict[str, str]:
    """What the counts read of a relation's flagged rows, in Spark SQL: late, the event time of those on time, the
    rules' flags, and (``changes``) a change feed's kind of change (``upsert``: a row that is a version of its
    record)."""
    kept = f"NOT {set_aside([check.flag for check in checks.row_checks if check.policy == 'quarantine'])}"
    on_time = f"({upsert}) AND NOT ({late(watermark)}) AND {kept}"
    columns = {
        "_late": f"({upsert}) AND ({late(watermark)}) AND {kept}",
        "_on_time": f"CASE WHEN {on_time} THEN {TS} END",
        **{check.flag: quoted(check.flag) for check in checks.row_checks},
    }
    if changes:
        columns |= {
            "inserted": f"{on_time} AND NOT {CURRENT}",
            "updated": f"{on_time} AND {CURRENT}",
            "deleted": f"{OP} = {literal(DELETE)} AND {kept}",
        }
    return columns


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
        if (
            not lands_only
            or spec.changes is not None
            or spec.table is not None
            or (state is not None and not holds_digests(state))
        ):
            return None
        checks = bronze_checks(batch, rel).proven_unique([ID])
        present = {name.lower() for name in rows.columns}
        if any(name.lower() not in present for check in checks.row_checks for name in check.reads):
            return None
        added = [
            f"{sql} AS {name}"
            for name, sql in _signals(checks, plan.watermarks.get(rel.name)).items()
            if name in ("_late", "_on_time")
        ]
        return Watch(
            lambda frame: checks.flagged(frame).selectExpr("*", *added),
            _counts([check.flag for check in checks.row_checks]),
        )

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
        quarantined[rel.name] = [
            check.flag for check in part.checks.row_checks if check.policy == "quarantine" and values.get(check.flag)
        ]
        if changing:
            changes[rel.name] = {
                **{name: values.get(name) or 0 for name in ("inserted", "updated", "deleted")},
                "ignored": _count(found, f"{rel.name}:ignored"),
                "late": values["late"],
            }
        if part.pointers is not None:
            pointers[rel.name] = _count(found, f"{rel.name}:pointers")
        if not changing:
            held[rel.name] = _count(found, f"{rel.name}:held")
    return Measured(rows, lates, newest, spans, rules, quarantined, changes, pointers, held)


def _count(found: dict[str, dict], part: str) -> int:
    return (found.get(part) or {}).get(EVALUATED) or 0
