"""The store and probe buffers of every relation, kept as Delta state tables MERGEd each batch.

``<x>_store`` holds X's own records; ``<x>_probes`` holds the records of the other relation that
probed X's store. A batch reads each at the version its plan pins, then one MERGE on ``id`` per table
inserts the batch's arrivals and evicts what the watermarks allow, so a replayed insert changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from state.batch_log import BatchPlan
from state.bounds import Watermarks, probe_eviction, store_eviction
from state.engines import DeltaEngine, Eviction, Txn
from state.faults import step
from state.joiner import Side
from state.layout import Warehouse
from state.relations import RELATIONS, Relation, others

BUFFER_KEY = "id"


def partner(rel: Relation) -> Relation:
    """The relation whose records probe ``rel``'s store (two-way joins have exactly one)."""
    (other,) = others(rel)
    return other


def read_sides(
    engine: DeltaEngine, warehouse: Warehouse, plan: BatchPlan, arrivals: dict[Relation, DataFrame]
) -> list[Side]:
    """Each relation's arrivals with its buffers as they were before the batch (the plan's versions)."""

    def at_plan(name: str, path: str, empty_like: DataFrame) -> DataFrame:
        version = plan.state_versions.get(name)
        snapshot = None if version is None else engine.read(path, version)
        return empty_like.limit(0) if snapshot is None else snapshot

    return [
        Side(
            relation=rel,
            arrivals=arrivals[rel],
            store=at_plan(f"{rel.name}_store", warehouse.store(rel), arrivals[rel]),
            probes=at_plan(f"{rel.name}_probes", warehouse.probes(rel), arrivals[partner(rel)]),
        )
        for rel in RELATIONS
    ]


def update_buffers(
    engine: DeltaEngine,
    warehouse: Warehouse,
    plan: BatchPlan,
    arrivals: dict[Relation, pa.Table],
    marks: tuple[Watermarks, Watermarks],
    window: int | None,
    txn_for: Callable[[str], Txn],
) -> dict[str, int]:
    """``X_store ∪= ΔX`` and ``X_probes ∪= ΔY`` for every relation, each by one MERGE that also evicts what
    the watermarks after the batch leave behind (state/bounds.py). Returns the rows evicted per table.

    A table is left alone when it gains nothing and its eviction cutoff did not move.
    """
    before, after = marks
    tables = warehouse.buffers()
    evicted = {}
    for rel in RELATIONS:
        rules = {
            f"{rel.name}_store": (rel, lambda m, rel=rel: store_eviction(rel, m, window)),
            f"{rel.name}_probes": (partner(rel), lambda m, rel=rel: probe_eviction(rel, m)),
        }
        for name, (new, rule) in rules.items():
            eviction = rule(after)
            exists = name in plan.state_versions
            kept = _not_evictable(arrivals[new], eviction)
            with step(name):
                if len(kept) == 0 and not (exists and eviction is not None and eviction != rule(before)):
                    continue
                merged = engine.merge(tables[name], kept, BUFFER_KEY, eviction, txn_for(tables[name]))
            if merged is not None:
                evicted[name] = merged.evicted
            elif exists and eviction is not None:  # committed by the run this one resumes: count it again
                evicted[name] = engine.read(tables[name], plan.state_versions[name], eviction.sql()).count()
    return evicted


def _not_evictable(arrivals: pa.Table, eviction: Eviction | None) -> pa.Table:
    """Arrivals the eviction would remove at once are never stored (they can meet no future arrival)."""
    if eviction is None or len(arrivals) == 0:
        return arrivals
    return arrivals.filter(pc.greater_equal(arrivals[eviction.column], eviction.below))
