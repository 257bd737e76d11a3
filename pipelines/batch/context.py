"""What a batch's steps take: the run they belong to, fixed once per run, and the batch itself, fixed by its plan.

A step takes the ``Batch`` (or, before there is a plan, the ``Run``) and hands the state helpers only what they use:
a table's path, the state tables, a transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipelines.gold import GOLD
from state.config import Config, on_warehouse_axis
from state.engines import DeltaEngine, Txn
from state.join.buffers import StateTable
from state.join.relations import Relation
from state.layout import Warehouse
from state.log.batch_log import BatchLog, BatchPlan


@dataclass(frozen=True)
class Run:
    """What every batch of a run works on: the engine, the warehouse's tables, the config in force, each relation's
    state table and landing folder."""

    engine: DeltaEngine
    warehouse: Warehouse
    config: Config
    tables: dict[Relation, StateTable]
    landings: dict[Relation, str]

    @classmethod
    def of(cls, engine: DeltaEngine, warehouse: Warehouse, config: Config) -> Run:
        tables = {table.relation: table for table in config.join_spec.state_tables(warehouse)}
        landings = {rel: config.landings[rel.name] for rel in warehouse.relations if rel.name in config.landings}
        return cls(engine, warehouse, config, tables, landings)

    @property
    def relations(self) -> tuple[Relation, ...]:
        return tuple(self.warehouse.relations)

    @property
    def log(self) -> BatchLog:
        return BatchLog(self.engine, self.warehouse.batches, self.app_id(self.warehouse.batches))

    def app_id(self, path: str) -> str:
        """The application id of this pipeline's writes to the table at ``path``."""
        return self.warehouse.app_id(self.config.pipeline, path)

    def state_versions(self) -> dict[str, int]:
        """The versions a plan pins of what a batch reads besides bronze: each state table, and gold when change feeds
        retract from it."""
        versions = {
            table.name: version
            for table in self.tables.values()
            if (version := self.engine.version(table.path)) is not None
        }
        if self.config.reads_changes and (gold := self.engine.version(self.warehouse.gold)) is not None:
            versions[GOLD] = gold
        return versions

    def batch(self, plan: BatchPlan) -> Batch:
        return Batch(self, plan, self.config)


@dataclass(frozen=True)
class Batch:
    """One batch: its run, its plan, and the config its joins are computed under (on the event-time axis, once bronze
    holds event times)."""

    run: Run
    plan: BatchPlan
    config: Config

    @property
    def engine(self) -> DeltaEngine:
        return self.run.engine

    @property
    def warehouse(self) -> Warehouse:
        return self.run.warehouse

    @property
    def relations(self) -> tuple[Relation, ...]:
        return self.run.relations

    @property
    def tables(self) -> dict[Relation, StateTable]:
        return self.run.tables

    def txn(self, path: str) -> Txn:
        """The application transaction of this batch's write to the table at ``path``, carrying the plan."""
        return self.plan.txn(self.run.app_id(path))

    def on_axis(self) -> tuple[Batch, str | None]:
        """This batch with its config on the warehouse's event-time axis, and the axis's kind (None before anything
        landed)."""
        config, kind = on_warehouse_axis(self.config, self.engine, self.warehouse)
        return replace(self, config=config), kind
