"""A pure-Python reference of the store/probe protocol (docs/design.md sections 2 and 2.8), for N relations.

Per record: ``store`` at its own relation's store (joins buffered probes newer than it), then ``probe`` at every
other store (joins the tuples that store owns and this record completes, then enters its probe buffer). Per
batch: each store joins its buffers and the batch's arrivals at once, then evicts what no future arrival can
use. The Spark pipeline must produce exactly what these produce, whatever the arrival order and batch split.
Two relations ``r`` and ``s`` are the N = 2 case, seen as ``Pair``s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import product

TWO = ("r", "s")


@dataclass(frozen=True)
class Record:
    relation: str
    id: str
    ts: int
    key: str | None
    payload: str | None = None
    rank: int = -1  # the relation's place in the listed relations; r and s have theirs by default

    def __post_init__(self) -> None:
        if self.rank < 0:
            if self.relation not in TWO:
                raise ValueError(f"record of relation {self.relation!r} needs its rank")
            object.__setattr__(self, "rank", TWO.index(self.relation))

    def order(self) -> tuple[int, int, str]:
        return (self.ts, self.rank, self.id)

    def older_than(self, other: Record) -> bool:
        return self.order() < other.order()


Members = dict[str, Record]  # relation -> the tuple's member of it
TuplePredicate = Callable[[Members], bool]
Predicate = Callable[[Record, Record], bool]  # (r, s) -> match, for two relations


@dataclass(frozen=True)
class Match:
    """One gold tuple: each relation's member id, and the relation of its oldest member (its owner)."""

    ids: tuple[tuple[str, str], ...]  # (relation, id), in the relations' order
    owner: str


def match_of(members: Members, relations: Sequence[str]) -> Match:
    oldest = min(members.values(), key=Record.order)
    return Match(tuple((name, members[name].id) for name in relations), oldest.relation)


def same_key(members: Members) -> bool:
    keys = {record.key for record in members.values()}
    return None not in keys and len(keys) == 1


def banded(window: int | None, predicate: TuplePredicate = same_key) -> TuplePredicate:
    """``predicate`` and, with a band window, every two members within ``window`` of each other."""
    if window is None:
        return predicate
    return lambda members: (
        predicate(members) and max(m.ts for m in members.values()) - min(m.ts for m in members.values()) <= window
    )


def combinations(
    choices: dict[str, list[Record]], relations: Sequence[str], predicate: TuplePredicate
) -> list[Members]:
    """Every tuple taking one record per relation from ``choices`` that satisfies ``predicate``."""
    every = (dict(zip(relations, combination)) for combination in product(*(choices[name] for name in relations)))
    return [members for members in every if predicate(members)]


def tuples(choices: dict[str, list[Record]], relations: Sequence[str], predicate: TuplePredicate) -> list[Match]:
    return [match_of(members, relations) for members in combinations(choices, relations, predicate)]


@dataclass
class Store:
    """One relation's store: its own records, and a probe buffer per other relation (docs/design.md 2.8)."""

    relation: str
    relations: Sequence[str]
    stored: list[Record] = field(default_factory=list)
    probes: dict[str, list[Record]] = field(default_factory=dict)

    def buffered(self, name: str) -> list[Record]:
        return self.stored if name == self.relation else self.probes.setdefault(name, [])

    def store(self, record: Record, predicate: TuplePredicate) -> list[Match]:
        """A record of this relation arrives: the tuples it is the oldest member of, from probes newer than it
        (a delayed store)."""
        self.stored.append(record)
        newer = {
            name: [p for p in self.buffered(name) if record.older_than(p)]
            for name in self.relations
            if name != self.relation
        }
        return tuples({**newer, self.relation: [record]}, self.relations, predicate)

    def probe(self, record: Record, predicate: TuplePredicate) -> list[Match]:
        """A record of another relation arrives: the tuples this store owns that it completes (a stored record
        older than it, the other members from the probe buffer, all newer than the stored one)."""
        found = []
        for oldest in (s for s in self.stored if s.older_than(record)):
            rest = {
                name: [p for p in self.buffered(name) if oldest.older_than(p)]
                for name in self.relations
                if name not in (self.relation, record.relation)
            }
            found += tuples({**rest, self.relation: [oldest], record.relation: [record]}, self.relations, predicate)
        self.buffered(record.relation).append(record)
        return found


