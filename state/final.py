"""Rows emitted once final (docs/design.md section 2.9): the unmatched rows of outer and anti joins, and the
first-match rows of a semi join, of two relations.

A record is **final** once its store's cutoff (``store_eviction`` in state/bounds.py) has passed it: no future
on-time arrival of the other relation can match it. Those are exactly the records the store's MERGE evicts in the
batch that moves the cutoff past them (or, arriving already past it, never stores), so that batch emits their rows,
with its pairs, under the same plan and application transactions: a resumed batch emits the same rows, once.

Whether a record ever matched is a column of its store, ``_matched``, set by the MERGE that already runs each
batch: a batch's tuples match every member, whichever store produced them. A record first matched in a batch is
*newly matched*; the semi row of a left record comes from that batch, and only from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.bounds import Watermarks, store_eviction
from state.buffers import BufferUpdate
from state.engines import Eviction
from state.joiner import Projection, Side, identity_column
from state.relations import ID, TS, Relation

MATCHED = "_matched"  # a store's column: the record has been a member of some tuple


@dataclass(frozen=True)
class JoinKind:
    """What gold holds for a join of two relations, as data: whether the tuples themselves, and which relations'
    records also give a row of their own (unmatched once final, or at their first match)."""

    name: str
    emits_tuples: bool  # inner and outer joins; semi and anti joins only use them to know what matched
    preserved: tuple[int, ...]  # positions of the relations whose unmatched records give a row once final
    first_match: bool = False  # semi: the left record's row at its first match

    def tracked(self, relations: Sequence[Relation]) -> tuple[Relation, ...]:
        """The relations whose stores carry ``_matched``."""
        return tuple(rel for i, rel in enumerate(relations) if i in self.preserved or (self.first_match and i == 0))

    def preserves(self, relations: Sequence[Relation]) -> tuple[Relation, ...]:
        return tuple(relations[i] for i in self.preserved)

    def gold_relations(self, relations: Sequence[Relation]) -> tuple[Relation, ...]:
        """The relations whose columns gold carries: the left one alone for semi and anti joins."""
        return tuple(relations) if self.emits_tuples else (relations[0],)

    @property
    def waits(self) -> bool:
        """Its rows wait for a watermark: it needs a window and a lateness to ever emit them."""
        return bool(self.preserved)


JOIN_KINDS = {
    kind.name: kind
    for kind in (
        JoinKind("inner", True, ()),
        JoinKind("left", True, (0,)),
        JoinKind("right", True, (1,)),
        JoinKind("full", True, (0, 1)),
        JoinKind("semi", False, (), first_match=True),
        JoinKind("anti", False, (0,)),
    )
}


def cutoffs(kind: JoinKind, relations: Sequence[Relation], marks: Watermarks, window: int | None) -> dict[Relation, Eviction | None]:
    """Per preserved relation, the cutoff below which its records are final under ``marks``: its store's eviction."""
    return {rel: store_eviction(rel, relations, marks, window) for rel in kind.preserves(relations)}


def newly_matched(side: Side, tuples: DataFrame) -> pa.Table:
    """``_id`` and ``_ts`` of the records of ``side``'s relation first matched by this batch's ``tuples``: its
    arrivals, and its stored records not yet ``_matched``. Small: each record is newly matched once in its life."""
    rel = side.relation
    ids = tuples.select(F.col(identity_column(rel, ID)).alias(ID)).distinct()
    candidates = unmatched(side).select(ID, TS)
    return candidates.join(ids, ID, "left_semi").toArrow()


def unmatched(side: Side) -> DataFrame:
    """The relation's records not matched before this batch: its arrivals and its stored records without a match."""
    stored = side.store.where(~F.coalesce(F.col(MATCHED), F.lit(False))) if MATCHED in side.store.columns else side.store
    return stored.unionByName(side.arrivals, allowMissingColumns=True)


def final_unmatched(side: Side, newly: pa.Table, cutoff: Eviction | None) -> DataFrame | None:
    """The relation's records final in this batch (below its store's cutoff after the batch) that no tuple ever
    matched; None while nothing can be final (no cutoff yet)."""
    if cutoff is None:
        return None
    spark = side.arrivals.sparkSession
    matched = spark.createDataFrame(newly.select([ID]), f"{ID} string")
    return unmatched(side).where(F.col(cutoff.column) < cutoff.below).join(F.broadcast(matched), ID, "left_anti")


