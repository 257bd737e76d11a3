"""Where every table of a warehouse lives (docs/tables.md documents the columns).

A warehouse is a folder (local, DBFS, Volumes, cloud storage) holding one Delta table per sub-folder,
e.g. ``DIR/silver/r_state``, or a Unity Catalog schema ``catalog.schema`` holding one table per name,
e.g. ``main.lakejoin.silver_r_state``. A layer (bronze, silver, gold, quarantine) may live elsewhere, in a folder or
a schema of its own, its tables named without the layer: ``main.silver.r_state``. The definition stays at the
warehouse's root, where a command finds it before it knows where the layers are.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from state.errors import LakejoinError
from state.join.relations import ID, RELATIONS, TS, Relation, others

# The layers a config may place on their own (``layers``): the top folders of a warehouse's tables.
LAYERS = ("bronze", "silver", "gold", "quarantine")
GOLD_TABLE = "join_results"
_NAME = r"[A-Za-z_]\w*"
_CATALOG_SCHEMA = re.compile(rf"^{_NAME}\.{_NAME}$")


def is_name(text: str) -> bool:
    """A table or schema name that needs no quoting in a catalog or a folder."""
    return bool(re.fullmatch(_NAME, text))


def is_catalog_schema(root: str) -> bool:
    """``main.lakejoin`` names a Unity Catalog schema; a folder with a dot in its name is written ``./a.b``."""
    return bool(_CATALOG_SCHEMA.match(root))


def is_table_name(table: str) -> bool:
    """``catalog.schema.table`` (a Unity Catalog table), not a path."""
    return "/" not in table and is_catalog_schema(table.rpartition(".")[0])


@dataclass(frozen=True)
class Buffer:
    """One buffer of the store/probe model: the store of ``store`` holding ``holds``'s records (its own, or a probe
    buffer). Buffers are not tables: every buffer holding X's records is a membership column of X's state table."""

    store: Relation
    holds: Relation

    @property
    def kind(self) -> str:
        """``store`` or ``probes``."""
        return "store" if self.holds == self.store else "probes"

    @property
    def column(self) -> str:
        """The boolean column of ``holds``'s state table saying a record is in this buffer: ``_in_store`` for its own
        store, ``_in_<store>_probes`` for another relation's probe buffer."""
        return IN_STORE if self.kind == "store" else f"_in_{self.store.name}_probes"


IN_STORE = "_in_store"

# Where and when bronze got a row. No batch reads it from state, so state tables made since keep none of it.
PROVENANCE = ("_source_file", "_source_line", "_ingest_id", "_ingested_at")
# The columns lakejoin reads Delta's file statistics of: a batch's slice of bronze and the last place taken
# (``_arrival_seq``), a source table's last version pointed at (``_source_version``), the span a state MERGE looks in
# (``_ts``), and ids. Bronze and state tables keep statistics of these alone: Delta on Spark computes them row by
# row as it writes, and of every column they cost each write for columns nothing prunes by (docs/benchmarks.md).
BRONZE_STATISTICS = ("_arrival_seq", TS, ID, "_source_version")
STATE_STATISTICS = ("_arrival_seq", TS, ID)


# Delta writes a table's checkpoint in the commit that reaches a multiple of its ``delta.checkpointInterval``, and that
# commit waits for it (Delta on Spark's default interval is 10). Tables lakejoin creates take 100 (delta-rs's default),
# so a batch seldom pays one, and ``maintain`` writes each table's checkpoint, so readers replay few commits after it.
NEW_TABLE_LOG = {"delta.checkpointInterval": "100"}


def application_id(pipeline: str, name: str) -> str:
    """The Delta application id of ``pipeline``'s commits to the table the warehouse calls ``name``."""
    return f"{pipeline}:{name}"


def state_name(rel: Relation) -> str:
    """How the batch log records the version of ``rel``'s state table: ``r_state``."""
    return f"{rel.name}_state"


def statistics_of(columns: Sequence[str], kept: Sequence[str]) -> dict[str, str]:
    """A new table's property keeping file statistics of the columns of ``kept`` among its ``columns``."""
    return {"delta.dataSkippingStatsColumns": ",".join(name for name in kept if name in columns)}


