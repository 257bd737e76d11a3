"""The store and probe buffers of every relation, kept as Delta state tables MERGEd each batch.

``<x>_store`` holds X's own records; ``<x>_probes`` holds the records of the other relation that
probed X's store. A batch reads each at the version its plan pins and inserts the batch's arrivals
by MERGE on ``id``, so a replayed insert changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from pyspark.sql import DataFrame

from state.batch_log import BatchPlan
from state.engines import DeltaEngine, Txn
from state.faults import step
from state.joiner import Side
from state.layout import Warehouse
from state.relations import RELATIONS, Relation, others

BUFFER_KEY = "id"


def partner(rel: Relation) -> Relation:
    """The relation whose records probe ``rel``'s store (two-way joins have exactly one)."""
    (other,) = others(rel)
    return other


def buffer_tables(warehouse: Warehouse) -> dict[str, str]:
    """Every state table, by the name the batch log records its version under."""
    tables = {}
    for rel in RELATIONS:
        tables[f"{rel.name}_store"] = warehouse.store(rel)
        tables[f"{rel.name}_probes"] = warehouse.probes(rel)
    return tables


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


def insert_arrivals(
    engine: DeltaEngine, warehouse: Warehouse, arrivals: dict[Relation, pa.Table], txn_for: Callable[[str], Txn]
) -> None:
    """``X_store ∪= ΔX`` and ``X_probes ∪= ΔY`` for every relation (empty arrivals commit nothing)."""
    tables = buffer_tables(warehouse)
    for rel in RELATIONS:
        for name, new in ((f"{rel.name}_store", rel), (f"{rel.name}_probes", partner(rel))):
            with step(name):
                if len(arrivals[new]):
                    engine.insert_new(tables[name], arrivals[new], BUFFER_KEY, txn_for(tables[name]))