def first_matches(side: Side, newly: pa.Table) -> DataFrame:
    """The relation's records first matched in this batch, with their columns (a semi join's rows)."""
    matched = side.arrivals.sparkSession.createDataFrame(newly.select([ID]), f"{ID} string")
    return unmatched(side).join(F.broadcast(matched), ID, "left_semi")


def row_of(records: DataFrame, rel: Relation, frames: dict[Relation, DataFrame], projection: Projection) -> DataFrame:
    """Gold rows of ``rel``'s records on their own: their columns, nulls for the other relations' (``frames`` gives
    each relation's columns), owned by ``rel``. The same projection as the tuples', so both union into gold."""
    row = records.alias(rel.name)
    for other, frame in frames.items():
        if other != rel:
            row = row.join(frame.limit(0).alias(other.name), F.lit(False), "left")
    return row.select(projection.of(F.lit(rel.label), list(frames)))


def with_matched(rows: pa.Table, newly: pa.Table, cutoff: Eviction | None) -> pa.Table:
    """A tracked store's MERGE source: the arrivals it keeps, each with ``_matched``, then one row per stored record
    newly matched that stays (``_id``, ``_ts``, ``_matched`` true), which the MERGE's update sets in place. A stored
    record leaving in this batch needs no mark: its row has been decided."""
    flagged = rows.append_column(MATCHED, pc.is_in(rows[ID], value_set=newly[ID]).fill_null(False))
    stays = pc.invert(pc.is_in(newly[ID], value_set=rows[ID]))
    if cutoff is not None:
        stays = pc.and_(stays, pc.greater_equal(newly[TS], cutoff.below))
    marks = newly.filter(stays).append_column(MATCHED, pa.array([True] * len(newly.filter(stays)), pa.bool_()))
    return pa.concat_tables([flagged, marks], promote_options="permissive")


@dataclass(frozen=True)
class Emitted:
    """What a batch of a join kind gives gold, and what its tracked stores learn."""

    rows: DataFrame  # gold's rows: the tuples (inner, outer), and the rows of records final or first matched
    newly: dict[Relation, pa.Table]  # per tracked relation, its records first matched in this batch


def emit(kind: JoinKind, sides: Sequence[Side], tuples: DataFrame, cutoffs: dict[Relation, Eviction | None], projection: Projection) -> Emitted:
    """The batch's gold rows for ``kind``: its ``tuples`` (the store/probe join's), then each preserved record the
    store's cutoff after the batch (``cutoffs``) makes final without a match, or each left record first matched.
    The inner join is its tuples alone, at no extra cost."""
    relations = [side.relation for side in sides]
    side_of = {side.relation: side for side in sides}
    columns = {rel: side_of[rel].arrivals for rel in kind.gold_relations(relations)}  # each relation's columns
    newly = {rel: newly_matched(side_of[rel], tuples) for rel in kind.tracked(relations)}
    left = relations[0]
    parts = [tuples] if kind.emits_tuples else [row_of(side_of[left].arrivals.limit(0), left, columns, projection)]
    for rel in kind.preserves(relations):
        final = final_unmatched(side_of[rel], newly[rel], cutoffs[rel])
        if final is not None:
            parts.append(row_of(final, rel, columns, projection))
    if kind.first_match:
        parts.append(row_of(first_matches(side_of[left], newly[left]), left, columns, projection))
    return Emitted(reduce(DataFrame.unionByName, parts), newly)


def marked(updates: dict[str, BufferUpdate], newly: dict[Relation, pa.Table]) -> dict[str, BufferUpdate]:
    """The batch's state updates, each tracked store's with ``_matched`` on its arrivals and the marks of its stored
    records newly matched (``with_matched``)."""
    return {
        name: replace(update, rows=with_matched(update.rows, newly[update.table.store], update.eviction), flag=MATCHED)
        if update.table.kind == "store" and update.table.store in newly
        else update
        for name, update in updates.items()
    }
