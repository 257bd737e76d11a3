"""What a batch gives every table it writes, as DataFrames, once its measure has fixed the watermarks after it: the
arrivals its rules keep split by lateness, the store/probe join of them against the state (state/join/joiner.py), the
rows its kind of join emits once final (state/join/final.py), gold's rows, each state table's MERGE, the late arrivals,
and the arrivals a quarantine rule took out. Nothing runs here: each frame is computed by the write that takes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from expectations.batch import TableChecks
from expectations.frames import DERIVED_PREFIX, with_nothing_to_check, with_pair_checks, with_state_checks
from expectations.reconcile import BOOKKEEPING as GOLD_BOOKKEEPING
from pipelines.batch.context import Batch
from pipelines.batch.measure import Measured, set_aside
from pipelines.batch.read import CURRENT, Arrived
from pipelines.gold import Retraction
from state.clock import now
from state.config import OnAxis
from state.errors import LakejoinError
from state.event_time import render, render_span
from state.frames import union_by_name
from state.join.bounds import Watermarks, advance, late_rows, split_late
from state.join.buffers import BufferUpdate, read_sides, replacing, stored_rows
from state.join.changes import DELETED, Applied, apply, ignored_rows
from state.join.final import emit as final_rows
from state.join.final import state_updates
from state.join.joiner import BROADCAST_ROWS, Projection, Side, batch_tuples, data_columns, identity_column
from state.join.relations import ID, TS, Relation
from state.log.batch_log import BatchPlan
from state.log.progress import raised


@dataclass(frozen=True)
class Outputs:
    """A batch's writes, each a frame with the rules that check it."""

    gold: DataFrame  # the batch's gold rows, with the columns gold's rules check
    gold_checks: TableChecks
    retraction: Retraction  # with change feeds: the gold rows the batch takes out
    updates: dict[str, BufferUpdate]  # per state table, its MERGE (its rows with the columns state's rules check)
    state_checks: dict[str, TableChecks]  # per state table's name
    late: DataFrame | None  # what quarantine/late_arrivals gains (None: nothing)
    set_aside: DataFrame | None  # the arrivals quarantine rules took out, as quarantine/expectations keeps them
    watermarks: Watermarks  # after the batch
    raised: dict[str, str]  # why a watermark stands above its relation's records, after the batch


