"""A pure-Python reference of the per-record store/probe protocol (docs/design.md section 2).

One record at a time: ``store`` at its own relation's store (joins buffered probes that are newer),
then ``probe`` at the other store (joins stored records that are older, then enters its probe buffer).
The Spark pipeline must produce exactly what this produces, whatever the batch split.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

RANK = {"r": 0, "s": 1}


@dataclass(frozen=True)
class Record:
    relation: str
    id: str
    ts: int
    key: str | None
    payload: str | None = None

    def order(self) -> tuple[int, int, str]:
        return (self.ts, RANK[self.relation], self.id)

    def older_than(self, other: Record) -> bool:
        return self.order() < other.order()


Predicate = Callable[[Record, Record], bool]  # (r, s) -> match


def equal_keys(r: Record, s: Record) -> bool:
    return r.key is not None and s.key is not None and r.key == s.key


@dataclass(frozen=True)
class Pair:
    r_id: str
    s_id: str
    owner: str


@dataclass
class StoreBuffer:
    records: list[Record] = field(default_factory=list)


@dataclass
class ProbeBuffer:
    records: list[Record] = field(default_factory=list)


@dataclass
class Joiner:
    """One relation's store: its StoreBuffer of own records and the ProbeBuffer of the other's probes."""

    relation: str
    store_buffer: StoreBuffer = field(default_factory=StoreBuffer)
    probe_buffer: ProbeBuffer = field(default_factory=ProbeBuffer)

    def store(self, record: Record, predicate: Predicate) -> list[Pair]:
        """A record of this relation arrives: it joins every buffered probe newer than it (delayed store)."""
        self.store_buffer.records.append(record)
        return [self._pair(record, probe, predicate) for probe in self.probe_buffer.records if record.older_than(probe)]

    def probe(self, record: Record, predicate: Predicate) -> list[Pair]:
        """A record of the other relation arrives: it joins every stored record older than it."""
        self.probe_buffer.records.append(record)
        return [self._pair(stored, record, predicate) for stored in self.store_buffer.records if stored.older_than(record)]

    def _pair(self, own: Record, other: Record, predicate: Predicate) -> Pair | None:
        r, s = (own, other) if own.relation == "r" else (other, own)
        return Pair(r.id, s.id, self.relation.upper()) if predicate(r, s) else None


def join_in_arrival_order(arrivals: Iterable[Record], predicate: Predicate = equal_keys) -> list[Pair]:
    """Every pair the two stores produce as ``arrivals`` come in one by one."""
    joiners = {name: Joiner(name) for name in RANK}
    pairs: list[Pair | None] = []
    for record in arrivals:
        pairs += joiners[record.relation].store(record, predicate)
        for name, joiner in joiners.items():
            if name != record.relation:
                pairs += joiner.probe(record, predicate)
    return [pair for pair in pairs if pair is not None]


def batch_join(records: Iterable[Record], predicate: Predicate = equal_keys) -> list[Pair]:
    """The one-shot join, each pair owned by its older member's relation: what any arrival order must give."""
    records = list(records)
    rs = [rec for rec in records if rec.relation == "r"]
    ss = [rec for rec in records if rec.relation == "s"]
    return [Pair(r.id, s.id, "R" if r.older_than(s) else "S") for r in rs for s in ss if predicate(r, s)]


def within(window: int | None, predicate: Predicate = equal_keys) -> Predicate:
    """``predicate`` and, with a band window, ``|r.ts - s.ts| <= window``."""
    if window is None:
        return predicate
    return lambda r, s: predicate(r, s) and abs(r.ts - s.ts) <= window


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
        on_time = [rec for rec in batch if rec.ts >= marks.get(rec.relation, rec.ts)]
        late += [rec for rec in batch if rec not in on_time]
        for rec in on_time:
            marks[rec.relation] = max(marks.get(rec.relation, rec.ts - lateness), rec.ts - lateness)
    return late