def stores_of(relations: Sequence[str]) -> dict[str, Store]:
    return {name: Store(name, relations) for name in relations}


def produced_per_arrival(
    arrivals: Iterable[Record], relations: Sequence[str], predicate: TuplePredicate = same_key
) -> list[tuple[Record, list[Match]]]:
    """Each arrival, and the tuples the stores produce as it comes in (its store, then its probe of every other)."""
    stores = stores_of(relations)
    produced = []
    for record in arrivals:
        found = stores[record.relation].store(record, predicate)
        for name, store in stores.items():
            if name != record.relation:
                found += store.probe(record, predicate)
        produced.append((record, found))
    return produced


def join_each_record(
    arrivals: Iterable[Record], relations: Sequence[str], predicate: TuplePredicate = same_key
) -> list[Match]:
    """Every tuple the stores produce as ``arrivals`` come in one by one."""
    return [match for _, found in produced_per_arrival(arrivals, relations, predicate) for match in found]


def join_all(records: Iterable[Record], relations: Sequence[str], predicate: TuplePredicate = same_key) -> list[Match]:
    """The one-shot N-way join, each tuple owned by its oldest member's relation: what any arrival order must give."""
    records = list(records)
    return tuples({name: [rec for rec in records if rec.relation == name] for name in relations}, relations, predicate)


@dataclass
class BatchJoiner:
    """The batch form (docs/design.md 2.8), one batch at a time: each store joins its buffers and the batch's
    arrivals at once, keeping the tuples it owns that have a new member; late arrivals are left out (with a
    lateness); then every buffer evicts below its cutoff, from the watermarks after the batch."""

    relations: Sequence[str]
    predicate: TuplePredicate = same_key
    lateness: int | None = None
    window: int | None = None
    marks: dict[str, int] = field(default_factory=dict)  # each relation's watermark after the batches so far
    stores: dict[str, Store] = field(init=False)

    def __post_init__(self) -> None:
        self.stores = stores_of(self.relations)

    def step(self, batch: list[Record]) -> tuple[list[Record], list[Match]]:
        """The batch's on-time records, and the tuples it produces."""
        arrived = batch if self.lateness is None else on_time(batch, self.marks)
        fresh = {id(rec) for rec in arrived}
        new = {name: [rec for rec in arrived if rec.relation == name] for name in self.relations}
        found = []
        for owner, store in self.stores.items():
            choices = {name: store.buffered(name) + new[name] for name in self.relations}
            with_new = (
                members
                for members in combinations(choices, self.relations, self.predicate)
                if any(id(m) in fresh for m in members.values())
            )
            found += [
                match for match in (match_of(members, self.relations) for members in with_new) if match.owner == owner
            ]
        for store in self.stores.values():
            for name in self.relations:
                store.buffered(name).extend(new[name])
        if self.lateness is not None:
            advance(self.marks, arrived, self.lateness)
            for store in self.stores.values():
                for name in self.relations:
                    cutoff = eviction_cutoff(store.relation, name, self.relations, self.marks, self.window)
                    if cutoff is not None:
                        store.buffered(name)[:] = [rec for rec in store.buffered(name) if rec.ts >= cutoff]
        return arrived, found

    def held(self) -> int:
        return sum(len(store.buffered(name)) for store in self.stores.values() for name in self.relations)


def join_in_batches(
    batches: Iterable[list[Record]],
    relations: Sequence[str],
    predicate: TuplePredicate = same_key,
    lateness: int | None = None,
    window: int | None = None,
) -> tuple[list[Match], list[int]]:
    """Every tuple the batch form produces over ``batches``, and the rows all buffers hold after each batch."""
    joiner = BatchJoiner(relations, predicate, lateness, window)
    found: list[Match] = []
    held: list[int] = []
    for batch in batches:
        found += joiner.step(batch)[1]
        held.append(joiner.held())
    return found, held


