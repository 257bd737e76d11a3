"""Rows emitted once final (docs/design.md section 2.9), for joins of two relations: the unmatched rows of outer
and anti joins, the first-match rows of a semi join, and the rows of a backward as-of join (state/join/asof.py).

A record is **final** once its store's cutoff (``store_eviction`` in state/join/bounds.py, with a horizon: the window
for an unmatched row, 0 for an as-of match) has passed it: no future on-time arrival of the other relation can
change its row. Those are exactly the records the store's MERGE evicts in the batch that moves the cutoff past
them (or, arriving already past it, never stores), so that batch emits their rows, with its pairs, under the same
plan and application transactions: a resumed batch emits the same rows, once.

Whether a record ever matched is a column of its store, ``_matched``, set by the MERGE that already runs each
batch: a batch's tuples match every member, whichever store produced them. A record first matched in a batch is
*newly matched*; the semi row of a left record comes from that batch, and only from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.engines import Eviction, OnMatch
from state.engines.base import Aligned
from state.frames import union_by_name
from state.join import asof
from state.join.bounds import Watermarks, store_eviction
from state.join.buffers import BufferUpdate, EvictionRule, StateTable, buffer_updates, state_tables, store_probe_rule
from state.join.joiner import Projection, Side, identity_column, label
from state.join.relations import ID, TS, Relation
from state.layout import Warehouse
from state.log.batch_log import BatchPlan

MATCHED = "_matched"  # a store's column: the record has been a member of some tuple


@dataclass(frozen=True)
class JoinKind:
    """What gold holds for a join of two relations, as data: whether the tuples themselves, and which relations'
    records also give a row of their own (unmatched once final, or at their first match)."""

    name: str
    emits_tuples: bool  # inner and outer joins; semi and anti joins only use them to know what matched
    preserved: tuple[
        int, ...
    ]  # positions of the relations whose records give a row without a match (nulls for the other)
    first_match: bool = False  # semi: the left record's row at its first match
    as_of: bool = False  # each left record's row once final, with its best match (state/join/asof.py)

    def tracked(self, relations: Sequence[Relation]) -> tuple[Relation, ...]:
        """The relations whose stores carry ``_matched``."""
        if self.as_of:
            return ()
        return tuple(rel for i, rel in enumerate(relations) if i in self.preserved or (self.first_match and i == 0))

    def preserves(self, relations: Sequence[Relation]) -> tuple[Relation, ...]:
        return tuple(relations[i] for i in self.preserved)

    def waiting(self, relations: Sequence[Relation]) -> tuple[Relation, ...]:
        """The relations whose records wait in their store for a watermark to make their row final."""
        return (relations[0],) if self.as_of else self.preserves(relations)

    def horizon(self, window: int | None) -> int | None:
        """How far past a record's time the other relation's watermark must be for its row to be final: the window
        for an unmatched row (a match is within it), 0 for an as-of match (it is at or before the record)."""
        return 0 if self.as_of else window

    def gold_relations(self, relations: Sequence[Relation]) -> tuple[Relation, ...]:
        """The relations whose columns gold carries: the left one alone for semi and anti joins."""
        return tuple(relations) if self.emits_tuples or self.as_of else (relations[0],)

    def owned_by(self, relations: Sequence[Relation]) -> Relation | None:
        """The relation owning every row when one store emits them all (as-of: the left one); None when a tuple is
        owned by its oldest member's store."""
        return relations[0] if self.as_of else None

    def row_keys(self, relations: Sequence[Relation]) -> list[str]:
        """Gold's columns that identify a row: every member's id, or, with a row per left record, its id and time."""
        if self.emits_tuples:
            return [identity_column(rel, ID) for rel in relations]
        return [identity_column(relations[0], ID), identity_column(relations[0], TS)]


JOIN_KINDS = {
    kind.name: kind
    for kind in (
        JoinKind("inner", True, ()),
        JoinKind("left", True, (0,)),
        JoinKind("right", True, (1,)),
        JoinKind("full", True, (0, 1)),
        JoinKind("semi", False, (), first_match=True),
        JoinKind("anti", False, (0,)),
        JoinKind("asof", False, (), as_of=True),
        JoinKind("asof_left", False, (0,), as_of=True),
    )
}


