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

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.engines import Eviction, Memberships, Merged, OnMatch
from state.engines.base import Aligned
from state.engines.table import Writer
from state.faults import step
from state.join.bounds import Watermarks, probe_eviction, store_eviction
from state.join.changes import DELETED, latest_held
from state.join.joiner import Side
from state.join.relations import ID, TS, Relation, others
from state.layout import IN_STORE, PROVENANCE, STATE_STATISTICS, Buffer, Warehouse, state_name, statistics_of
from state.log.batch_log import BatchPlan
from state.names import quoted

BUFFER_KEY = ID


@dataclass(frozen=True)
class StateTable:
    """The state table of ``relation``: its records kept by any of ``buffers`` (its store first)."""

    relation: Relation
    path: str
    buffers: tuple[Buffer, ...]

    @property
    def name(self) -> str:
        return state_name(self.relation)

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
    snapshots: dict[Relation, DataFrame | None],
    tables: Sequence[StateTable],
    arrivals: dict[Relation, DataFrame],
    replaced: dict[Relation, DataFrame] | None = None,
) -> list[Side]:
    """Each relation's arrivals with its buffers as they were before the batch (``snapshots``, each state table read
    once at the plan's version): each buffer a filter on its column (empty where the table keeps no such buffer),
    without the ids a change feed's batch ``replaced``. A table written before its relation gained a column (bronze
    evolves additively) reads it as null. Neither side carries bronze's provenance, which state tables need not hold
    (``stored_rows``): a predicate naming it fails to resolve rather than meet nulls."""
    replaced = replaced or {}
    arrivals = {rel: rows.drop(*PROVENANCE) for rel, rows in arrivals.items()}

    def widened(table: StateTable) -> DataFrame | None:
        state, like = snapshots[table.relation], arrivals[table.relation]
        if state is not None and set(like.columns) - set(state.columns):
            return state.unionByName(like.limit(0), allowMissingColumns=True)
        return state

    widest = {table.relation: widened(table) for table in tables}
    held_columns = {rel: set(state.columns) for rel, state in widest.items() if state is not None}
    membership = {table.relation: [buffer.column for buffer in table.buffers] for table in tables}

    def buffer(buffer: Buffer) -> DataFrame:
        state = widest[buffer.holds]
        if state is None or buffer.column not in held_columns[buffer.holds]:
            return arrivals[buffer.holds].limit(0)
        held = state.where(quoted(buffer.column)).drop(*membership[buffer.holds], *PROVENANCE)
        gone = replaced.get(buffer.holds)
        return held if gone is None else held.join(gone, ID, "left_anti")

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


def held_versions(state: DataFrame | None, changes: DataFrame) -> DataFrame | None:
    """The version the state table holds before the batch of each id ``changes`` names: its sequence, and whether it
    is a tombstone (state/join/changes.py). One scan, the batch's ids broadcast; None when the table holds nothing
    yet."""
    if state is None:
        return None
    return latest_held(state).join(F.broadcast(changes.select(ID).distinct()), ID, "left_semi")


@dataclass(frozen=True)
class BufferUpdate:
    """What one batch does to one state table: the rows its MERGE inserts and what leaves its buffers."""

    table: StateTable
    # the batch's arrivals of the relation the table keeps, with their membership columns (and a store's marks)
    rows: DataFrame
    eviction: Memberships  # each buffer's cutoff after the batch, and how long a row in none stays
    moved: bool  # some cutoff moved since before the batch
    exists: bool  # the table existed before the batch
    arrived: bool  # the relation has arrivals in the batch
    span: Aligned | None = None  # the range of ``_ts`` the arrivals span: where stored rows they name can be
    on_match: OnMatch | None = (
        None  # what rows of ``rows`` for records the table holds do to them (state/join/final.py)
    )

    @property
    def needed(self) -> bool:
        """A table that gains nothing and whose cutoffs did not move is left alone."""
        return self.arrived or self.moved or self.on_match is not None

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
    arrivals: dict[Relation, DataFrame],
    marks: tuple[Watermarks, Watermarks],
    rule: EvictionRule,
    spans: dict[Relation, Aligned | None],
) -> dict[str, BufferUpdate]:
    """For each relation's table, ``X_store ∪= ΔX`` and ``Y's probe buffer of X ∪= ΔX`` for every other Y, with what
    ``rule`` evicts from each buffer under the watermarks after the batch, keyed by the name the batch log records
    the table under. ``spans``: the ``_ts`` range of each relation's arrivals (None: it has none)."""
    before, after = marks
    updates = {}
    for table in tables:
        eviction, was = (_memberships(table, rule, marks) for marks in (after, before))
        exists = table.name in plan.state_versions
        moved = exists and any(cut is not None for cut in eviction.cutoffs.values()) and eviction != was
        span = spans.get(table.relation)
        updates[table.name] = BufferUpdate(
            table, kept_by_buffers(arrivals[table.relation], eviction), eviction, moved, exists, span is not None, span
        )
    return updates