def on_time(batch: list[Record], marks: dict[str, int]) -> list[Record]:
    """The batch's records not below their relation's watermark before it (docs/design.md section 4)."""
    return [rec for rec in batch if rec.ts >= marks.get(rec.relation, rec.ts)]


def advance(marks: dict[str, int], arrived: Iterable[Record], lateness: int) -> None:
    """Each relation's watermark after a batch: its newest on-time ts minus ``lateness``, never moving back."""
    for rec in arrived:
        marks[rec.relation] = max(marks.get(rec.relation, rec.ts - lateness), rec.ts - lateness)


def eviction_cutoff(
    store: str, holds: str, relations: Sequence[str], marks: dict[str, int], window: int | None
) -> int | None:
    """The ``ts`` below which ``store``'s buffer of ``holds`` records can go (docs/design.md 2.8), given the
    watermarks after a batch; None when nothing can. Its own records: once every other relation's watermark is
    past ``ts + window``. A probe: once ``store``'s watermark is past it (no future record of ``store`` is older)
    and every third relation's watermark past ``ts + window`` (no future member completes a stored record's tuple)."""
    if store == holds:
        needed = [name for name in relations if name != store]
        if window is None or any(name not in marks for name in needed):
            return None
        return min(marks[name] for name in needed) - window
    thirds = [name for name in relations if name not in (store, holds)]
    if store not in marks or (thirds and (window is None or any(name not in marks for name in thirds))):
        return None
    return min([marks[store], *(marks[name] - window for name in thirds)])


# Two relations, r and s: the N = 2 case as pairs.


@dataclass(frozen=True)
class Pair:
    r_id: str | None  # None: an outer row of an s record (reference_final.py)
    s_id: str | None  # None: an outer, semi or anti row of an r record
    owner: str


def equal_keys(r: Record, s: Record) -> bool:
    return same_key({"r": r, "s": s})


def as_tuple_predicate(predicate: Predicate) -> TuplePredicate:
    return lambda members: predicate(members["r"], members["s"])


def pairs_of(matches: Iterable[Match]) -> list[Pair]:
    return [Pair(dict(match.ids)["r"], dict(match.ids)["s"], match.owner.upper()) for match in matches]


def join_in_arrival_order(arrivals: Iterable[Record], predicate: Predicate = equal_keys) -> list[Pair]:
    """Every pair the two stores produce as ``arrivals`` come in one by one."""
    return pairs_of(join_each_record(arrivals, TWO, as_tuple_predicate(predicate)))


def batch_join(records: Iterable[Record], predicate: Predicate = equal_keys) -> list[Pair]:
    """The one-shot join, each pair owned by its older member's relation: what any arrival order must give."""
    return pairs_of(join_all(records, TWO, as_tuple_predicate(predicate)))


def within(window: int | None, predicate: Predicate = equal_keys) -> Predicate:
    """``predicate`` and, with a band window, ``|r.ts - s.ts| <= window`` (``banded`` for two)."""
    banded_pair = banded(window, as_tuple_predicate(predicate))
    return lambda r, s: banded_pair({"r": r, "s": s})


def respects_lateness(arrivals: Iterable[Record], lateness: int) -> bool:
    """No record arrives more than ``lateness`` below the newest ts its relation had before it."""
    newest: dict[str, int] = {}
    for record in arrivals:
        if record.ts < newest.get(record.relation, record.ts) - lateness:
            return False
        newest[record.relation] = max(newest.get(record.relation, record.ts), record.ts)
    return True


def late_in_batches(batches: Iterable[list[Record]], lateness: int) -> list[Record]:
    """docs/design.md section 4 per micro-batch: a record is late when its ts is below its relation's watermark
    after the previous batches, ``max(ts of on-time records) - lateness``."""
    marks: dict[str, int] = {}
    late: list[Record] = []
    for batch in batches:
        arrived = on_time(batch, marks)
        late += [rec for rec in batch if rec not in arrived]
        advance(marks, arrived, lateness)
    return late
