"""The store and probe buffers of every relation, kept as Delta state tables MERGEd each batch.

``<x>_store`` holds X's own records; X's probe buffers hold the records of every other relation that
probed X's store (``<x>_probes`` with two relations, ``<x>_probes_<y>`` per other Y with more). A batch
reads each at the version its plan pins, then one MERGE on ``id`` per table inserts the batch's arrivals and
evicts what the watermarks allow, so a replayed insert changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from state.batch_log import BatchPlan
from state.bounds import Watermarks, probe_eviction, store_eviction
from state.engines import DeltaEngine, Eviction, OnMatch, Txn
from state.faults import step
from state.joiner import Side
from state.layout import Buffer, Warehouse
from state.relations import ID, TS, Relation, others

BUFFER_KEY = ID
# Ingest gives an id one content (another content is quarantined as a conflict), so rows with equal ids have
# equal event times: each MERGE looks for matches only within its rows' ``_ts`` range, and skips most of the
# table's files.
ALIGNED = TS


def read_sides(
    engine: DeltaEngine, warehouse: Warehouse, plan: BatchPlan, arrivals: dict[Relation, DataFrame]
) -> list[Side]:
    """Each relation's arrivals with its buffers as they were before the batch (the plan's versions). A buffer
    written before its relation gained a column (bronze evolves additively) reads it as null."""

    def at_plan(name: str, path: str, empty_like: DataFrame) -> DataFrame:
        version = plan.state_versions.get(name)
        snapshot = None if version is None else engine.read(path, version)
        if snapshot is None:
            return empty_like.limit(0)
        if set(empty_like.columns) - set(snapshot.columns):
            return snapshot.unionByName(empty_like.limit(0), allowMissingColumns=True)
        return snapshot

    read = {(table.store, table.holds): at_plan(table.name, table.path, arrivals[table.holds]) for table in warehouse.buffer_tables()}
    return [
        Side(
            relation=rel,
            arrivals=arrivals[rel],
            store=read[(rel, rel)],
            probes={other: read[(rel, other)] for other in others(rel, warehouse.relations)},
        )
        for rel in warehouse.relations
    ]


@dataclass(frozen=True)
class BufferUpdate:
    """What one batch does to one state table: the rows its MERGE inserts and the eviction it applies."""

    table: Buffer
    rows: pa.Table  # the batch's arrivals of the relation the table holds that it keeps (and a store's marks)
    eviction: Eviction | None  # the cutoff after the batch
    moved: bool  # the cutoff moved since before the batch
    exists: bool  # the table existed before the batch
    on_match: OnMatch | None = None  # what rows of ``rows`` for records the table holds do to them (state/final.py)

    @property
    def needed(self) -> bool:
        """A table that gains nothing and whose cutoff did not move is left alone."""
        return self.rows.num_rows > 0 or self.moved


# What a state table may evict under a batch's watermarks.
EvictionRule = Callable[[Buffer, Watermarks], "Eviction | None"]


def buffer_updates(
    plan: BatchPlan,
    tables: Sequence[Buffer],
    arrivals: dict[Relation, pa.Table],
    marks: tuple[Watermarks, Watermarks],
    rule: EvictionRule,
) -> dict[str, BufferUpdate]:
    """For each table, ``table ∪= the arrivals of the relation it holds`` (``X_store ∪= ΔX``, ``X's buffer of Y ∪=
    ΔY``), with the eviction ``rule`` allows under the watermarks after the batch, keyed by the name the batch log
    records the table under."""
    before, after = marks
    updates = {}
    for table in tables:
        eviction, was = rule(table, after), rule(table, before)
        exists = table.name in plan.state_versions
        kept = _not_evictable(arrivals[table.holds], eviction)
        moved = exists and eviction is not None and eviction != was
        updates[table.name] = BufferUpdate(table, kept, eviction, moved, exists)
    return updates


def store_probe_rule(relations: Sequence[Relation], window: int | None) -> EvictionRule:
    """The store/probe model's eviction (state/bounds.py): a store's rule for its own records, else a probe buffer's."""

    def rule(table: Buffer, marks: Watermarks) -> Eviction | None:
        if table.kind == "store":
            return store_eviction(table.store, relations, marks, window)
        return probe_eviction(table.store, table.holds, relations, marks, window)

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
        merged = engine.merge(update.table.path, update.rows, BUFFER_KEY, update.eviction, txn_for(update.table.path), ALIGNED, update.on_match)
    if merged is not None:
        return merged.evicted
    if not update.exists or update.eviction is None:
        return 0  # the committed MERGE created the table or had no cutoff: it evicted nothing
    return engine.read(update.table.path, plan.state_versions[name], update.eviction.sql()).count()


def _not_evictable(arrivals: pa.Table, eviction: Eviction | None) -> pa.Table:
    """Arrivals the eviction would remove at once are never stored (they can meet no future arrival)."""
    if eviction is None or len(arrivals) == 0:
        return arrivals
    return arrivals.filter(pc.greater_equal(arrivals[eviction.column], eviction.below))
