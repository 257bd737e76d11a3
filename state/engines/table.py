"""A handle on one Delta table, and a writer of one commit to it.

A step is given the tables it reads and writes, not the warehouse: a ``Table`` is one table with the engine that reads
it and the application id the pipeline's commits to it carry; a ``Writer`` appends to it or MERGEs into it under one
``Commit`` (a batch's transaction and plan), so a write names no engine, path or transaction of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from state.engines.base import Aligned, Commit, Data, DeltaEngine, Memberships, Merged, OnMatch, TableInfo
from state.join.relations import Relation
from state.layout import Warehouse, application_id


@dataclass(frozen=True)
class Table:
    engine: DeltaEngine
    path: str
    name: str  # its name in the warehouse (``silver/r_state``): what the batch log and the rules' results call it
    pipeline: str  # the pipeline whose commits to it carry its application id

    @property
    def app_id(self) -> str:
        return application_id(self.pipeline, self.name)

    def version(self) -> int | None:
        return self.engine.version(self.path)

    def read(self, version: int | None = None, where: str | None = None) -> DataFrame | None:
        return self.engine.read(self.path, version, where)

    def rows(self, where: str | None = None) -> pa.Table | None:
        return self.engine.rows(self.path, where=where)

    def schema(self) -> StructType | None:
        return self.engine.schema(self.path)

    def max_value(self, column: str) -> int | None:
        return self.engine.max_value(self.path, column)

    def info(self, after: int | None = None) -> TableInfo | None:
        """Its version, schema and the pipeline's last commit to it (after version ``after``), from one read of its
        log."""
        return self.engine.info(self.path, self.app_id, after)

    def commit(self, version: int, plan: str | None = None, part: str | None = None) -> Commit:
        """The commit of write ``version`` (a batch id) carrying ``plan``; ``part`` names one of several commits a
        batch makes to this table (a file it refused, each under an id of its own)."""
        return Commit(self.app_id if part is None else f"{self.app_id}:{part}", version, plan)

    def writer(self, commit: Commit | None) -> Writer:
        return Writer(self, commit)


@dataclass(frozen=True)
class Writer:
    """One commit to one table: skipped when the table already records it, which makes a replayed batch idempotent."""

    table: Table
    commit: Commit | None

    def append(self, rows: Data, *, properties: dict[str, str] | None = None) -> int | None:
        """The rows written (creating the table with ``properties``), or None when the commit is recorded."""
        return self.table.engine.append(self.table.path, rows, commit=self.commit, properties=properties)

    def merge(
        self,
        rows: Data,
        *,
        key: str,
        evict: Memberships | None = None,
        aligned: Aligned | None = None,
        on_match: OnMatch | None = None,
    ) -> Merged | None:
        """``DeltaEngine.merge`` of ``rows`` under this commit."""
        return self.table.engine.merge(
            self.table.path, rows, key=key, evict=evict, commit=self.commit, aligned=aligned, on_match=on_match
        )

    def apply_changes(self, rows: Data, *, keys: Sequence[str], retraction: str) -> int | None:
        """``DeltaEngine.apply_changes`` of ``rows`` under this commit."""
        return self.table.engine.apply_changes(
            self.table.path, rows, keys=keys, retraction=retraction, commit=self.commit
        )


def table_in(engine: DeltaEngine, warehouse: Warehouse, path: str) -> Table:
    """The handle on the warehouse's table at ``path``, committed to under the warehouse's pipeline."""
    return Table(engine, path, warehouse.name_of(path), warehouse.pipeline)


@dataclass(frozen=True)
class Tables:
    """Every table a run's batches read or write, each with its engine and the pipeline's application id."""

    bronze: dict[Relation, Table]
    state: dict[Relation, Table]
    quarantine: Table
    late_arrivals: Table
    dq_quarantine: Table
    gold: Table
    gold_changes: Table
    batches: Table
    ingest_log: Table
    progress: Table

    @classmethod
    def of(cls, engine: DeltaEngine, warehouse: Warehouse) -> Tables:
        def table(path: str) -> Table:
            return table_in(engine, warehouse, path)

        return cls(
            bronze={rel: table(warehouse.bronze(rel)) for rel in warehouse.relations},
            state={rel: table(warehouse.state(rel)) for rel in warehouse.relations},
            quarantine=table(warehouse.quarantine),
            late_arrivals=table(warehouse.late_arrivals),
            dq_quarantine=table(warehouse.dq_quarantine),
            gold=table(warehouse.gold),
            gold_changes=table(warehouse.gold_changes),
            batches=table(warehouse.batches),
            ingest_log=table(warehouse.ingest_log),
            progress=table(warehouse.progress),
        )
