"""Gold against the batch SQL join of bronze: the contract of docs/design.md section 2.

Gold, ignoring bookkeeping columns (batch id, produced_at), must equal ``SELECT … FROM R JOIN S ON
predicate`` over bronze minus late arrivals as a multiset, each pair owned by the relation of its older member. Both
are taken as of the last committed batch, so a run under way beside the audit shows nothing missing or extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from expectations.batch import row_key
from state.config import Config, OnAxis
from state.engines import DeltaEngine, Eviction
from state.engines.table import Tables
from state.event_time import bronze_kind
from state.frames import union_by_name
from state.join import asof
from state.join.final import JOIN_KINDS, JoinKind, row_of
from state.join.joiner import Projection, data_columns, identity_column, joined, owner_label
from state.join.relations import DELETE, ID, OP, SEQ, Relation, RelationSpec
from state.layout import Warehouse
from state.log.batch_log import BatchLog, LogTail
from state.log.pointers import records
from state.names import column

BOOKKEEPING = ("batch_id", "produced_at")


@dataclass(frozen=True)
class Reconciliation:
    expected: int  # pairs in the batch join
    actual: int  # rows in gold
    missing: DataFrame  # in the batch join, not in gold (as many times)
    extra: DataFrame  # in gold, not in the batch join (as many times)
    missing_count: int
    extra_count: int

    @property
    def passed(self) -> bool:
        return self.missing_count == 0 and self.extra_count == 0

    def describe(self, examples: int = 5) -> str:
        if self.passed:
            return f"PASS: gold equals the batch SQL join of bronze ({self.expected} pairs, each once, owners right)"
        lines = [
            f"FAIL: the batch join has {self.expected} pairs and gold {self.actual} rows: "
            f"{self.missing_count} missing from gold, {self.extra_count} extra in gold"
        ]
        for label, frame in (("missing", self.missing), ("extra", self.extra)):
            lines += [f"  {label}: {row.asDict()}" for row in frame.limit(examples).collect()]
        return "\n".join(lines)


def joinable(
    engine: DeltaEngine, warehouse: Warehouse, specs: dict[str, RelationSpec] | None = None, up_to: int | None = None
) -> dict[Relation, DataFrame] | None:
    """Each relation's bronze minus its late arrivals and the rows rules quarantined (a change feed's: the current
    version of each record of what is left): what gold must be the join of (docs/design.md sections 4 and 11); None
    while some relation has nothing ingested. ``specs`` names the relations read from source tables (their bronze
    points at the rows) and the change feeds; ``up_to``, the last arrival to take (all, when None)."""
    late = engine.read(warehouse.late_arrivals)
    relations = {}
    for rel in warehouse.relations:
        bronze = records(engine, warehouse, specs, rel)
        if bronze is None:  # nothing ingested yet
            return None
        if up_to is not None:
            bronze = bronze.where(F.col("_arrival_seq") <= up_to)
        changes = specs is not None and specs[rel.name].changes is not None
        if late is not None:
            # a change feed's id names every change of its record: only the late change itself is set aside
            by = "_arrival_seq" if changes else ID
            bronze = bronze.join(late.where(F.col("relation") == rel.name).select(by), by, "left_anti")
        taken = _quarantined_keys(engine, warehouse, warehouse.bronze(rel))
        if taken is not None:
            bronze = bronze.join(taken, row_key([ID]) == taken["row_key"], "left_anti")
        relations[rel] = current_versions(bronze) if changes else bronze
    return relations


def current_versions(changes: DataFrame) -> DataFrame:
    """A change feed's records as they stand: per id its latest change (sequence, then arrival), unless a delete."""
    latest = Window.partitionBy(ID).orderBy(F.col(SEQ).desc(), F.col("_arrival_seq").desc())
    ranked = changes.withColumn("_rank", F.row_number().over(latest))
    return ranked.where((F.col("_rank") == 1) & (F.col(OP) != DELETE)).drop("_rank")


def check_gold(engine: DeltaEngine, warehouse: Warehouse, config: Config) -> Reconciliation | None:
    """Gold as of the last committed batch reconciled with what it must hold (``expected_gold``, under ``config`` on
    the warehouse's event-time axis); None while there is no gold. Rows of a batch not committed yet, and arrivals no
    committed batch has joined, are left out: a run under way is not a failure."""
    gold = engine.read(warehouse.gold)
    if gold is None:
        return None
    tail = BatchLog(engine, warehouse.batches, warehouse.app_id(config.pipeline, warehouse.batches)).tail()
    gold = gold.where(F.col("batch_id") <= tail.last_batch_id)
    axis = config.on_axis(bronze_kind(Tables.of(engine, warehouse).bronze, config.event_times))
    return reconcile(expected_gold(engine, warehouse, axis, gold, tail), gold)


