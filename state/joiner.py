"""The store/probe join in batch form (docs/design.md section 2), as pure DataFrame functions.

For a micro-batch with new arrivals ΔX and state read at the batch's snapshot, the store of X owns
the pairs whose older member is in X:

    ΔY ⋈ (X_store ∪ ΔX)   where x older than y   -- probes of the newer member
    ΔX ⋈ X_probes          where x older than y   -- delayed stores of the older member

so each pair is produced once, by the store of its older member, whatever the arrival order or the
batch split. Columns are aliased by relation name, so the predicate reads ``r.key = s.key``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from state.relations import RELATIONS, Relation

PAIR_FIELDS = ("id", "ts", "key", "payload")
DEFAULT_PREDICATE = "r.key = s.key"


@dataclass(frozen=True)
class Side:
    """One relation's part of a batch: its new arrivals and its buffers at the batch's snapshot."""

    relation: Relation
    arrivals: DataFrame  # ΔX
    store: DataFrame  # X's own records
    probes: DataFrame  # records of the other relation that probed X's store


def older(a: Relation, b: Relation) -> Column:
    """Record ``a.*`` is older than ``b.*``: ``(ts, rank, id)`` compared in that order."""
    a_ts, b_ts = F.col(f"{a.name}.ts"), F.col(f"{b.name}.ts")
    if a.rank != b.rank:
        tie_break = F.lit(a.rank < b.rank)
    else:
        tie_break = F.col(f"{a.name}.id") < F.col(f"{b.name}.id")
    return (a_ts < b_ts) | ((a_ts == b_ts) & tie_break)


def pair_columns(owner: Column) -> list[Column]:
    """Gold's columns for a pair: each relation's id, ts, key and payload, then the owner's label."""
    columns = [F.col(f"{rel.name}.{field}").alias(f"{rel.name}_{field}") for field in PAIR_FIELDS for rel in RELATIONS]
    return [*columns, owner.alias("owner")]


def owned_pairs(owner: Side, other: Side, predicate: str) -> DataFrame:
    """The pairs the store of ``owner`` produces in this batch (its older member is in ``owner``)."""
    x, y = owner.relation, other.relation
    condition = F.expr(predicate) & older(x, y)
    stored = owner.store.unionByName(owner.arrivals, allowMissingColumns=True)
    probed = F.broadcast(other.arrivals).alias(y.name).join(stored.alias(x.name), condition)
    delayed_stores = F.broadcast(owner.arrivals).alias(x.name).join(owner.probes.alias(y.name), condition)
    columns = pair_columns(F.lit(x.label))
    return probed.select(columns).unionByName(delayed_stores.select(columns))


def batch_pairs(sides: list[Side], predicate: str = DEFAULT_PREDICATE) -> DataFrame:
    """Every pair one micro-batch produces, each with its owner."""
    parts = [owned_pairs(owner, other, predicate) for owner in sides for other in sides if other is not owner]
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result
