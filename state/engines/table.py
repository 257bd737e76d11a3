"""A handle on one Delta table, and a writer of one commit to it.

A step is given the tables it reads and writes, not the warehouse: a ``Table`` is one table with the engine that reads
it and the application id the pipeline's commits to it carry; a ``Writer`` appends to it or MERGEs into it under one
``Commit`` (a batch's transaction and plan), so a write names no engine, path or transaction of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame

from state.engines.base import Aligned, Commit, Data, DeltaEngine, Memberships, Merged, OnMatch
from state.layout import Warehouse


@dataclass(frozen=True)
class Table:
    engine: DeltaEngine
    path: str
    name: str  # its name in the warehouse (``silver/r_state``): what the batch log and the rules' results call it
    app_id: str  # the Delta application id of the pipeline's commits to this table

    def version(self) -> int | None:
        return self.engine.version(self.path)

    def read(self, version: int | None = None, where: str | None = None) -> DataFrame | None:
        return self.engine.read(self.path, version, where)

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
    return Table(engine, path, warehouse.name_of(path), warehouse.app_id(warehouse.pipeline, path))