def emit(batch: Batch, arrived: dict[Relation, Arrived], measured: Measured, gold_before: DataFrame | None) -> Outputs:
    """The batch's outputs, from what it read (``gold_before``: gold as the plan pinned it, for change feeds'
    retractions), computed on the warehouse's event-time axis (``batch.axis``); no I/O."""
    axis, plan, relations, tables = batch.axis, batch.plan, batch.relations, batch.tables
    spec, kind = axis.join_spec, axis.kind
    screened = {rel: _screened(part, measured.quarantined[rel.name]) for rel, part in arrived.items()}
    changes = {
        rel: apply(part.resolved, screened[rel], lambda rows, rel=rel: split_late(rows, plan.watermarks.get(rel.name)))
        for rel, part in arrived.items()
        if part.resolved is not None
    }
    split = {
        rel: (changes[rel].on_time, changes[rel].late)
        if rel in changes
        else split_late(rows, plan.watermarks.get(rel.name))
        for rel, rows in screened.items()
    }
    on_time = {rel: parts[0] for rel, parts in split.items()}
    sides = read_sides(
        {rel: part.state for rel, part in arrived.items()},
        [batch.state_tables[rel] for rel in relations],
        on_time,
        {rel: c.replaced for rel, c in changes.items()},
    )
    projection = Projection(
        {rel.name: data_columns(part.rows.columns) for rel, part in arrived.items()}, batch.config.select
    )
    after, raised_why = raised(
        advance(plan.watermarks, measured.newest, axis.allowed_lateness),
        plan.watermarks,
        plan.progress,
        relations,
        plan.raised,
        lambda value: render(value, kind) or str(value),
    )
    every_one = all(part.ever for part in arrived.values())  # else no tuple, nothing final
    tuples = _pairs(
        sides, axis.join_condition, projection, every_one, max(measured.rows.values(), default=0) <= BROADCAST_ROWS
    )
    emitted = final_rows(spec, sides, tuples, projection, after if every_one else {})
    gold = emitted.rows.withColumns({"batch_id": F.lit(plan.batch_id).cast("long"), "produced_at": F.lit(now())})
    members = spec.kind.gold_relations(relations)
    if every_one:
        gold = with_pair_checks(
            gold,
            axis.join_condition,
            projection,
            members,
            lambda: _members(sides),
            spec.kind.preserves(relations),
            spec.kind.owned_by(relations),
        )
    else:
        gold = with_nothing_to_check(gold)
    stored = {
        rel: stored_rows(changes[rel].state_rows() if rel in changes else rows, arrived[rel].state)
        for rel, rows in on_time.items()
    }
    spans = {rel: measured.spans[rel.name] for rel in relations}
    updates = replacing(
        state_updates(spec, list(batch.state_tables.values()), plan, stored, (plan.watermarks, after), emitted, spans),
        list(changes),
    )
    late = {rel: parts[1] for rel, parts in split.items()}
    checked = {
        name: replace(
            update,
            rows=with_state_checks(
                update.rows, _is_late(plan, update.table.relation, update.table.relation in changes), update.eviction
            ),
        )
        for name, update in updates.items()
    }
    state_checks = {
        name: TableChecks.of(axis, "state", tables.state[update.table.relation].name, [ID])
        for name, update in updates.items()
    }
    gold_checks = TableChecks.of(axis, "gold", tables.gold.name, [identity_column(rel, ID) for rel in members])
    if _rows_unique(arrived, measured, state_checks.values()):
        gold_checks = gold_checks.proven_unique(spec.kind.row_keys(members))
        state_checks = {name: checks.proven_unique([ID]) for name, checks in state_checks.items()}
    return Outputs(
        gold=gold,
        gold_checks=gold_checks,
        retraction=Retraction.of(
            gold_before, {rel: c.retracted for rel, c in changes.items()}, spec.kind.row_keys(members)
        ),
        updates=checked,
        state_checks=state_checks,
        late=_late(axis, plan, late, changes, measured),
        set_aside=_set_aside(arrived, measured, plan.batch_id),
        watermarks=after,
        raised=raised_why,
    )


def _rows_unique(arrived: dict[Relation, Arrived], measured: Measured, state_checks: Iterable[TableChecks]) -> bool:
    """Whether the batch's gold rows and the rows it gives each state table are unique by what identifies them, without
    counting them: each relation's records that a batch joins are distinct when its arrivals the rules keep have
    distinct ids (bronze's rules, as measured), none held already (measured), and its state holds each id once (kept so
    by the batches before: their arrivals new and distinct, or their state rows counted by a ``fail`` rule). The join
    gives each tuple of distinct records once, from the store of its oldest member, and each final row and each mark of
    a stored record comes from one stored record (docs/design.md, section 6.2). A change feed's rows name records held
    already, so its batches count their rows instead."""
    return all(
        part.resolved is None
        and not measured.held.get(rel.name)
        and part.checks.kept_unique(ID, measured.rules[rel.name])
        for rel, part in arrived.items()
    ) and all(checks.stops_repeats(ID) for checks in state_checks)


def _is_late(plan: BatchPlan, rel: Relation, changes: bool) -> str:
    """A state row whose record is among the batch's late arrivals: an arrival of the batch (not a stored record's mark,
    nor a delete's tombstone: never late) below the relation's watermark before it."""
    watermark = plan.watermarks.get(rel.name)
    if watermark is None:
        return "false"
    return f"{TS} < {watermark} AND {plan.slice}" + (f" AND NOT coalesce({DELETED}, false)" if changes else "")