@dataclass(frozen=True)
class JoinSpec:
    """A join as a batch computes it: its kind, the user's predicate, the condition a row satisfies (the predicate
    with the window's band and the kind's own bounds), and the window, on the event-time axis."""

    kind: JoinKind
    predicate: str
    condition: str
    window: int | None

    def cutoffs(self, relations: Sequence[Relation], marks: Watermarks) -> dict[Relation, Eviction | None]:
        """Per waiting relation, the cutoff below which its records are final under ``marks``: its store's
        eviction with the kind's horizon."""
        return {
            rel: store_eviction(rel, relations, marks, self.kind.horizon(self.window))
            for rel in self.kind.waiting(relations)
        }

    def state_tables(self, warehouse: Warehouse) -> list[StateTable]:
        """The state tables a batch MERGEs, one per relation: its store and probe buffers, or an as-of join's store."""
        return state_tables(warehouse, probes=not self.kind.as_of)

    def eviction_rule(self, relations: Sequence[Relation]) -> EvictionRule:
        return (
            asof.eviction_rule(relations, self.window) if self.kind.as_of else store_probe_rule(relations, self.window)
        )


def final_records(side: Side, cutoff: Eviction | None, candidates: DataFrame | None = None) -> DataFrame | None:
    """The records of ``side`` (``candidates`` of its store and arrivals: all by default) that the batch makes
    final, below the cutoff after it; None while nothing can be final (no cutoff yet)."""
    if cutoff is None:
        return None
    records = side.store.unionByName(side.arrivals, allowMissingColumns=True) if candidates is None else candidates
    return records.where(F.col(cutoff.column) < cutoff.below)


def newly_matched(side: Side, tuples: DataFrame) -> DataFrame:
    """``_id`` and ``_ts`` of the records of ``side``'s relation first matched by this batch's ``tuples``: its
    arrivals, and its stored records not yet ``_matched``. Small: each record is newly matched once in its life."""
    rel = side.relation
    ids = tuples.select(F.col(identity_column(rel, ID)).alias(ID)).distinct()
    return unmatched(side).select(ID, TS).join(ids, ID, "left_semi")


def unmatched(side: Side) -> DataFrame:
    """The relation's records not matched before this batch: its arrivals and its stored records without a match."""
    stored = (
        side.store.where(~F.coalesce(F.col(MATCHED), F.lit(False))) if MATCHED in side.store.columns else side.store
    )
    return stored.unionByName(side.arrivals, allowMissingColumns=True)


def final_unmatched(side: Side, newly: DataFrame, cutoff: Eviction | None) -> DataFrame | None:
    """The relation's records final in this batch that no tuple ever matched; None while nothing can be final."""
    final = final_records(side, cutoff, unmatched(side))
    if final is None:
        return None
    return final.join(newly.select(ID), ID, "left_anti")


def first_matches(side: Side, newly: DataFrame) -> DataFrame:
    """The relation's records first matched in this batch, with their columns (a semi join's rows)."""
    return unmatched(side).join(newly.select(ID), ID, "left_semi")


def row_of(records: DataFrame, rel: Relation, frames: dict[Relation, DataFrame], projection: Projection) -> DataFrame:
    """Gold rows of ``rel``'s records on their own: their columns, nulls for the other relations' (``frames`` gives
    each relation's columns), owned by ``rel``. The same projection as the tuples', so both union into gold."""
    row = records.alias(rel.name)
    for other, frame in frames.items():
        if other != rel:
            row = row.join(frame.limit(0).alias(other.name), F.lit(False), "left")
    return row.selectExpr(*projection.of(label(rel), list(frames)))


def with_matched(rows: DataFrame, newly: DataFrame, cutoff: Eviction | None) -> DataFrame:
    """A tracked store's MERGE source: the arrivals it keeps, each with ``_matched``, then one row per stored record
    newly matched that stays (``_id``, ``_ts``, ``_matched`` true), which the MERGE's update sets in place. A stored
    record leaving in this batch needs no mark: its row has been decided."""
    matched = newly.select(ID, F.lit(True).alias(MATCHED))
    flagged = rows.join(matched, ID, "left").withColumn(MATCHED, F.coalesce(F.col(MATCHED), F.lit(False)))
    marks = newly.join(rows.select(ID), ID, "left_anti")
    if cutoff is not None:
        marks = marks.where(F.col(TS) >= cutoff.below)
    return flagged.unionByName(marks.withColumn(MATCHED, F.lit(True)), allowMissingColumns=True)


@dataclass(frozen=True)
class Emitted:
    """What a batch of a join kind gives gold, and what its stores learn."""

    rows: DataFrame  # gold's rows: the tuples (inner, outer), and the rows of records final or first matched
    newly: dict[Relation, DataFrame] = field(
        default_factory=dict
    )  # per tracked relation, its records first matched in this batch
    dropped: dict[Relation, DataFrame] = field(
        default_factory=dict
    )  # per relation, its records no row can take any more


