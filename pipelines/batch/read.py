"""Reading a batch: its arrivals read back from bronze (those ``ingest`` landed before it and those it landed), the
state tables at the versions its plan pinned, a change feed's rows resolved against the versions the state holds,
and every relation's rows flagged by its bronze rules. All of it lazy: the batch's jobs are its measure and its writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from expectations.batch import TableChecks
from pipelines.batch.context import Batch
from pipelines.bronze.classify import held_digests
from pipelines.gold import GOLD
from state.engines import as_frame
from state.join.buffers import held_versions
from state.join.changes import DELETED, Resolved, resolve
from state.join.relations import DELETE, ID, OP, SEQ, TS, Relation
from state.log.pointers import arrivals_with_source_columns
from state.names import literal

CURRENT = "_current"  # a change's record had a version held before the batch (not a tombstone)
LOCAL_ROWS = 10_000  # a batch of at most this many arrivals holds them on the driver (``_arrived``)


@dataclass(frozen=True)
class Arrived:
    """One relation's part of a batch, before its lateness is known."""

    relation: Relation
    rows: DataFrame  # the slice's rows, with the records' columns (read in place for a source table)
    checks: TableChecks  # the bronze rules
    checked: DataFrame  # what the rules check: the rows, or a change feed's candidates (with ``_current``)
    flagged: DataFrame  # ``checked`` with the rules' flags
    state: DataFrame | None  # the relation's state table at the plan's version (None before its first write)
    resolved: Resolved | None = None  # a change feed's rows against the versions held
    pointers: DataFrame | None = None  # a source table's bronze rows, each naming one row of the table
    ever: bool = True  # something of the relation ever arrived (its bronze table exists)

    @property
    def upsert(self) -> str:
        """A flagged row that is a version of its record (not a change feed's delete), in Spark SQL."""
        return f"{OP} != {literal(DELETE)}" if self.resolved is not None else "true"


def tables_at_plan(batch: Batch) -> dict[Relation, DataFrame | None]:
    """Each relation's state table as the plan pinned it (None before its first write), read once for the batch."""
    pinned = {rel: batch.plan.state_versions.get(table.name) for rel, table in batch.state_tables.items()}
    return {rel: None if version is None else batch.tables.state[rel].read(version) for rel, version in pinned.items()}


def gold_at_plan(batch: Batch) -> DataFrame | None:
    """Gold as the plan pinned it (with change feeds, which retract from it); else None."""
    version = batch.plan.state_versions.get(GOLD)
    return None if version is None else batch.tables.gold.read(version)


def known_records(batch: Batch, rel: Relation, state: DataFrame | None) -> DataFrame | None:
    """The records a batch's landed files of ``rel`` are checked against (``held_digests``): those its state
    holds, and those ingested before the batch that it joins."""
    plan = batch.plan
    ingested = (
        batch.tables.bronze[rel].read(where=plan.ingested)
        if rel.name in plan.bronze_versions and plan.ingested_to != plan.seq_from
        else None
    )
    return held_digests(state, ingested)


def bronze_checks(batch: Batch, rel: Relation) -> TableChecks:
    """The rules of ``rel``'s arrivals (its bronze rows) in a batch."""
    return TableChecks.of(batch.axis, "bronze", batch.tables.bronze[rel].name, [ID], rel.name)


def read(batch: Batch, states: dict[Relation, DataFrame | None]) -> dict[Relation, Arrived]:
    """Every relation's arrivals in the plan's slice, with what checks and resolves them."""
    return {rel: _arrived(batch, rel, states[rel]) for rel in batch.relations}


def _arrived(batch: Batch, rel: Relation, state: DataFrame | None) -> Arrived:
    engine, config, plan, table = batch.engine, batch.config, batch.plan, batch.tables.bronze[rel]
    spec = config.spec(rel.name)
    small = plan.bound <= LOCAL_ROWS
    # A small batch's rows are read to the driver once (by delta-rs, without a Spark job) and joined from there: a
    # frame of rows the driver holds is scanned and broadcast where it is, with no job of its own.
    held = engine.rows(table.path, where=plan.slice) if small else None
    bronze = as_frame(engine.spark, held) if held is not None else table.read(where=plan.slice)
    ever = bronze is not None
    if bronze is None:  # no arrival of the relation yet
        bronze = engine.spark.createDataFrame(
            [],
            f"{ID} string, {TS} bigint, _arrival_seq bigint"
            + ("" if spec.changes is None else f", {OP} string, {SEQ} bigint"),
        )
    in_place = spec.table if spec.changes is None else None  # a change feed's bronze holds its rows whole
    rows = bronze if in_place is None else arrivals_with_source_columns(engine, in_place, bronze)
    if in_place is not None and small:
        rows = as_frame(engine.spark, rows.toArrow())
    checks = bronze_checks(batch, rel)
    if spec.changes is None:
        pointers = None if in_place is None else bronze
        return Arrived(rel, rows, checks, rows, checks.flagged(rows), state, pointers=pointers, ever=ever)
    held = held_versions(state, rows)
    nothing_held = rows.limit(0).select(
        ID, F.lit(None).cast("long").alias(SEQ), F.lit(None).cast("boolean").alias(DELETED)
    )
    resolved = resolve(
        rows,
        nothing_held if held is None else held,
        (lambda frame: as_frame(engine.spark, frame.toArrow())) if small else lambda frame: frame,
    )
    current = resolved.current.withColumn(CURRENT, F.lit(True))
    candidates = resolved.candidates.join(current, ID, "left").withColumn(
        CURRENT, F.coalesce(F.col(CURRENT), F.lit(False))
    )
    return Arrived(rel, rows, checks, candidates, checks.flagged(candidates), state, resolved, ever=ever)
