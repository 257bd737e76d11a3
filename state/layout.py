"""Where every table of a warehouse lives (README "Tables" documents the columns)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from state.relations import Relation


@dataclass(frozen=True)
class Warehouse:
    root: str

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

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

    def store(self, rel: Relation) -> str:
        """The store buffer of ``rel``: its own records."""
        return self._path("silver", f"{rel.name}_store")

    def probes(self, rel: Relation) -> str:
        """The probe buffer of ``rel``'s store: records of the other relation that probed it."""
        return self._path("silver", f"{rel.name}_probes")

    @property
    def batches(self) -> str:
        """The batch log: the plan of every batch, then its commit."""
        return self._path("silver", "batches")

    @property
    def gold(self) -> str:
        """One row per joined pair."""
        return self._path("gold", "join_results")