def emit(
    spec: JoinSpec, sides: Sequence[Side], tuples: DataFrame, projection: Projection, marks: Watermarks
) -> Emitted:
    """The batch's gold rows: its ``tuples`` (the store/probe join's), then each preserved record the watermarks
    after the batch (``marks``) make final without a match, or each left record first matched; for an as-of join,
    each left record made final, with its best match. The inner join is its tuples alone, at no extra cost."""
    kind = spec.kind
    relations = [side.relation for side in sides]
    side_of = {side.relation: side for side in sides}
    columns = {rel: side_of[rel].arrivals for rel in kind.gold_relations(relations)}  # each relation's columns
    cutoffs = spec.cutoffs(relations, marks)
    left = relations[0]
    nothing = row_of(side_of[left].arrivals.limit(0), left, columns, projection)
    if kind.as_of:
        return _emit_as_of(spec, sides, projection, marks, cutoffs[left], nothing)
    newly = {rel: newly_matched(side_of[rel], tuples) for rel in kind.tracked(relations)}
    parts = [tuples] if kind.emits_tuples else [nothing]
    for rel in kind.preserves(relations):
        final = final_unmatched(side_of[rel], newly[rel], cutoffs[rel])
        if final is not None:
            parts.append(row_of(final, rel, columns, projection))
    if kind.first_match:
        parts.append(row_of(first_matches(side_of[left], newly[left]), left, columns, projection))
    return Emitted(union_by_name(parts), newly)


def _emit_as_of(
    spec: JoinSpec,
    sides: Sequence[Side],
    projection: Projection,
    marks: Watermarks,
    cutoff: Eviction | None,
    nothing: DataFrame,
) -> Emitted:
    """The rows of the left records final in this batch, and the right records superseded below the floor."""
    left, right = sides
    relations = [left.relation, right.relation]
    final = final_records(left, cutoff)
    rights = right.store.unionByName(right.arrivals, allowMissingColumns=True)
    rows = (
        nothing
        if final is None
        else asof.rows(final, rights, relations, spec.condition, projection, keep_unmatched=bool(spec.kind.preserved))
    )
    keys = asof.right_keys(spec.predicate, left.relation, right.relation)
    low = asof.floor(relations, marks)
    if keys is None or low is None:
        return Emitted(rows)
    return Emitted(rows, dropped={right.relation: asof.superseded(rights, right.relation, keys, low)})


def state_updates(
    spec: JoinSpec,
    tables: Sequence[StateTable],
    plan: BatchPlan,
    arrivals: dict[Relation, DataFrame],
    marks: tuple[Watermarks, Watermarks],
    emitted: Emitted,
    spans: dict[Relation, Aligned | None],
) -> dict[str, BufferUpdate]:
    """The batch's MERGE into each state table: its arrivals and the kind's eviction, with the marks of records
    first matched (outer, semi, anti) or the deletes of records superseded (as-of)."""
    updates = buffer_updates(
        plan, tables, arrivals, marks, spec.eviction_rule([table.relation for table in tables]), spans
    )
    return dropping(marked(updates, emitted.newly), emitted.dropped)


def marked(updates: dict[str, BufferUpdate], newly: dict[Relation, DataFrame]) -> dict[str, BufferUpdate]:
    """The batch's state updates, each tracked store's with ``_matched`` on its arrivals and the marks of its stored
    records newly matched (``with_matched``)."""
    return {
        name: replace(
            update,
            rows=with_matched(update.rows, newly[update.table.relation], update.store_cutoff),
            on_match=OnMatch(MATCHED),
        )
        if update.table.relation in newly
        else update
        for name, update in updates.items()
    }


def dropping(updates: dict[str, BufferUpdate], dropped: dict[Relation, DataFrame]) -> dict[str, BufferUpdate]:
    """The batch's state updates, each store of a relation in ``dropped`` without those records: arrivals among
    them are not inserted, stored ones are deleted by its MERGE (a source row per record, ``_id`` and ``_ts``)."""

    def without(update: BufferUpdate, gone: DataFrame) -> BufferUpdate:
        kept = update.rows.join(gone.select(ID), ID, "left_anti")
        stored = gone.join(update.rows.select(ID), ID, "left_anti").select(ID, TS)
        return replace(
            update, rows=kept.unionByName(stored, allowMissingColumns=True), on_match=OnMatch(None, delete=True)
        )

    return {
        name: without(update, dropped[update.table.relation]) if update.table.relation in dropped else update
        for name, update in updates.items()
    }
