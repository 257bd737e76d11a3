"""A pure-Python reference of the joins that emit a row once it is final (docs/design.md section 2.9): outer, semi
and anti joins of two relations, and the backward as-of join. ``r`` is the left relation, ``s`` the right one.

One mechanism serves all of them: a record is **final** once its store's cutoff (``eviction_cutoff`` of its
relation's own records) has passed it, with a horizon of W (the window) for outer and anti rows and 0 for an
as-of match; its row is emitted in that batch, once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.reference import (
    TWO,
    BatchJoiner,
    Pair,
    Predicate,
    Record,
    advance,
    as_tuple_predicate,
    equal_keys,
    eviction_cutoff,
    on_time,
    pairs_of,
)

KINDS = ("inner", "left", "right", "full", "semi", "anti")
PRESERVED = {"inner": (), "left": ("r",), "right": ("s",), "full": ("r", "s"), "semi": (), "anti": ("r",)}


def unmatched_row(record: Record) -> Pair:
    """An outer or anti row: the record's side, nulls for the other, owned by the record's relation."""
    return Pair(record.id, None, "R") if record.relation == "r" else Pair(None, record.id, "S")


@dataclass
class Finality:
    """Records waiting to be final, per relation, and the batch that makes each final (the one mechanism)."""

    horizon: int | None  # how far past a record's ts the other relation's watermark must be
    waiting: dict[str, list[Record]] = field(default_factory=lambda: {name: [] for name in TWO})

    def add(self, records: Iterable[Record]) -> None:
        for record in records:
            self.waiting[record.relation].append(record)

    def take_final(self, relation: str, marks: dict[str, int]) -> list[Record]:
        """The waiting records of ``relation`` now below their store's cutoff: they leave the wait, once."""
        cutoff = eviction_cutoff(relation, relation, TWO, marks, self.horizon)
        if cutoff is None:
            return []
        final = [rec for rec in self.waiting[relation] if rec.ts < cutoff]
        self.waiting[relation] = [rec for rec in self.waiting[relation] if rec.ts >= cutoff]
        return final


def join_kind_in_batches(
    batches: Iterable[list[Record]],
    kind: str,
    predicate: Predicate = equal_keys,
    lateness: int | None = None,
    window: int | None = None,
) -> tuple[list[Pair], Finality]:
    """Gold rows of a ``kind`` join over ``batches``: the inner pairs as they come (not for semi and anti); a semi
    row at its left record's first match (it never waits); an outer or anti row when its record is final and
    never matched.
    Returns the rows and what still waits."""
    joiner = BatchJoiner(TWO, as_tuple_predicate(predicate), lateness, window)
    finality = Finality(window)
    matched: set[tuple[str, str]] = set()
    rows: list[Pair] = []
    for batch in batches:
        arrived, found = joiner.step(batch)
        pairs = pairs_of(found)
        if kind in ("inner", "left", "right", "full"):
            rows += pairs
        if kind == "semi":
            first = {pair.r_id for pair in pairs if ("r", pair.r_id) not in matched}
            rows += [Pair(r_id, None, "R") for r_id in sorted(first)]
        matched |= {("r", pair.r_id) for pair in pairs} | {("s", pair.s_id) for pair in pairs}
        finality.add(rec for rec in arrived if rec.relation in PRESERVED[kind])
        for relation in PRESERVED[kind]:
            rows += [
                unmatched_row(rec)
                for rec in finality.take_final(relation, joiner.marks)
                if (relation, rec.id) not in matched
            ]
    return rows, finality


def best_match(left: Record, rights: Iterable[Record], tolerance: int | None) -> Record | None:
    """The right record of ``left``'s key with the greatest (ts, rank, id) at or before its time, within tolerance."""
    candidates = [
        right
        for right in rights
        if left.key is not None
        and right.key == left.key
        and right.ts <= left.ts
        and (tolerance is None or left.ts - right.ts <= tolerance)
    ]
    return max(candidates, key=Record.order, default=None)


def asof_in_batches(
    batches: Iterable[list[Record]], lateness: int, tolerance: int | None = None, keep_unmatched: bool = False
) -> tuple[list[Pair], list[int]]:
    """Gold rows of the as-of join over ``batches``: a left record's row once the right relation's watermark is past
    its time (its match can no longer change), with its best match among the kept right records; ``keep_unmatched``
    for the ``left`` variant. Returns the rows and the records held (right buffer and waiting left) after each batch."""
    marks: dict[str, int] = {}
    finality = Finality(0)
    rights: list[Record] = []
    rows: list[Pair] = []
    held: list[int] = []
    for batch in batches:
        arrived = on_time(batch, marks)
        rights += [rec for rec in arrived if rec.relation == "s"]
        finality.add(rec for rec in arrived if rec.relation == "r")
        advance(marks, arrived, lateness)
        for left in finality.take_final("r", marks):
            right = best_match(left, rights, tolerance)
            if right is not None or keep_unmatched:
                rows.append(Pair(left.id, None if right is None else right.id, "R"))
        rights = kept_rights(rights, finality.waiting["r"], marks, tolerance)
        held.append(len(rights) + len(finality.waiting["r"]))
    return rows, held


def kept_rights(
    rights: list[Record], waiting: list[Record], marks: dict[str, int], tolerance: int | None
) -> list[Record]:
    """The right records some left record may still take: every left still to be emitted is at or after the
    floor, the lower watermark (a waiting left is at or after the right one, which has not passed it; a left to
    come at or after the left one); at or below it only the latest right of each key (by time, then id: of two at
    one time the later id wins) can be anyone's match, and only within tolerance of the floor. ``waiting`` is above the floor by construction."""
    if "r" not in marks or "s" not in marks:
        return rights
    floor = min(marks["r"], marks["s"])
    assert all(rec.ts >= floor for rec in waiting)

    def superseded(right: Record) -> bool:
        return any(other.key == right.key and right.older_than(other) and other.ts <= floor for other in rights)

    return [
        right
        for right in rights
        if right.key is not None
        and (right.ts > floor or (not superseded(right) and (tolerance is None or floor - right.ts <= tolerance)))
    ]
