"""``lakejoin reset``: a full refresh. Silver and gold are dropped; the next run rebuilds them from bronze.

Bronze, the ingest log and the ingest quarantine stay: they are the source of truth. Gold goes first and the
batch log last, so a reset that dies half-way leaves tables the batch log disagrees with, which the next
``run`` refuses (state/checks.py) until ``reset`` is run again.
"""

from __future__ import annotations

from state.checks import require_warehouse
from state.engines.base import DeltaReader
from state.layout import Warehouse


def reset(engine: DeltaReader, warehouse: Warehouse) -> list[str]:
    """Drop every derived table; return the names of those that existed."""
    require_warehouse(engine, warehouse)
    dropped = []
    for path in warehouse.derived_tables():
        if engine.version(path) is not None:
            dropped.append(warehouse.name_of(path))
        engine.drop(path)
    return dropped
