"""The store/probe join in batch form (docs/design.md sections 2.3 and 2.8), as pure DataFrame functions.

For a micro-batch with new arrivals ΔX of every relation and state read at the batch's snapshot, the store of X
owns the tuples whose oldest member is in X: those taken from X_store ∪ ΔX and, for every other relation Y, from
X's probe buffer of Y ∪ ΔY, that have a new member. One term per relation k, X's own last: k's arrivals
(broadcast), the relations before k from X's buffers only, those after k from buffers and arrivals; each term
joins its relations one at a time, each linked by a conjunct to those before. A batch of more than ``BROADCAST_ROWS``
arrivals of a relation is joined as Spark plans it, since what is broadcast is held whole on the driver. With two
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

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.frames import union_by_name
from state.join.predicate import conjuncts
from state.join.relations import ID, RELATIONS, TS, Relation
from state.names import quoted

PACKED = "_tuple"  # a tuple's gold columns in one struct (``Projection.packed``)
BROADCAST_ROWS = (
    1_000_000  # arrivals per relation up to which a batch broadcasts them into its joins (``batch_tuples``)
)


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


def older(a: Relation, b: Relation) -> str:
    """Record ``a.*`` is older than ``b.*``: ``(event time, rank, id)`` compared in that order (Spark SQL)."""
    a_ts, b_ts = f"{quoted(a.name)}.{TS}", f"{quoted(b.name)}.{TS}"
    tie_break = str(a.rank < b.rank).lower() if a.rank != b.rank else f"{quoted(a.name)}.{ID} < {quoted(b.name)}.{ID}"
    return f"({a_ts} < {b_ts} OR ({a_ts} = {b_ts} AND {tie_break}))"


def identity_column(rel: Relation, derived: str) -> str:
    """Gold's copy of a member's ``_id`` or ``_ts``: ``_r_id``, ``_s_ts``, … (what rules and reconciliation key on)."""
    return f"_{rel.name}{derived}"


def data_columns(columns: Iterable[str]) -> tuple[str, ...]:
    """A record's own columns: all but lakejoin's bookkeeping (names starting with ``_``)."""
    return tuple(name for name in columns if not name.startswith("_"))


@dataclass(frozen=True)
class Projection:
    """Gold's columns for a tuple: each member's id and event time as lakejoin derives them, then every column of
    each record prefixed by its relation (``r_amount``) or, when configured, the ``select`` expressions; the owner
    last."""

    columns: dict[str, tuple[str, ...]]  # relation name -> the record columns gold carries (default projection)
    select: tuple[str, ...] | None = None  # Spark SQL expressions over the relations' aliases (r.*, s.*), with aliases

    def of(self, owner: str, relations: Sequence[Relation] = RELATIONS) -> list[str]:
        """The projection as Spark SQL expressions (for ``selectExpr``); ``owner`` is the owner's, in Spark SQL."""
        identity = [
            f"{quoted(rel.name)}.{derived} AS {identity_column(rel, derived)}"
            for rel in relations
            for derived in (ID, TS)
        ]
        if self.select is not None:
            body = list(self.select)
        else:
            body = [
                f"{quoted(rel.name)}.{quoted(name)} AS {quoted(f'{rel.name}_{name}')}"
                for rel in relations
                for name in self.columns.get(rel.name, ())
            ]
        return [*identity, *body, f"{owner} AS owner"]

    def packed(self, owner: str, relations: Sequence[Relation] = RELATIONS) -> list[str]:
        """The projection as few expressions as ``selectExpr`` takes: with the default projection, whose every column is
        named, one struct of them (``PACKED``, spread again by ``unpacked``), so a frame projected and unioned costs a
        call to Spark or two rather than one per column; a ``select``'s expressions as they are, each named by Spark."""
        columns = self.of(owner, relations)
        return columns if self.select is not None else [f"struct({', '.join(columns)}) AS {PACKED}"]

    def unpacked(self, frame: DataFrame) -> DataFrame:
        """``frame`` projected by ``packed``, with the projection's columns."""
        return frame if self.select is not None else frame.selectExpr(f"{PACKED}.*")


def label(rel: Relation) -> str:
    """``rel``'s label as a Spark SQL literal (a row's owner)."""
    return f"'{rel.label}'"