@dataclass(frozen=True)
class Warehouse:
    root: str
    relations: tuple[Relation, ...] = RELATIONS  # the config's, in rank order
    pipeline: str = "lakejoin"  # the config's: names the Delta application transactions of its writes
    layers: tuple[tuple[str, str], ...] = ()  # the config's: (layer, folder or schema) for each layer placed elsewhere
    gold_table: str = GOLD_TABLE  # the config's: gold's name within its layer

    def __post_init__(self) -> None:
        paths = self.tables()
        if len(set(paths)) < len(paths):
            twice = next(path for path in paths if paths.count(path) > 1)
            raise LakejoinError(
                f"config: two tables would be at {twice}: give those layers places of their own, or gold another name"
            )

    @property
    def in_catalog(self) -> bool:
        return is_catalog_schema(self.root)

    @property
    def holds_catalog_tables(self) -> bool:
        """Some table is a catalog's (at the warehouse's schema or a layer's): only Delta on Spark reaches it."""
        return any(is_table_name(table) for table in self.tables())

    def _path(self, layer: str, name: str) -> str:
        own = dict(self.layers).get(layer)
        if own is None:
            return self._at_root(layer, name)
        return f"{own}.{name.strip('_')}" if is_catalog_schema(own) else os.path.join(own, name)

    def _at_root(self, *parts: str) -> str:
        """Where the table ``parts`` names lives when no layer is placed elsewhere."""
        if self.in_catalog:
            return f"{self.root}." + "_".join(part.strip("_") for part in parts)
        return os.path.join(self.root, *parts)

    @cached_property
    def _at_root_of(self) -> dict[str, str]:
        """Each table's path by where it would live with every layer at the root: its name in the warehouse."""
        return dict(zip(self._every_table(), replace(self, layers=())._every_table(), strict=True))

    def _every_table(self) -> list[str]:
        return [*self.tables(), *self.legacy_state(), self.legacy_rule_results]

    def path_of(self, name: str) -> str:
        """The path of the table a folder name names (``silver/r_state``, ``bronze/_ingests``), in a catalog too."""
        at_root = self._at_root(*name.split("/"))
        return next((path for path, there in self._at_root_of.items() if there == at_root), at_root)

    def name_of(self, path: str) -> str:
        """A table's name within the warehouse, e.g. ``silver/r_state`` (``silver_r_state`` in a catalog), wherever
        its layer lives: what the batch log, checks and application transactions call it."""
        at_root = self._at_root_of.get(path, path)
        if self.in_catalog:
            return at_root.removeprefix(f"{self.root}.")
        return os.path.relpath(at_root, self.root)

    def app_id(self, pipeline: str, path: str) -> str:
        """The Delta application id under which ``pipeline`` commits to the table at ``path``."""
        return application_id(pipeline, self.name_of(path))

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

    def state(self, rel: Relation) -> str:
        """The state table of ``rel``: each of its records kept by some buffer, once, with a membership column per
        buffer (its own store, each other relation's probe buffer)."""
        return self._path("silver", state_name(rel))

    def legacy_state(self) -> list[str]:
        """The state tables of lakejoin's earlier layout (a table per buffer: ``r_store``, ``r_probes``, …), which
        ``reset`` drops and a run refuses to read."""
        names = [f"{rel.name}_store" for rel in self.relations]
        for rel in self.relations:
            names += [
                f"{rel.name}_probes" if len(self.relations) == 2 else f"{rel.name}_probes_{of.name}"
                for of in others(rel, self.relations)
            ]
        return [self._path("silver", name) for name in names]

    @property
    def dq_quarantine(self) -> str:
        """Rows a data-quality rule with the quarantine policy took out of a batch, with the rule's name."""
        return self._path("quarantine", "expectations")

    @property
    def legacy_rule_results(self) -> str:
        """Per batch and rule, the rules' results, in lakejoin's earlier layout (the batch log holds them now), which
        ``reset`` drops and a run refuses to read."""
        return self._path("quality", "dq_results")

    @property
    def batches(self) -> str:
        """The batch log: a row per batch, its plan and what it did, written last."""
        return self._path("silver", "batches")

    @property
    def definition(self) -> str:
        """The pipeline's definition, one row per version: what the config said when it was recorded."""
        return self._at_root("silver", "definition")

    @property
    def gold(self) -> str:
        """One row per joined pair."""
        return self._path("gold", self.gold_table)

    @property
    def progress(self) -> str:
        """Progress declared by 'lakejoin advance' (state/log/progress.py): the user's word, which ``reset`` keeps."""
        return self._path("silver", "progress")

    @property
    def gold_changes(self) -> str:
        """With change feeds: each batch's rows gold gained (``+``) and lost (``-``), append-only."""
        return self._path("gold", "changes")

    def buffers(self) -> dict[str, str]:
        """Every state table by the name the batch log records its version under (``r_state``, …)."""
        return {state_name(rel): self.state(rel) for rel in self.relations}

    def derived_tables(self) -> list[str]:
        """What the joiner builds from bronze (``lakejoin reset`` drops these): gold, then silver, the batch log
        last."""
        return [
            self.gold,
            self.gold_changes,
            self.late_arrivals,
            self.dq_quarantine,
            self.legacy_rule_results,
            *self.buffers().values(),
            *self.legacy_state(),
            self.batches,
        ]

    def beside_runs(self) -> list[str]:
        """The tables other calls write while a run holds the warehouse's lock: bronze, its ingest log and quarantine
        (ingests, under the ingest lock), the definition and declared progress (``advance``). A run looks at them again
        when it takes the ingest lock and before each batch it plans."""
        return [
            *(self.bronze(rel) for rel in self.relations),
            self.ingest_log,
            self.quarantine,
            self.definition,
            self.progress,
        ]

    def tables(self) -> list[str]:
        """Every table, in the order data flows through them."""
        bronze = [self.bronze(rel) for rel in self.relations]
        return [
            *bronze,
            self.ingest_log,
            self.quarantine,
            *self.buffers().values(),
            self.late_arrivals,
            self.dq_quarantine,
            self.batches,
            self.definition,
            self.progress,
            self.gold,
            self.gold_changes,
        ]
