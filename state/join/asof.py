"""The backward as-of join (docs/design.md section 2.9): each left record with the latest right record at or before
its time that satisfies the predicate, within the window (the tolerance) when one is set.

A left record's match can change while right records at or before its time may still arrive, so its row waits
for the right relation's watermark to pass its time: the "final at the watermark" step of state/join/final.py, with a
horizon of 0. Until then it waits in the left relation's store. The right relation's store keeps what a left
record still to be emitted may take: every such left is at or after the **floor** (the lower of the two
watermarks: a waiting left is at or after the right one, a future on-time left at or after the left one), so
below the floor only the latest right record of each key can still be anyone's match, and only within the window
of the floor. Older right records of a key are *superseded*: the store's MERGE deletes them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from state.engines import Eviction
from state.join.bounds import Watermarks, every_mark, store_eviction
from state.join.buffers import EvictionRule
from state.join.joiner import Projection, label
from state.join.predicate import conjuncts, equality_sides
from state.join.relations import ID, TS, Relation
from state.layout import Buffer

RANK = "_asof_rank"


def backward(left: Relation, right: Relation) -> str:
    """The as-of join's own condition: the right record at or before the left's time (the config adds it to the
    predicate and the window, so that rules and validate check it too)."""
    return f"{right.name}.{TS} <= {left.name}.{TS}"


def floor(relations: Sequence[Relation], marks: Watermarks) -> int | None:
    """The lowest time of a left record still to be emitted: a waiting one is at or after the right watermark, a
    future on-time one at or after the left watermark. None until both relations have one."""
    found = every_mark([marks.get(rel.name) for rel in relations])
    return None if not found else min(found)


def eviction_rule(relations: Sequence[Relation], window: int | None) -> EvictionRule:
    """A left record leaves its store once final (the right watermark past its time); a right record once below
    the floor by more than the window (no left still to come can take it). Superseded right records leave by the
    MERGE's delete (``superseded``)."""
    left = relations[0]

    def rule(table: Buffer, marks: Watermarks) -> Eviction | None:
        if table.store == left:
            return store_eviction(left, relations, marks, 0)
        low = floor(relations, marks)
        return None if low is None or window is None else Eviction(TS, low - window)

    return rule


def rows(
    lefts: DataFrame,
    rights: DataFrame,
    relations: Sequence[Relation],
    condition: str,
    projection: Projection,
    keep_unmatched: bool,
) -> DataFrame:
    """Gold's rows for the final ``lefts``: each with its best match among ``rights``, owned by the left relation,
    whose store emits every row."""
    left, right = relations
    best = best_matches(lefts, rights, left, right, condition, keep_unmatched)
    return best.selectExpr(*projection.of(label(left), relations))


def best_matches(
    lefts: DataFrame, rights: DataFrame, left: Relation, right: Relation, condition: str, keep_unmatched: bool
) -> DataFrame:
    """Each of ``lefts`` with its best match among ``rights`` under ``condition``: the greatest ``(ts, id)`` (one
    rank), so ties on time go to the greatest id; without one it is dropped, or kept with nulls (``keep_unmatched``).
    The frame keeps each side under its relation's alias, for gold's projection."""
    pairs = lefts.alias(left.name).join(
        rights.alias(right.name), F.expr(condition), "left" if keep_unmatched else "inner"
    )
    latest = Window.partitionBy(F.col(f"{left.name}.{ID}")).orderBy(
        F.col(f"{right.name}.{TS}").desc_nulls_last(), F.col(f"{right.name}.{ID}").desc_nulls_last()
    )
    return pairs.withColumn(RANK, F.row_number().over(latest)).where(F.col(RANK) == 1).drop(RANK)


def right_keys(predicate: str, left: Relation, right: Relation) -> list[str] | None:
    """The right relation's side of each equality of ``predicate``, when the predicate is nothing but equalities
    between a left and a right expression: two right records with equal keys then match the same left records, so
    the newer supersedes the older. None when some conjunct is anything else (nothing is superseded)."""
    keys = []
    for conjunct in conjuncts(predicate, [left.name, right.name]):
        if conjunct.text.strip().lower() == "true":
            continue
        sides = equality_sides(conjunct.text, [left.name, right.name])
        if sides is None:
            return None
        keys.append(sides[right.name])
    return keys


def superseded(rights: DataFrame, right: Relation, keys: list[str], floor: int) -> DataFrame:
    """``_id`` and ``_ts`` of the right records at or below ``floor`` with a newer one of equal ``keys`` also at or
    below it: every left record still to be emitted is at or after the floor, so it prefers the newer."""
    below = rights.alias(right.name).where(F.col(f"{right.name}.{TS}") <= floor)
    newest = Window.partitionBy(*[F.expr(key) for key in keys]).orderBy(
        F.col(f"{right.name}.{TS}").desc(), F.col(f"{right.name}.{ID}").desc()
    )
    return (
        below.withColumn(RANK, F.row_number().over(newest))
        .where(F.col(RANK) > 1)
        .select(F.col(f"{right.name}.{ID}").alias(ID), F.col(f"{right.name}.{TS}").alias(TS))
    )
