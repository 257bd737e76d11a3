"""Writing a batch's gold: its new rows appended, or, when change feeds changed records gold holds results of, one
MERGE that takes those results out and puts the batch's in (state/changes.py), so a reader never sees half a
change; with change feeds, ``gold/changes`` also lists each batch's ``+`` and ``-`` rows, append-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.clock import now
from state.batch_log import BatchPlan
from state.engines import Data, DeltaEngine, Txn, as_frame
from state.faults import step
from state.joiner import identity_column
from state.layout import Warehouse
from state.relations import ID, Relation

GOLD = "gold"  # the name a plan pins gold's version under (with change feeds: retractions read it)
CHANGE = "_change"  # gold/changes: "+" a row gold gains, "-" a row it loses
CHANGE_FEED = {"delta.enableChangeDataFeed": "true"}  # gold's Change Data Feed, for readers that follow it
RETRACTION = "source.batch_id IS NULL"  # a MERGE source row that only takes its gold row out


@dataclass(frozen=True)
class Retraction:
    """The rows a batch's changes take out of gold: gold's rows (at the version the plan pinned) that have a member
    whose id the batch changed. ``rows`` is None when none is retracted; ``tracked`` when the join reads change
    feeds at all (gold then keeps its Change Data Feed and ``gold/changes``)."""

    rows: Data | None
    keys: Sequence[str]  # gold's columns naming a row
    tracked: bool
    count: int = 0  # the rows retracted

    @classmethod
    def of(
        cls, engine: DeltaEngine, warehouse: Warehouse, plan: BatchPlan, ids: dict[Relation, pa.Array], keys: Sequence[str], on_driver: Callable[[DataFrame], Data]
    ) -> Retraction:
        version = plan.state_versions.get(GOLD)
        changed = {rel: values for rel, values in ids.items() if len(values)}
        if version is None or not changed:
            return cls(None, keys, bool(ids))
        gold = engine.read(warehouse.gold, version)
        parts = [
            gold.join(F.broadcast(as_frame(engine.spark, pa.table({identity_column(rel, ID): values}))), identity_column(rel, ID), "left_semi")
            for rel, values in changed.items()
        ]
        rows = on_driver(reduce(DataFrame.unionByName, parts).dropDuplicates(list(keys)))
        count = _count(rows)
        return cls(rows if count else None, keys, True, count)


def write_gold(engine: DeltaEngine, warehouse: Warehouse, plan: BatchPlan, rows: Data, retraction: Retraction, txn: Callable[[str], Txn]) -> int:
    """Write the batch's rows (and take out what it retracts) in one commit; the rows it added (counted again
    when the run this one resumes wrote them)."""
    with step("gold"):
        if retraction.rows is None:
            written = engine.append(warehouse.gold, rows, txn(warehouse.gold), CHANGE_FEED if retraction.tracked else None)
        else:
            source = _union(rows, _without_keys(engine, _stamped(retraction.rows, None), rows, retraction.keys))
            written = None if engine.apply_changes(warehouse.gold, source, retraction.keys, RETRACTION, txn(warehouse.gold)) is None else _count(rows)
    if retraction.tracked:
        with step("gold_changes"):
            signed = [_signed(rows, "+")] + ([] if retraction.rows is None else [_signed(_stamped(retraction.rows, plan.batch_id), "-")])
            engine.append(warehouse.gold_changes, reduce(_union, signed), txn(warehouse.gold_changes))
    if written is None:
        written = engine.read(warehouse.gold, where=f"batch_id = {plan.batch_id}").count()
    return written


def _count(rows: Data) -> int:
    return rows.num_rows if isinstance(rows, pa.Table) else rows.count()


def _stamped(rows: Data, batch_id: int | None) -> Data:
    """Retracted rows as a MERGE source (``batch_id`` null: take the row out) or as ``gold/changes`` rows of the batch."""
    if isinstance(rows, pa.Table):
        index = rows.column_names.index("batch_id")
        stamped = rows.set_column(index, "batch_id", pa.array([batch_id] * rows.num_rows, rows.schema.field("batch_id").type))
        if batch_id is None:
            return stamped
        index = stamped.column_names.index("produced_at")
        return stamped.set_column(index, "produced_at", pa.array([now()] * rows.num_rows, rows.schema.field("produced_at").type))
    stamped = rows.withColumn("batch_id", F.lit(batch_id).cast("long"))
    return stamped if batch_id is None else stamped.withColumn("produced_at", F.lit(now()))


def _signed(rows: Data, sign: str) -> Data:
    if isinstance(rows, pa.Table):
        return rows.append_column(CHANGE, pa.array([sign] * rows.num_rows, pa.string()))
    return rows.withColumn(CHANGE, F.lit(sign))


def _without_keys(engine: DeltaEngine, retracted: Data, added: Data, keys: Sequence[str]) -> Data:
    """The retracted rows the batch does not write again: a row it writes again replaces its old version instead."""
    if isinstance(retracted, pa.Table) and isinstance(added, pa.Table):
        return retracted.filter(pc.invert(pc.is_in(_key(retracted, keys), value_set=_key(added, keys))))
    return as_frame(engine.spark, retracted).join(as_frame(engine.spark, added).select(*keys), list(keys), "left_anti")


def _key(rows: pa.Table, keys: Sequence[str]) -> pa.Array:
    """A row's key columns as one string (ids are text, never holding the separator)."""
    return pc.binary_join_element_wise(*[pc.cast(rows[key], pa.string()) for key in keys], "\x1f")


def _union(first: Data, second: Data) -> Data:
    if isinstance(first, pa.Table) and isinstance(second, pa.Table):
        schema = pa.schema([field.with_nullable(True) for field in first.schema])  # a retraction's batch_id is null
        return pa.concat_tables([first.cast(schema), second.cast(schema) if second.schema.names == schema.names else second], promote_options="permissive")
    spark = first.sparkSession if isinstance(first, DataFrame) else second.sparkSession  # type: ignore[union-attr]
    return as_frame(spark, first).unionByName(as_frame(spark, second), allowMissingColumns=True)