def _screened(part: Arrived, broke: list[str]) -> DataFrame:
    """What the relation's rules keep of its rows (of a change feed's candidates): all of them, unless a quarantine
    rule broke on some (``broke``: their flags), which the rows are then flagged by again to leave them out."""
    kept = (
        part.flagged.where(f"NOT {set_aside(broke)}").drop(
            *[name for name in part.flagged.columns if name.startswith(DERIVED_PREFIX)]
        )
        if broke
        else part.checked
    )
    return kept.drop(CURRENT)


def _late(
    axis: OnAxis,
    plan: BatchPlan,
    late: dict[Relation, DataFrame],
    changes: dict[Relation, Applied],
    measured: Measured,
) -> DataFrame | None:
    """Late arrivals and the changes a batch ignored as older, as ``quarantine/late_arrivals`` keeps them."""
    parts = [
        late_rows(
            rows,
            rel,
            plan.watermarks.get(rel.name),
            None if (span := axis.lateness(rel.name)) is None else render_span(span, axis.kind),
            axis.config.spec(rel.name).event_time,
            axis.kind,
            plan.batch_id,
            plan.raised.get(rel.name),
        )
        for rel, rows in late.items()
        if measured.late[rel.name]
    ]
    parts += [
        ignored_rows(applied.resolved, rel.name, plan.batch_id)
        for rel, applied in changes.items()
        if measured.changes[rel.name]["ignored"]
    ]
    return union_by_name(parts, allow_missing=True) if parts else None


def _set_aside(arrived: dict[Relation, Arrived], measured: Measured, batch_id: int) -> DataFrame | None:
    parts = [
        part.checks.set_aside(part.flagged, measured.rules[rel.name], batch_id)
        for rel, part in arrived.items()
        if measured.quarantined[rel.name]
    ]
    found = [part for part in parts if part is not None]
    return union_by_name(found) if found else None


def _pairs(sides: list[Side], predicate: str, projection: Projection, every_one: bool, broadcast: bool) -> DataFrame:
    """The batch's pairs; none while some relation has never had a record (nothing to join with yet). ``broadcast``:
    the batch is small enough to broadcast its arrivals into the joins.

    Spark analyses the join as it is built, so a predicate or a ``select`` that does not resolve fails here,
    before any write."""
    if not every_one:
        return batch_tuples([_empty(side) for side in sides], "true", Projection({}))
    try:
        pairs = batch_tuples(sides, predicate, projection, broadcast)
        named = pairs.columns[len(sides) * 2 : -1]  # the projection's own columns, between the identity and the owner
    except AnalysisException as exc:  # analysed here in a classic session, at .columns as a Spark Connect client
        columns = "; ".join(f"{side.relation.name}: {', '.join(data_columns(side.arrivals.columns))}" for side in sides)
        reason = str(exc).strip().splitlines()[0]
        what = (
            f"join predicate {predicate!r}"
            if projection.select is None
            else f"join predicate {predicate!r} or select {list(projection.select)}"
        )
        raise LakejoinError(f"{what} does not resolve ({reason}); columns are {columns}") from exc
    clashes = sorted(name for name in named if name.startswith("_") or name in (*GOLD_BOOKKEEPING, "owner"))
    if clashes:
        raise LakejoinError(
            f"select gives gold a column named {clashes[0]!r}, a name lakejoin keeps for itself (owner, batch_id, "
            "produced_at, names starting with '_'): alias it, e.g. 's.amount AS paid'"
        )
    return pairs


def _members(sides: list[Side]) -> dict[Relation, DataFrame]:
    """Every record a batch's pairs can have, each once: a relation's arrivals, its store, and its records in the
    other relations' probe buffers, at the plan's versions (not all of bronze: the batch's cost stays its own)."""
    members = {}
    for side in sides:
        frames = [side.arrivals, side.store, *(other.probes[side.relation] for other in sides if other is not side)]
        members[side.relation] = union_by_name(frames, allow_missing=True).dropDuplicates([ID])
    return members


def _empty(side: Side) -> Side:
    return Side(
        side.relation,
        side.arrivals.limit(0),
        side.store.limit(0),
        {rel: probes.limit(0) for rel, probes in side.probes.items()},
    )
