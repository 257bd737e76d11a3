"""Where every table of a warehouse lives (README "Tables" documents the columns).

A warehouse is a folder (local, DBFS, Volumes, cloud storage) holding one Delta table per sub-folder,
e.g. ``DIR/silver/r_store``, or a Unity Catalog schema ``catalog.schema`` holding one table per name,
e.g. ``main.lakejoin.silver_r_store``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from state.relations import RELATIONS, Relation, others

_CATALOG_SCHEMA = re.compile(r"^[A-Za-z_]\w*\.[A-Za-z_]\w*$")


def is_catalog_schema(root: str) -> bool:
    """``main.lakejoin`` names a Unity Catalog schema; a folder with a dot in its name is written ``./a.b``."""
    return bool(_CATALOG_SCHEMA.match(root))


@dataclass(frozen=True)
class Buffer:
    """One state table: the store of ``store`` holds ``holds``'s records (its own, or a probe buffer)."""

    name: str  # how the batch log records its version: r_store, r_probes, trades_probes_news
    store: Relation
    holds: Relation
    path: str

    @property
    def kind(self) -> str:
        """``store`` or ``probes``: which rules check its rows (expectations/suites)."""
        return "store" if self.holds == self.store else "probes"


@dataclass(frozen=True)
class Warehouse:
    root: str
    relations: tuple[Relation, ...] = RELATIONS  # the config's, in rank order

    @property
    def in_catalog(self) -> bool:
        return is_catalog_schema(self.root)

    def _path(self, *parts: str) -> str:
        if self.in_catalog:
            return f"{self.root}." + "_".join(part.strip("_") for part in parts)
        return os.path.join(self.root, *parts)

    def name_of(self, path: str) -> str:
        """A table's name within the warehouse, e.g. ``silver/r_store`` (``silver_r_store`` in a catalog)."""
        if self.in_catalog:
            return path.removeprefix(f"{self.root}.")
        return os.path.relpath(path, self.root)

    def app_id(self, pipeline: str, path: str) -> str:
        """The Delta application id under which ``pipeline`` commits to the table at ``path``."""
        return f"{pipeline}:{self.name_of(path)}"

    def bronze(self, rel: Relation) -> str:
        """Append-only arrivals of ``rel``, one row per accepted record."""
        return self._path("bronze", rel.name)

    @property
    def ingest_log(self) -> str:
        """One row per ingested file: what landed where, so a file ingested twice adds nothing."""
        return self._path("bronze", "_ingests")

    @property
    def quarantine(self) -> str:
        """Rows rejected at ingest, with the reason, the file and the line."""
        return self._path("quarantine", "ingest")

    @property
    def late_arrivals(self) -> str:
        """Records that arrived below their relation's watermark: kept with the reason, never joined."""
        return self._path("quarantine", "late_arrivals")

    def store(self, rel: Relation) -> str:
        """The store buffer of ``rel``: its own records."""
        return self._path("silver", f"{rel.name}_store")

    def probes(self, rel: Relation, of: Relation) -> str:
        """The probe buffer of ``rel``'s store holding ``of``'s records that probed it (``r_probes`` when two
        relations are joined: there is one other; ``trades_probes_news`` with more)."""
        return self._path("silver", self._probes_name(rel, of))

    def _probes_name(self, rel: Relation, of: Relation) -> str:
        return f"{rel.name}_probes" if len(self.relations) == 2 else f"{rel.name}_probes_{of.name}"

    @property
    def dq_quarantine(self) -> str:
        """Rows a data-quality rule with the quarantine policy took out of a batch, with the rule's name."""
        return self._path("quarantine", "expectations")

    @property
    def dq_results(self) -> str:
        """Per batch and rule: rows evaluated, rows failed, the policy, example keys."""
        return self._path("quality", "dq_results")

    @property
    def batches(self) -> str:
        """The batch log: the plan of every batch, then its commit."""
        return self._path("silver", "batches")

    @property
    def definition(self) -> str:
        """The pipeline's definition, one row per version: what the config said when it was recorded."""
        return self._path("silver", "definition")

    @property
    def gold(self) -> str:
        """One row per joined pair."""
        return self._path("gold", "join_results")

    def buffer_tables(self) -> list[Buffer]:
        """Every state table: per relation, its store, then a probe buffer per other relation (docs/design.md 2.8)."""
        tables = []
        for rel in self.relations:
            tables.append(Buffer(f"{rel.name}_store", rel, rel, self.store(rel)))
            tables += [Buffer(self._probes_name(rel, of), rel, of, self.probes(rel, of)) for of in others(rel, self.relations)]
        return tables

    def buffers(self) -> dict[str, str]:
        """Every state table by the name the batch log records its version under (``r_store``, …)."""
        return {table.name: table.path for table in self.buffer_tables()}

    def derived_tables(self) -> list[str]:
        """What the joiner builds from bronze (``lakejoin reset`` drops these): gold, then silver, the batch log last."""
        return [self.gold, self.late_arrivals, self.dq_quarantine, self.dq_results, *self.buffers().values(), self.batches]

    def tables(self) -> list[str]:
        """Every table, in the order data flows through them."""
        bronze = [self.bronze(rel) for rel in self.relations]
        return [*bronze, self.ingest_log, self.quarantine, *self.buffers().values(), self.late_arrivals, self.dq_quarantine, self.dq_results, self.batches, self.definition, self.gold]
