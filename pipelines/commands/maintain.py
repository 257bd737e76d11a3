"""``lakejoin maintain``: compact every table, delete the data files old versions no longer need, and write each
table's checkpoint.

Bronze is rewritten sorted on ``_arrival_seq`` so each file keeps a narrow range and a batch still reads
only the files of its slice; the other tables are compacted. VACUUM keeps at least a week of history:
a batch resumed after a crash reads the versions its plan pinned, and readers may time travel. Batches seldom write
checkpoints (``NEW_TABLE_LOG``), so the checkpoint written here keeps the log a reader replays short.
"""

from __future__ import annotations

from state.engines import DeltaEngine
from state.errors import LakejoinError
from state.layout import Warehouse

SAFE_RETENTION_HOURS = 168


def maintain(engine: DeltaEngine, warehouse: Warehouse, retention_hours: int = SAFE_RETENTION_HOURS) -> list[str]:
    """OPTIMIZE, VACUUM, then a checkpoint of each existing table; returns the names of the tables maintained."""
    if retention_hours < SAFE_RETENTION_HOURS:
        raise LakejoinError(
            f"a VACUUM retention of {retention_hours} hours could delete files a resumed batch or a time-travel "
            f"read still needs: use at least {SAFE_RETENTION_HOURS}"
        )
    bronze = {warehouse.bronze(rel) for rel in warehouse.relations}
    maintained = []
    for table in warehouse.tables():
        if engine.version(table) is None:
            continue
        engine.optimize(table, "_arrival_seq" if table in bronze else None)
        engine.vacuum(table, retention_hours)
        engine.checkpoint(table)
        maintained.append(warehouse.name_of(table))
    return maintained