@dataclass(frozen=True)
class _Condition:
    text: str  # Spark SQL
    reads: frozenset[str]  # relation aliases
    equality: bool


def owned_tuples(
    owner: Side, sides: Sequence[Side], predicate: str, projection: Projection, broadcast: bool = True
) -> DataFrame:
    """The tuples the store of ``owner`` produces in this batch (their oldest member is in ``owner``), projected by
    ``projection.packed``; ``broadcast``: each term's arrivals are broadcast into its joins."""
    relations = [side.relation for side in sides]
    parts = _conditions(predicate, relations)
    parts += [
        _Condition(older(owner.relation, rel), frozenset({owner.relation.name, rel.name}), False)
        for rel in relations
        if rel != owner.relation
    ]
    order = [*(side for side in sides if side is not owner), owner]
    columns = projection.packed(label(owner.relation), relations)
    terms = []
    for k, new in enumerate(order):
        inputs = {new.relation: new.arrivals}
        inputs |= {side.relation: owner.buffered(side.relation) for side in order[:k]}
        inputs |= {
            side.relation: owner.buffered(side.relation).unionByName(side.arrivals, allowMissingColumns=True)
            for side in order[k + 1 :]
        }
        terms.append(_linked_join(inputs, new.relation, parts, broadcast).selectExpr(*columns))
    return union_by_name(terms)


def joined(frames: dict[Relation, DataFrame], predicate: str) -> DataFrame:
    """Every tuple of ``frames`` (each aliased by its relation) that satisfies ``predicate``: a batch join."""
    first = next(iter(frames))
    return _linked_join(frames, first, _conditions(predicate, list(frames)), broadcast=False)


def owner_label(relations: Sequence[Relation]) -> str:
    """The label of the relation of a tuple's oldest member (the tuple's owner), in Spark SQL."""
    cases = " ".join(
        f"WHEN {' AND '.join(older(rel, other) for other in relations if other != rel)} THEN {label(rel)}"
        for rel in relations
    )
    return f"CASE {cases} END"


def _conditions(predicate: str, relations: Sequence[Relation]) -> list[_Condition]:
    return [
        _Condition(part.text, part.reads, part.equality)
        for part in conjuncts(predicate, [rel.name for rel in relations])
    ]


def _linked_join(
    inputs: dict[Relation, DataFrame], first: Relation, parts: list[_Condition], broadcast: bool
) -> DataFrame:
    """The join of ``inputs``, built from ``first`` one relation at a time: next, one an equality links to those
    joined (a hash join), else one any conjunct links, else the next listed; each join takes every conjunct it
    completes. With ``broadcast`` (``first`` is a batch's arrivals) the rows joined so far are broadcast into each
    join, so state tables are scanned and never shuffled (docs/design.md section 2.8)."""
    tuples, have, pending = inputs[first].alias(first.name), {first.name}, list(parts)
    rest = [rel for rel in inputs if rel != first]
    while rest:

        def linked(rel: Relation, equality: bool) -> bool:
            return any(
                rel.name in part.reads
                and part.reads & have
                and part.reads <= have | {rel.name}
                and (part.equality or not equality)
                for part in pending
            )

        chosen = next((rel for rel in rest if linked(rel, True)), None) or next(
            (rel for rel in rest if linked(rel, False)), rest[0]
        )
        rest.remove(chosen)
        have.add(chosen.name)
        ready = [f"({part.text})" for part in pending if part.reads <= have]
        pending = [part for part in pending if not part.reads <= have]
        tuples = (F.broadcast(tuples) if broadcast else tuples).join(
            inputs[chosen].alias(chosen.name), F.expr(" AND ".join(ready) or "true")
        )
    return tuples


def batch_tuples(sides: Sequence[Side], predicate: str, projection: Projection, broadcast: bool = True) -> DataFrame:
    """Every tuple one micro-batch produces, each with its owner. ``broadcast``: the arrivals are broadcast into the
    joins, so the state is scanned where it lies (a batch of at most ``BROADCAST_ROWS`` arrivals per relation); a larger
    batch is joined as Spark plans it, never collected whole to the driver."""
    return projection.unpacked(
        union_by_name([owned_tuples(owner, sides, predicate, projection, broadcast) for owner in sides])
    )
