"""The store/probe join in batch form (docs/design.md sections 2.3 and 2.8), as pure DataFrame functions.

For a micro-batch with new arrivals ΔX of every relation and state read at the batch's snapshot, the store of X
owns the tuples whose oldest member is in X: those taken from X_store ∪ ΔX and, for every other relation Y, from
X's probe buffer of Y ∪ ΔY, that have a new member. One term per relation k, X's own last: k's arrivals
(broadcast), the relations before k from X's buffers only, those after k from buffers and arrivals. With two
relations these are

    ΔY ⋈ (X_store ∪ ΔX)   where x older than y   -- probes of the newer member
    ΔX ⋈ X_probes          where x older than y   -- delayed stores of the older member

so each tuple is produced once, by the store of its oldest member, whatever the arrival order or the batch
split. Columns are aliased by relation name, so the predicate reads ``r.key = s.key``; the order and matching
use only what lakejoin derives for every record (``_ts``, ``_id``), so any columns can be joined.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from state.names import quoted
from state.relations import ID, RELATIONS, TS, Relation

DEFAULT_PREDICATE = "r.key = s.key"


@dataclass(frozen=True)
class Side:
    """One relation's part of a batch: its new arrivals and its buffers at the batch's snapshot."""

    relation: Relation
    arrivals: DataFrame  # ΔX
    store: DataFrame  # X's own records
    probes: dict[Relation, DataFrame]  # per other relation, its records that probed X's store

    def buffered(self, rel: Relation) -> DataFrame:
        """X's buffer of ``rel``'s records: its store for X itself, else a probe buffer."""
        return self.store if rel == self.relation else self.probes[rel]


def older(a: Relation, b: Relation) -> Column:
    """Record ``a.*`` is older than ``b.*``: ``(event time, rank, id)`` compared in that order."""
    a_ts, b_ts = F.col(f"{a.name}.{TS}"), F.col(f"{b.name}.{TS}")
    if a.rank != b.rank:
        tie_break = F.lit(a.rank < b.rank)
    else:
        tie_break = F.col(f"{a.name}.{ID}") < F.col(f"{b.name}.{ID}")
    return (a_ts < b_ts) | ((a_ts == b_ts) & tie_break)


def identity_column(rel: Relation, derived: str) -> str:
    """Gold's copy of a member's ``_id`` or ``_ts``: ``_r_id``, ``_s_ts``, … (what rules and reconciliation key on)."""
    return f"_{rel.name}{derived}"


def data_columns(columns: Iterable[str]) -> tuple[str, ...]:
    """A record's own columns: all but lakejoin's bookkeeping (names starting with ``_``)."""
    return tuple(name for name in columns if not name.startswith("_"))


@dataclass(frozen=True)
class Projection:
    """Gold's columns for a tuple: each member's id and event time as lakejoin derives them, then every column of
    each record prefixed by its relation (``r_amount``) or, when configured, the ``select`` expressions; the owner last."""

    columns: dict[str, tuple[str, ...]]  # relation name -> the record columns gold carries (default projection)
    select: tuple[str, ...] | None = None  # Spark SQL expressions over the relations' aliases (r.*, s.*), with aliases

    def of(self, owner: Column, relations: Sequence[Relation] = RELATIONS) -> list[Column]:
        identity = [F.col(f"{rel.name}.{derived}").alias(identity_column(rel, derived)) for rel in relations for derived in (ID, TS)]
        if self.select is not None:
            body = [F.expr(expression) for expression in self.select]
        else:
            body = [F.col(f"{rel.name}.{quoted(name)}").alias(f"{rel.name}_{name}") for rel in relations for name in self.columns.get(rel.name, ())]
        return [*identity, *body, owner.alias("owner")]


def oldest(owner: Relation, members: Iterable[Relation]) -> Column:
    """Record ``owner.*`` is older than every other member's."""
    return reduce(Column.__and__, [older(owner, other) for other in members if other != owner])


def owned_tuples(owner: Side, sides: Sequence[Side], predicate: str, projection: Projection) -> DataFrame:
    """The tuples the store of ``owner`` produces in this batch (their oldest member is in ``owner``)."""
    relations = [side.relation for side in sides]
    condition = F.expr(predicate) & oldest(owner.relation, relations)
    order = [*(side for side in sides if side is not owner), owner]
    columns = projection.of(F.lit(owner.relation.label), relations)
    terms = []
    for k, new in enumerate(order):
        inputs = [F.broadcast(new.arrivals).alias(new.relation.name)]
        inputs += [owner.buffered(side.relation).alias(side.relation.name) for side in order[:k]]
        inputs += [
            owner.buffered(side.relation).unionByName(side.arrivals, allowMissingColumns=True).alias(side.relation.name) for side in order[k + 1 :]
        ]
        # The condition on the last join. With two relations that is the only join. With more, Spark moves a
        # conjunct down only to a join that already holds every relation it reads, and the broadcast hint keeps it
        # from reordering the chain: a term whose next relation links to the ones before only through the owner
        # (last) is a nested-loop join, and the joins after the first are not broadcast (docs/design.md 2.8).
        joined = reduce(DataFrame.join, inputs[:-1]).join(inputs[-1], condition)
        terms.append(joined.select(columns))
    return reduce(DataFrame.unionByName, terms)


def batch_tuples(sides: Sequence[Side], predicate: str, projection: Projection) -> DataFrame:
    """Every tuple one micro-batch produces, each with its owner."""
    return reduce(DataFrame.unionByName, [owned_tuples(owner, sides, predicate, projection) for owner in sides])
