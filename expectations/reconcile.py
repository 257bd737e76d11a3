"""Gold against the batch SQL join of bronze: the contract of docs/design.md section 2.

Gold, ignoring bookkeeping columns (batch id, produced_at), must equal ``SELECT … FROM R JOIN S ON
predicate`` over bronze minus late arrivals as a multiset, each pair owned by the relation of its older member.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from expectations.batch import row_key
from pipelines.sources import records
from state.engines import DeltaEngine
from state.joiner import Projection, data_columns, identity_column, joined, owner_label
from state.layout import Warehouse
from state.names import column
from state.relations import ID, Relation, RelationSpec

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


def joinable(engine: DeltaEngine, warehouse: Warehouse, specs: dict[str, RelationSpec] | None = None) -> dict[Relation, DataFrame]:
    """Each relation's bronze minus its late arrivals and the rows rules quarantined: what gold must be the
    join of (docs/design.md section 4). ``specs`` names the relations read from source tables (their bronze points
    at the rows)."""
    late = engine.read(warehouse.late_arrivals)
    relations = {}
    for rel in warehouse.relations:
        bronze = records(engine, warehouse, specs, rel)
        if late is not None:
            bronze = bronze.join(late.where(F.col("relation") == rel.name).select(ID), ID, "left_anti")
        taken = _quarantined_keys(engine, warehouse, warehouse.bronze(rel))
        if taken is not None:
            bronze = bronze.join(taken, row_key([ID]) == taken["row_key"], "left_anti")
        relations[rel] = bronze
    return relations


def expected_gold(
    engine: DeltaEngine, warehouse: Warehouse, condition: str, select: list[str] | None = None, specs: dict[str, RelationSpec] | None = None
) -> DataFrame:
    """What gold must hold: the batch join of what is joinable (in gold's columns: ``select``, else every
    column of each record), minus the pairs rules quarantined."""
    relations = joinable(engine, warehouse, specs)
    projection = Projection({rel.name: data_columns(frame.columns) for rel, frame in relations.items()}, None if select is None else tuple(select))
    expected = batch_join(relations, condition, projection)
    taken = _quarantined_keys(engine, warehouse, warehouse.gold)
    if taken is None:
        return expected
    return expected.join(taken, row_key([identity_column(rel, ID) for rel in warehouse.relations]) == taken["row_key"], "left_anti")


def _quarantined_keys(engine: DeltaEngine, warehouse: Warehouse, path: str) -> DataFrame | None:
    quarantined = engine.read(warehouse.dq_quarantine)
    if quarantined is None:
        return None
    return quarantined.where(F.col("table") == warehouse.name_of(path)).select("row_key").distinct()


def batch_join(relations: dict[Relation, DataFrame], predicate: str, projection: Projection) -> DataFrame:
    """The one-shot join of every relation's full contents, in gold's columns, each tuple with its owner."""
    return joined(relations, predicate).select(projection.of(owner_label(list(relations)), list(relations)))


def reconcile(expected: DataFrame, gold: DataFrame) -> Reconciliation:
    """Compare as multisets: a pair produced twice, or not at all, or by the wrong owner, shows. Columns are
    matched by name; one gold has not gained yet (no batch since bronze gained it) compares as null."""
    actual = gold.drop(*BOOKKEEPING)
    types = dict(expected.dtypes)
    actual = actual.select(*[column(name) if name in actual.columns else F.lit(None).cast(types[name]).alias(name) for name in expected.columns],
                           *[column(name) for name in actual.columns if name not in types])
    missing, extra = expected.exceptAll(actual), actual.exceptAll(expected)
    return Reconciliation(expected.count(), actual.count(), missing, extra, missing.count(), extra.count())
