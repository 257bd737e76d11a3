"""The store/probe join in batch form (docs/design.md section 2), as pure DataFrame functions.

For a micro-batch with new arrivals ΔX and state read at the batch's snapshot, the store of X owns
the pairs whose older member is in X:

    ΔY ⋈ (X_store ∪ ΔX)   where x older than y   -- probes of the newer member
    ΔX ⋈ X_probes          where x older than y   -- delayed stores of the older member

so each pair is produced once, by the store of its older member, whatever the arrival order or the
batch split. Columns are aliased by relation name, so the predicate reads ``r.key = s.key``; the order
and matching use only what lakejoin derives for every record (``_ts``, ``_id``), so any columns can be joined.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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
    probes: DataFrame  # records of the other relation that probed X's store


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
    """Gold's columns for a pair: each member's id and event time as lakejoin derives them, then every column of
    each record prefixed by its relation (``r_amount``) or, when configured, the ``select`` expressions; the owner last."""

    columns: dict[str, tuple[str, ...]]  # relation name -> the record columns gold carries (default projection)
    select: tuple[str, ...] | None = None  # Spark SQL expressions over r.* and s.*, with aliases

    def of(self, owner: Column) -> list[Column]:
        identity = [F.col(f"{rel.name}.{derived}").alias(identity_column(rel, derived)) for rel in RELATIONS for derived in (ID, TS)]
        if self.select is not None:
            body = [F.expr(expression) for expression in self.select]
        else:
            body = [F.col(f"{rel.name}.{quoted(name)}").alias(f"{rel.name}_{name}") for rel in RELATIONS for name in self.columns.get(rel.name, ())]
        return [*identity, *body, owner.alias("owner")]


def owned_pairs(owner: Side, other: Side, predicate: str, projection: Projection) -> DataFrame:
    """The pairs the store of ``owner`` produces in this batch (its older member is in ``owner``)."""
    x, y = owner.relation, other.relation
    condition = F.expr(predicate) & older(x, y)
    stored = owner.store.unionByName(owner.arrivals, allowMissingColumns=True)
    probed = F.broadcast(other.arrivals).alias(y.name).join(stored.alias(x.name), condition)
    delayed_stores = F.broadcast(owner.arrivals).alias(x.name).join(owner.probes.alias(y.name), condition)
    columns = projection.of(F.lit(x.label))
    return probed.select(columns).unionByName(delayed_stores.select(columns))


def batch_pairs(sides: list[Side], predicate: str, projection: Projection) -> DataFrame:
    """Every pair one micro-batch produces, each with its owner."""
    parts = [owned_pairs(owner, other, predicate, projection) for owner in sides for other in sides if other is not owner]
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result