def expected_gold(engine: DeltaEngine, warehouse: Warehouse, axis: OnAxis, gold: DataFrame, tail: LogTail) -> DataFrame:
    """What ``gold`` must hold: the batch join of the definition's kind of what is joinable up to the last arrival the
    batch log's ``tail`` joined (in gold's columns: ``select``, else every column of each record), minus the rows rules
    quarantined; nothing while a relation has no records (no tuple, and no watermark to make a record final). An
    unmatched record gives a row only once final under the watermarks of the last committed batch."""
    relations = joinable(engine, warehouse, axis.config.relations, tail.last_seq)
    if relations is None:
        return gold.drop(*BOOKKEEPING).limit(0)
    select = None if axis.config.select is None else tuple(axis.config.select)
    projection = Projection({rel.name: data_columns(frame.columns) for rel, frame in relations.items()}, select)
    spec = axis.join_spec
    expected = batch_join(
        relations, axis.join_condition, projection, spec.kind, spec.cutoffs(warehouse.relations, tail.watermarks)
    )
    taken = _quarantined_keys(engine, warehouse, warehouse.gold)
    if taken is None:
        return expected
    members = [identity_column(rel, ID) for rel in spec.kind.gold_relations(warehouse.relations)]
    return expected.join(taken, row_key(members) == taken["row_key"], "left_anti")


def _quarantined_keys(engine: DeltaEngine, warehouse: Warehouse, path: str) -> DataFrame | None:
    quarantined = engine.read(warehouse.dq_quarantine)
    if quarantined is None:
        return None
    return quarantined.where(F.col("table") == warehouse.name_of(path)).select("row_key").distinct()


def batch_join(
    relations: dict[Relation, DataFrame],
    predicate: str,
    projection: Projection,
    kind: JoinKind = JOIN_KINDS["inner"],
    final: dict[Relation, Eviction | None] | None = None,
) -> DataFrame:
    """The one-shot join of ``kind`` of every relation's full contents, in gold's columns: each tuple with its owner
    (``INNER JOIN``, and the outer joins' matched rows), each preserved record no tuple has with nulls for the other
    relation (``LEFT``/``RIGHT``/``FULL OUTER``, ``LEFT ANTI``), each left record some tuple has (``LEFT SEMI``),
    each left record with its best match (as-of). With ``final``, a waiting relation's records only below its
    cutoff there (None: none yet)."""
    order = list(relations)
    left = order[0]

    def final_only(records: DataFrame, rel: Relation) -> DataFrame:
        if final is None:
            return records
        cutoff = final.get(rel)
        return records.limit(0) if cutoff is None else records.where(F.col(cutoff.column) < cutoff.below)

    if kind.as_of:
        return asof.rows(
            final_only(relations[left], left),
            relations[order[1]],
            order,
            predicate,
            projection,
            keep_unmatched=bool(kind.preserved),
        )
    tuples = joined(relations, predicate)
    columns = {rel: relations[rel] for rel in kind.gold_relations(order)}
    parts = (
        [tuples.selectExpr(*projection.of(owner_label(order), order))]
        if kind.emits_tuples
        else [row_of(relations[left].limit(0), left, columns, projection)]
    )

    def matched(rel: Relation) -> DataFrame:
        return tuples.select(F.col(f"{rel.name}.{ID}").alias(ID))

    parts += [
        row_of(final_only(relations[rel].join(matched(rel), ID, "left_anti"), rel), rel, columns, projection)
        for rel in kind.preserves(order)
    ]
    if kind.first_match:
        parts.append(row_of(relations[left].join(matched(left), ID, "left_semi"), left, columns, projection))
    return union_by_name(parts)


def reconcile(expected: DataFrame, gold: DataFrame) -> Reconciliation:
    """Compare as multisets: a pair produced twice, or not at all, or by the wrong owner, shows. Columns are
    matched by name; one gold has not gained yet (no batch since bronze gained it) compares as null."""
    actual = gold.drop(*BOOKKEEPING)
    types = dict(expected.dtypes)
    actual = actual.select(
        *[
            column(name) if name in actual.columns else F.lit(None).cast(types[name]).alias(name)
            for name in expected.columns
        ],
        *[column(name) for name in actual.columns if name not in types],
    )
    expected, actual = comparable(expected), comparable(actual)
    missing, extra = expected.exceptAll(actual), actual.exceptAll(expected)
    return Reconciliation(expected.count(), actual.count(), missing, extra, missing.count(), extra.count())


def comparable(frame: DataFrame) -> DataFrame:
    """``frame`` with each map (at any depth) as the sorted array of its entries: Spark compares no maps in set
    operations, and two maps of the same entries are equal whatever order they were built in."""
    if not any(_holds_map(field.dataType) for field in frame.schema.fields):
        return frame
    return frame.select(
        *[_map_free(column(field.name), field.dataType).alias(field.name) for field in frame.schema.fields]
    )


def _holds_map(kind: DataType) -> bool:
    if isinstance(kind, MapType):
        return True
    if isinstance(kind, ArrayType):
        return _holds_map(kind.elementType)
    return isinstance(kind, StructType) and any(_holds_map(field.dataType) for field in kind.fields)


def _map_free(value: Column, kind: DataType) -> Column:
    if not _holds_map(kind):
        return value
    if isinstance(kind, MapType):
        entries = F.map_entries(F.transform_values(value, lambda _, inner: _map_free(inner, kind.valueType)))
        return F.array_sort(entries)
    if isinstance(kind, ArrayType):
        return F.transform(value, lambda inner: _map_free(inner, kind.elementType))
    members = kind.fields  # type: ignore[attr-defined]
    fields = [_map_free(value.getField(field.name), field.dataType).alias(field.name) for field in members]
    return F.when(value.isNull(), F.lit(None)).otherwise(F.struct(*fields))
