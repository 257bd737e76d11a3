"""Ingest whatever has landed in a folder: Auto Loader finds the new files on Databricks, a listing elsewhere.

Either way each file goes through ``ingest_file``, which skips a file whose content it has ingested
before, so a discovery replayed after a crash adds nothing twice.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from pyspark.sql import DataFrame

from pipelines.ingest import IngestResult, ingest_or_refuse
from pipelines.parse import FORMATS
from state.engines import DeltaEngine
from state.errors import LakejoinError
from state.layout import Warehouse
from state.relations import Relation, RelationSpec


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


def ingest_landing(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    landing: str,
    checkpoint: str | None,
    report: Callable[[IngestResult], None],
    specs: dict[str, RelationSpec] | None = None,
) -> None:
    """Ingest every file under ``landing`` not ingested yet, in name order within each discovery. A file refused
    as a whole is recorded in quarantine/ingest, reported, and not tried again; the next file goes on. The caller has
    checked the folder (``require_landing``) before recording anything."""

    def ingest(path: str) -> None:
        report(ingest_or_refuse(engine.spark, engine, warehouse, rel, path, specs, record_refusal=True))

    if on_databricks():
        _auto_loader(engine, landing, checkpoint or default_checkpoint(landing, warehouse, rel), ingest)
        return
    for path in listed(landing):
        ingest(path)


def require_landing(landing: str, relation: str) -> None:
    """Refuse a landing folder that is not there: a mistyped path would otherwise ingest nothing, run after run."""
    if not os.path.isdir(landing):
        raise LakejoinError(f"{relation}'s landing folder {landing} does not exist: create it, or correct the path (config relations.{relation}.landing, or --landing)")


def default_checkpoint(landing: str, warehouse: Warehouse, rel: Relation) -> str:
    """Auto Loader's checkpoint when none is given: in the landing folder, one per warehouse and relation, so that two
    warehouses fed from one folder (a bundle's dev and prod targets) each find every file."""
    return os.path.join(landing, "_lakejoin_checkpoint", re.sub(r"[^A-Za-z0-9_.-]+", "_", warehouse.root.strip("/")), rel.name)


def listed(landing: str) -> list[str]:
    """Files under ``landing`` with an extension ingest reads, in name order (hidden and ``_`` entries skipped)."""
    found = []
    for folder, subfolders, files in os.walk(landing):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith(("_", ".")))
        found += [os.path.join(folder, name) for name in files if not name.startswith(("_", ".")) and _readable(name)]
    return sorted(found)


def _readable(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in FORMATS


def _auto_loader(engine: DeltaEngine, landing: str, checkpoint: str, ingest: Callable[[str], None]) -> None:
    """Auto Loader (``cloudFiles``) lists only new files and records them in its checkpoint once the
    micro-batch that ingested them returns; only the paths are read (binaryFile without its content)."""

    def ingest_batch(files: DataFrame, _: int) -> None:
        for row in files.select("path").orderBy("path").collect():  # file names only: a few per trigger
            if _readable(row.path):
                ingest(row.path.removeprefix("dbfs:"))

    stream = engine.spark.readStream.format("cloudFiles").option("cloudFiles.format", "binaryFile").load(landing)
    query = stream.select("path").writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    query.foreachBatch(ingest_batch).start().awaitTermination()
