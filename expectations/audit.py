"""``lakejoin validate``: every suite over the whole tables on Spark, the reconciliation of gold against the
batch join of bronze, and Great Expectations Data Docs (HTML) of the results.

Per batch, rules see only the batch's new rows; the audit sees everything, so it also catches what a
batch cannot (a duplicate across batches, a gold row changed after it was written).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import great_expectations as gx
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from expectations.batch import bound_rules
from expectations.frames import with_pair_checks, with_state_checks
from expectations.reconcile import Reconciliation, check_gold
from expectations.runner import RuleResult, Validator
from state.config import Config, OnAxis
from state.engines import DeltaEngine, Memberships
from state.engines.table import Tables
from state.event_time import bronze_kind
from state.join.joiner import Projection, data_columns, identity_column
from state.join.relations import ID, Relation
from state.layout import Warehouse
from state.log.batch_log import BatchLog
from state.log.checks import require_warehouse
from state.log.pointers import records


@dataclass(frozen=True)
class Audit:
    results: list[RuleResult]
    reconciliation: Reconciliation | None  # None before the first batch
    docs: str  # the Data Docs index page

    @property
    def success(self) -> bool:
        """Fail-policy rules hold on every table and gold reconciles; warn/quarantine findings are reported only."""
        return not self.failures

    @property
    def failures(self) -> list[RuleResult | Reconciliation]:
        """What makes the audit fail: each fail-policy rule broken somewhere, and the reconciliation when gold does
        not match the batch join of bronze."""
        broken: list[RuleResult | Reconciliation] = [
            result for result in self.results if result.policy == "fail" and not result.passed
        ]
        return broken + (
            [self.reconciliation] if self.reconciliation is not None and not self.reconciliation.passed else []
        )

    def describe(self) -> str:
        lines = []
        for result in self.results:
            verdict = "PASS" if result.passed else ("FAIL" if result.policy == "fail" else "WARN")
            lines.append(
                f"{verdict}  {result.rule.name:<24} {result.table:<22} {result.failed:>8,} of {result.evaluated:>10,} "
                f"rows failed ({result.policy})"
            )
            if not result.passed:
                lines.append(f"      {result.describe()}")
        if self.reconciliation is not None:
            lines.append(f"reconciliation: {self.reconciliation.describe()}")
        lines.append(f"data docs: {self.docs}")
        return "\n".join(lines)


def audit(engine: DeltaEngine, warehouse: Warehouse, config: Config, docs_root: str) -> Audit:
    """Validate every table of ``warehouse`` and reconcile gold; Data Docs go under ``docs_root``."""
    require_warehouse(engine, warehouse)
    axis = config.on_axis(bronze_kind(Tables.of(engine, warehouse).bronze, config.event_times))
    context = gx.get_context(mode="file", project_root_dir=docs_root)
    validator = Validator(engine.spark, context)
    results: list[RuleResult] = []
    for table, target, frame, keys, relation in _frames(engine, warehouse, axis):
        rules = bound_rules(axis, target, relation)
        results += validator.check(warehouse.name_of(table), frame, keys, rules, complete=False, persist=True)
    context.build_data_docs()
    docs = _index_page(context)
    return Audit(results, check_gold(engine, warehouse, config), docs)


def _frames(
    engine: DeltaEngine, warehouse: Warehouse, axis: OnAxis
) -> list[tuple[str, str, DataFrame, list[str], str | None]]:
    """(table, rule target, rows with the derived columns, key columns, relation) for every table that exists."""
    spark, config = engine.spark, axis.config
    frames = []
    bronze = {rel: records(engine, warehouse, config.relations, rel) for rel in warehouse.relations}
    frames += [
        (warehouse.bronze(rel), "bronze", rows, [ID], rel.name) for rel, rows in bronze.items() if rows is not None
    ]
    late = engine.read(warehouse.late_arrivals)
    watermarks = (
        BatchLog(engine, warehouse.batches, warehouse.app_id(config.pipeline, warehouse.batches)).tail().watermarks
    )
    no_late = spark.createDataFrame([], f"{ID} string")
    spec = axis.join_spec
    rule = spec.eviction_rule(warehouse.relations)
    for table in spec.state_tables(warehouse):
        rows = engine.read(table.path)
        if rows is None:
            continue
        late_ids = (
            no_late if late is None else late.where(F.col("relation") == table.relation.name).select(ID).distinct()
        )
        eviction = Memberships({buffer.column: rule(buffer, watermarks) for buffer in table.buffers})
        found = rows.join(late_ids.withColumn("_late", F.lit(True)), ID, "left")
        frames.append(
            (
                table.path,
                table.kind,
                with_state_checks(found, "_late", eviction).drop("_late"),
                [ID],
                table.relation.name,
            )
        )
    gold = engine.read(warehouse.gold)
    if gold is not None and all(rows is not None for rows in bronze.values()):
        projection = Projection(
            {rel.name: _carried(gold, rel, rows) for rel, rows in bronze.items()},
            None if config.select is None else tuple(config.select),
        )
        members, preserved = (
            config.join_kind.gold_relations(warehouse.relations),
            config.join_kind.preserves(warehouse.relations),
        )
        checked = with_pair_checks(
            gold,
            axis.join_condition,
            projection,
            members,
            lambda: bronze,
            preserved,
            config.join_kind.owned_by(warehouse.relations),
        )
        frames.append((warehouse.gold, "gold", checked, [identity_column(rel, ID) for rel in members], None))
    return frames


def _carried(gold: DataFrame, rel: Relation, bronze: DataFrame) -> tuple[str, ...]:
    """The columns of ``rel``'s records that gold carries (bronze may have gained some since the last batch)."""
    return tuple(name for name in data_columns(bronze.columns) if f"{rel.name}_{name}" in gold.columns)


def _index_page(context: gx.data_context.AbstractDataContext) -> str:
    url = context.get_docs_sites_urls()[0]["site_url"]
    return url.removeprefix("file://") if url.startswith("file://") else os.fspath(url)