def _memberships(table: StateTable, rule: EvictionRule, marks: Watermarks) -> Memberships:
    """Each buffer's cutoff under ``marks``, and the relation's own watermark, which a row in no buffer stays above."""
    own = marks.get(table.relation.name)
    return Memberships(
        {buffer.column: rule(buffer, marks) for buffer in table.buffers}, None if own is None else Eviction(TS, own)
    )


def store_probe_rule(relations: Sequence[Relation], window: int | None) -> EvictionRule:
    """The store/probe model's eviction (state/join/bounds.py): a store's rule for its own records, else a probe
    buffer's."""

    def rule(buffer: Buffer, marks: Watermarks) -> Eviction | None:
        if buffer.kind == "store":
            return store_eviction(buffer.store, relations, marks, window)
        return probe_eviction(buffer.store, buffer.holds, relations, marks, window)

    return rule


# Runs one table's write on its rows, checked by the table's rules (pipelines/batch/write.py): (table, rows, write).
Checked = Callable[[StateTable, DataFrame, Callable[[DataFrame], "Merged | None"]], "Merged | None"]


def update_buffers(
    updates: dict[str, BufferUpdate],
    writer: Callable[[StateTable], Writer],
    versions: dict[str, int],
    checked: Checked,
) -> dict[str, int]:
    """Apply each update by one MERGE on ``id`` that inserts and evicts, by ``writer`` (its table's commit of the
    batch), its rows checked by ``checked``; returns the rows evicted per table. ``versions``: each table's version
    the batch read (its plan's).

    The tables are independent and each MERGE is idempotent under its own transaction, so they run at once:
    a MERGE is mostly waiting (on the log, the scheduler, the commit), not computing."""
    with ThreadPoolExecutor(max_workers=max(1, len(updates))) as pool:
        evicted = {
            name: pool.submit(_update_buffer, name, update, writer(update.table), versions.get(name), checked)
            for name, update in updates.items()
        }
    return {name: count for name, future in evicted.items() if (count := future.result()) is not None}


def _update_buffer(
    name: str, update: BufferUpdate, writer: Writer, version: int | None, checked: Checked
) -> int | None:
    """One table's MERGE; the rows it evicted (counted again when the run this one resumes committed it, so a
    resumed batch logs what an uninterrupted one would)."""
    with step(name):
        if not update.needed:
            return None
        # The arrivals' ids are new: a MERGE looks for them only within their span of ``_ts``. Rows that name stored
        # records (marks, deletes, a change feed's new versions) may lie anywhere.
        aligned = update.span if update.on_match is None else None

        def write(rows: DataFrame) -> Merged | None:
            if update.inserts_only or not update.exists:  # an append: where a MERGE also scans the table for the keys
                written = writer.append(rows, properties=statistics_of(rows.columns, STATE_STATISTICS))
                return None if written is None else Merged(written, 0)
            return writer.merge(rows, key=BUFFER_KEY, evict=update.eviction, aligned=aligned, on_match=update.on_match)

        done = checked(update.table, update.rows, write)
    if done is not None:
        return done.evicted
    gone = update.eviction.gone()
    if not update.exists or gone is None:
        return 0  # the committed MERGE created the table or could delete nothing: it evicted nothing
    return writer.table.read(version, gone).count()


def replacing(updates: dict[str, BufferUpdate], relations: Sequence[Relation]) -> dict[str, BufferUpdate]:
    """The batch's state updates, each of ``relations`` (change feeds) replacing the stored rows its rows name
    (state/join/changes.py)."""
    return {
        name: replace(update, on_match=OnMatch(None, replace=True)) if update.table.relation in relations else update
        for name, update in updates.items()
    }


def stored_rows(arrivals: DataFrame, state: DataFrame | None) -> DataFrame:
    """A relation's arrivals as its state table keeps them: without bronze's provenance, which no batch reads from
    state, unless the table holds it (made so by an earlier lakejoin: it keeps getting it, so its rows stay alike)."""
    return arrivals.drop(*[name for name in PROVENANCE if state is None or name not in state.columns])


def kept_by_buffers(arrivals: DataFrame, eviction: Memberships) -> DataFrame:
    """The arrivals, each with a column per buffer saying whether it keeps them (at or above its cutoff), less those the
    table keeps no more (``Memberships.gone``): they can meet no future arrival, and no copy of them can arrive on time.
    A change feed's rows (state/join/changes.py) are all stored, tombstones in no buffer: each holds its id's version,
    which an older change must not undo."""
    changes = DELETED in arrivals.columns
    live = f"NOT coalesce({DELETED}, false)" if changes else "true"
    flags = {
        column: F.expr(live if cutoff is None else f"{quoted(cutoff.column)} >= {cutoff.below} AND {live}")
        for column, cutoff in eviction.cutoffs.items()
    }
    flagged = arrivals.withColumns(flags)
    gone = eviction.gone()
    if changes or gone is None:
        return flagged
    return flagged.where(f"NOT ({gone})")
