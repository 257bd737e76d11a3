"""What a batch's steps take: the run they belong to, fixed once per run, and the batch itself, fixed by its plan.

The run builds a handle on every table a batch reads or writes once (``Tables``); a step takes the handles it uses, and
a batch hands out the writer of its commit to each (``Batch.writer``), which carries its plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipelines.gold import GOLD
from state.config import Config, OnAxis
from state.engines import DeltaEngine
from state.engines.table import Table, Tables, Writer
from state.event_time import bronze_kind
from state.join.buffers import StateTable, state_tables
from state.join.relations import Relation
from state.layout import Warehouse
from state.log.batch_log import BatchLog, BatchPlan
from state.log.lock import Takings


@dataclass(frozen=True)
class Run:
    """What every batch of a run works on: the engine, the warehouse, its tables, the config in force, each relation's
    state table (its buffers) and landing folder."""

    engine: DeltaEngine
    warehouse: Warehouse
    config: Config
    tables: Tables
    state_tables: dict[Relation, StateTable]
    landings: dict[Relation, str]
    takings: Takings  # the warehouse locks' takings its pipeline made and saw (state/log/lock.py)

    @classmethod
    def of(cls, engine: DeltaEngine, warehouse: Warehouse, config: Config, takings: Takings | None = None) -> Run:
        warehouse = replace(warehouse, pipeline=config.pipeline)  # its commits carry the pipeline in force
        states = {table.relation: table for table in state_tables(warehouse, probes=not config.join_kind.as_of)}
        landings = {rel: config.landings[rel.name] for rel in warehouse.relations if rel.name in config.landings}
        return cls(engine, warehouse, config, Tables.of(engine, warehouse), states, landings, takings or Takings())

    @property
    def relations(self) -> tuple[Relation, ...]:
        return tuple(self.warehouse.relations)

    @property
    def log(self) -> BatchLog:
        return BatchLog(self.engine, self.tables.batches.path, self.tables.batches.app_id)

    def state_versions(self) -> dict[str, int]:
        """The versions a plan pins of what a batch reads besides bronze: each state table, and gold when change feeds
        retract from it."""
        versions = {
            table.name: version
            for rel, table in self.state_tables.items()
            if (version := self.tables.state[rel].version()) is not None
        }
        if self.config.reads_changes and (gold := self.tables.gold.version()) is not None:
            versions[GOLD] = gold
        return versions

    def batch(self, plan: BatchPlan) -> Batch:
        return Batch(self, plan, self.config.on_axis(None))


@dataclass(frozen=True)
class Batch:
    """One batch: its run, its plan, and the run's definition on the event-time axis its joins are computed on (the
    warehouse's once bronze holds event times: ``on_axis``; bronze's rules take nothing on the axis)."""

    run: Run
    plan: BatchPlan
    axis: OnAxis

    @property
    def config(self) -> Config:
        return self.run.config

    @property
    def engine(self) -> DeltaEngine:
        return self.run.engine

    @property
    def tables(self) -> Tables:
        return self.run.tables

    @property
    def relations(self) -> tuple[Relation, ...]:
        return self.run.relations

    @property
    def state_tables(self) -> dict[Relation, StateTable]:
        return self.run.state_tables

    def writer(self, table: Table) -> Writer:
        """The writer of this batch's commit to ``table``, carrying its plan."""
        return table.writer(table.commit(self.plan.batch_id, self.plan.encoded()))

    def on_axis(self) -> Batch:
        """This batch on the warehouse's event-time axis, as bronze holds it once its files landed."""
        kind = bronze_kind(self.tables.bronze, self.config.event_times)
        return replace(self, axis=self.config.on_axis(kind))
