"""The store and probe buffers of every relation, kept as one Delta state table per relation MERGEd each batch.

A relation X's records are in its own store and in the probe buffer of every other relation's store, each buffer
with its own eviction horizon. ``silver/<x>_state`` holds each of X's records once, with a boolean column per buffer
(``_in_store``, ``_in_<y>_probes``): a batch reads the table once at the version its plan pins and takes each buffer
as a filter on its column, then one MERGE on ``id`` inserts the batch's arrivals, clears the columns of the buffers
that records leave and deletes the records no buffer keeps, so a replayed insert changes nothing. One table and one
MERGE per relation makes a batch linear in the number of relations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.batch_log import BatchPlan
from state.bounds import Watermarks, probe_eviction, store_eviction
from state.changes import DELETED, HELD
from state.engines import DeltaEngine, Eviction, Memberships, Merged, OnMatch, Txn, as_frame
from state.faults import step
from state.joiner import Side
from state.layout import IN_STORE, Buffer, Warehouse
from state.relations import ID, SEQ, TS, Relation, others

BUFFER_KEY = ID
# Ingest gives an id one content (another content is quarantined as a conflict), so rows with equal ids have
# equal event times: each MERGE looks for matches only within its rows' ``_ts`` range, and skips most of the
# table's files.
ALIGNED = TS


@dataclass(frozen=True)
class StateTable:
    """The state table of ``relation``: its records kept by any of ``buffers`` (its store first)."""

    relation: Relation
    path: str
    buffers: tuple[Buffer, ...]

    @property
    def name(self) -> str:
        """How the batch log records its version: ``r_state``."""
        return f"{self.relation.name}_state"

    @property
    def kind(self) -> str:
        """Which rules check its rows (expectations/suites/state.yml)."""
        return "state"


def state_tables(warehouse: Warehouse, probes: bool = True) -> list[StateTable]:
    """Every relation's state table: its records in its store and, with ``probes``, in each other relation's probe
    buffer (an as-of join keeps none)."""
    return [
        StateTable(
            rel,
            warehouse.state(rel),
            (Buffer(rel, rel), *(Buffer(store, rel) for store in others(rel, warehouse.relations) if probes)),
        )
        for rel in warehouse.relations
    ]


def read_sides(
    engine: DeltaEngine, plan: BatchPlan, tables: Sequence[StateTable], arrivals: dict[Relation, DataFrame], replaced: dict[Relation, pa.Array] | None = None
) -> list[Side]:
    """Each relation's arrivals with its buffers as they were before the batch (the plan's versions): each state
    table read once, each buffer a filter on its column (empty where the table keeps no such buffer), without the
    versions a change feed's batch ``replaced`` (per relation, ids). A table written before its relation gained a
    column (bronze evolves additively) reads it as null."""
    replaced = replaced or {}

    def at_plan(table: StateTable) -> DataFrame | None:
        version = plan.state_versions.get(table.name)
        snapshot = None if version is None else engine.read(table.path, version)
        if snapshot is None:
            return None
        like = arrivals[table.relation]
        if set(like.columns) - set(snapshot.columns):
            return snapshot.unionByName(like.limit(0), allowMissingColumns=True)
        return snapshot

    snapshots = {table.relation: at_plan(table) for table in tables}
    membership = {table.relation: [buffer.column for buffer in table.buffers] for table in tables}

    def buffer(buffer: Buffer) -> DataFrame:
        snapshot = snapshots[buffer.holds]
        if snapshot is None or buffer.column not in snapshot.columns:
            return arrivals[buffer.holds].limit(0)
        held = snapshot.where(F.col(buffer.column)).drop(*membership[buffer.holds])
        gone = replaced.get(buffer.holds)
        if gone is None or len(gone) == 0:
            return held
        ids = as_frame(engine.spark, pa.table({ID: gone}))
        return held.join(F.broadcast(ids), ID, "left_anti")

    relations = [table.relation for table in tables]
    return [
        Side(
            relation=rel,
            arrivals=arrivals[rel],
            store=buffer(Buffer(rel, rel)),
            probes={other: buffer(Buffer(rel, other)) for other in others(rel, relations)},
        )
        for rel in relations
    ]


def held_versions(engine: DeltaEngine, plan: BatchPlan, table: StateTable, changes: pa.Table) -> pa.Table:
    """The version the state table holds before the batch of each id ``changes`` names (state/changes.py ``HELD``):
    its sequence, and whether it is a tombstone. One scan, the batch's ids broadcast."""
    version = plan.state_versions.get(table.name)
    snapshot = None if version is None or changes.num_rows == 0 else engine.read(table.path, version)
    if snapshot is None:
        return HELD.empty_table()
    ids = as_frame(engine.spark, pa.table({ID: pc.unique(changes[ID])}))
    deleted = F.col(DELETED) if DELETED in snapshot.columns else F.lit(False)
    held = snapshot.join(F.broadcast(ids), ID, "left_semi").select(ID, F.col(SEQ).cast("long"), F.coalesce(deleted, F.lit(False)).alias(DELETED))
    return held.toArrow().cast(HELD)


@dataclass(frozen=True)
class BufferUpdate:
    """What one batch does to one state table: the rows its MERGE inserts and what leaves its buffers."""

    table: StateTable
    rows: pa.Table  # the batch's arrivals of the relation that some buffer keeps, with their membership columns (and a store's marks)
    eviction: Memberships  # each buffer's cutoff after the batch
    moved: bool  # some cutoff moved since before the batch
    exists: bool  # the table existed before the batch
    on_match: OnMatch | None = None  # what rows of ``rows`` for records the table holds do to them (state/final.py)

    @property
    def needed(self) -> bool:
        """A table that gains nothing and whose cutoffs did not move is left alone."""
        return self.rows.num_rows > 0 or self.moved

    @property
    def inserts_only(self) -> bool:
        """Nothing stored changes: no cutoff moved and no stored record is marked or deleted."""
        return not self.moved and self.on_match is None

    @property
    def store_cutoff(self) -> Eviction | None:
        """The cutoff of the relation's own store after the batch."""
        return self.eviction.cutoffs[IN_STORE]


# What a buffer may evict under a batch's watermarks.
EvictionRule = Callable[[Buffer, Watermarks], "Eviction | None"]


def buffer_updates(
    plan: BatchPlan,
    tables: Sequence[StateTable],
    arrivals: dict[Relation, pa.Table],
    marks: tuple[Watermarks, Watermarks],
    rule: EvictionRule,
) -> dict[str, BufferUpdate]:
    """For each relation's table, ``X_store ∪= ΔX`` and ``Y's probe buffer of X ∪= ΔX`` for every other Y, with what
    ``rule`` evicts from each buffer under the watermarks after the batch, keyed by the name the batch log records
    the table under."""
    before, after = marks
    updates = {}
    for table in tables:
        eviction = Memberships({buffer.column: rule(buffer, after) for buffer in table.buffers})
        was = Memberships({buffer.column: rule(buffer, before) for buffer in table.buffers})
        exists = table.name in plan.state_versions
        moved = exists and any(cut is not None for cut in eviction.cutoffs.values()) and eviction != was
        updates[table.name] = BufferUpdate(table, kept_by_buffers(arrivals[table.relation], eviction), eviction, moved, exists)
    return updates


def store_probe_rule(relations: Sequence[Relation], window: int | None) -> EvictionRule:
    """The store/probe model's eviction (state/bounds.py): a store's rule for its own records, else a probe buffer's."""

    def rule(buffer: Buffer, marks: Watermarks) -> Eviction | None:
        if buffer.kind == "store":
            return store_eviction(buffer.store, relations, marks, window)
        return probe_eviction(buffer.store, buffer.holds, relations, marks, window)

    return rule


def update_buffers(
    engine: DeltaEngine, plan: BatchPlan, updates: dict[str, BufferUpdate], txn_for: Callable[[str], Txn]
) -> dict[str, int]:
    """Apply each update by one MERGE on ``id`` that inserts and evicts; returns the rows evicted per table.

    The tables are independent and each MERGE is idempotent under its own transaction, so they run at once:
    a MERGE is mostly waiting (on the log, the scheduler, the commit), not computing."""
    with ThreadPoolExecutor(max_workers=len(updates)) as pool:
        evicted = {name: pool.submit(_update_buffer, engine, plan, name, update, txn_for) for name, update in updates.items()}
    return {name: count for name, future in evicted.items() if (count := future.result()) is not None}


def _update_buffer(engine: DeltaEngine, plan: BatchPlan, name: str, update: BufferUpdate, txn_for: Callable[[str], Txn]) -> int | None:
    """One table's MERGE; the rows it evicted (counted again when the run this one resumes committed it, so a
    resumed batch logs what an uninterrupted one would)."""
    with step(name):
        if not update.needed:
            return None
        # A change feed's new version may move its record in time: its stored row is looked for anywhere.
        aligned = None if update.on_match is not None and update.on_match.replace else ALIGNED
        merged = _insert(engine, update, txn_for(update.table.path)) if update.inserts_only else engine.merge(
            update.table.path, update.rows, BUFFER_KEY, update.eviction, txn_for(update.table.path), aligned, update.on_match
        )
    if merged is not None:
        return merged.evicted
    gone = update.eviction.gone()
    if not update.exists or gone is None:
        return 0  # the committed MERGE created the table or could delete nothing: it evicted nothing
    return engine.read(update.table.path, plan.state_versions[name], gone).count()


def _insert(engine: DeltaEngine, update: BufferUpdate, txn: Txn) -> Merged | None:
    """An update that only inserts is an append (one write, where a MERGE also scans the table for the keys): a
    batch's arrivals are new ids (ingest quarantines or skips an id seen before), and the app transaction makes a
    replayed append a no-op."""
    written = engine.append(update.table.path, update.rows, txn)
    return None if written is None else Merged(written, 0)


def replacing(updates: dict[str, BufferUpdate], relations: Sequence[Relation]) -> dict[str, BufferUpdate]:
    """The batch's state updates, each of ``relations`` (change feeds whose batch changes records the table holds)
    replacing the stored rows its rows name (state/changes.py)."""
    return {
        name: replace(update, on_match=OnMatch(None, replace=True)) if update.table.relation in relations else update
        for name, update in updates.items()
    }


def kept_by_buffers(arrivals: pa.Table, eviction: Memberships) -> pa.Table:
    """The arrivals, each with a column per buffer saying whether it keeps them (at or above its cutoff), less those no
    buffer keeps: they can meet no future arrival, so they are never stored. A change feed's rows (state/changes.py)
    are all stored, tombstones in no buffer: each holds its id's version, which an older change must not undo."""
    flagged = arrivals
    live = None if DELETED not in arrivals.column_names else pc.invert(arrivals[DELETED])
    for column, cutoff in eviction.cutoffs.items():
        kept = pa.array([True] * arrivals.num_rows, pa.bool_()) if cutoff is None else pc.greater_equal(arrivals[cutoff.column], cutoff.below)
        flagged = flagged.append_column(column, kept if live is None else pc.and_(kept, live))
    if not eviction.cutoffs or arrivals.num_rows == 0 or live is not None:
        return flagged
    return flagged.filter(reduce(pc.or_, [flagged[column] for column in eviction.cutoffs]))
