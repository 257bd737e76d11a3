"""The columns rules check that no table stores: pure ``DataFrame -> DataFrame`` functions (``_dq_*``).

Gold keeps every column of each record (prefixed by its relation), so the join predicate is evaluated on the
records rebuilt from gold; with a configured ``select`` it is evaluated on the pair's records as bronze holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from state.engines import Memberships
from state.joiner import Projection, identity_column, owner_label
from state.names import column
from state.relations import ID, TS, Relation

DERIVED_PREFIX = "_dq_"


def with_pair_checks(
    gold: DataFrame,
    condition: str,
    projection: Projection,
    relations: Sequence[Relation],
    records: Callable[[], dict[Relation, DataFrame]],
    preserved: Sequence[Relation] = (),
    owned_by: Relation | None = None,
) -> DataFrame:
    """Gold rows with ``_dq_predicate`` (the join condition holds), ``_dq_owner`` (label of the oldest
    member), ``_dq_gap`` (the greatest distance in event time between two members) and ``_dq_complete`` (every
    member is there, or the row is one record of a ``preserved`` relation: an outer join's unmatched row, whose
    condition and owner are its own); with ``owned_by``, that relation owns every row. ``records`` (bronze) are read
    only when gold does not carry what the condition needs. A gold of one relation's records (semi and anti joins) has no condition to check."""
    if len(relations) == 1:
        alone = {"_dq_predicate": F.lit(True), "_dq_owner": F.lit(relations[0].label), "_dq_gap": F.lit(0).cast("bigint"), "_dq_complete": F.lit(True)}
        return gold.withColumns(alone)

    def member(rel: Relation) -> list:
        derived = [F.col(identity_column(rel, derived)).alias(derived) for derived in (ID, TS)]
        carried = [] if projection.select is not None else [column(f"{rel.name}_{name}").alias(name) for name in projection.columns.get(rel.name, ())]
        return [*derived, *carried]

    paired = gold.withColumns({rel.name: F.struct(*member(rel)) for rel in relations})
    if projection.select is not None or not _resolves(paired, condition):  # with a select, gold has no records
        paired, members = gold, records()
        for rel in relations:
            bronze = members[rel].select(F.col(ID).alias(f"_dq_{rel.name}_id"), F.struct("*").alias(rel.name))
            paired = paired.join(bronze, paired[identity_column(rel, ID)] == bronze[f"_dq_{rel.name}_id"], "left")
    stamps = [F.col(identity_column(rel, TS)) for rel in relations]
    present = {rel: F.col(identity_column(rel, ID)).isNotNull() for rel in relations}
    complete = reduce(Column.__and__, present.values())
    alone = [present[rel] & reduce(Column.__and__, [~present[other] for other in relations if other != rel]) for rel in relations]
    checked = paired.withColumns(
        {
            "_dq_predicate": F.when(complete, F.coalesce(F.expr(condition), F.lit(False))).otherwise(F.lit(True)),
            "_dq_owner": F.lit(owned_by.label) if owned_by is not None else F.coalesce(
                F.when(complete, owner_label(relations)), *[F.when(one, F.lit(rel.label)) for rel, one in zip(relations, alone)]
            ),
            "_dq_gap": F.greatest(*stamps) - F.least(*stamps),
            "_dq_complete": reduce(Column.__or__, [complete, *[one for rel, one in zip(relations, alone) if rel in preserved]]),
        }
    )
    return checked.select(*[column(name) for name in gold.columns], "_dq_predicate", "_dq_owner", "_dq_gap", "_dq_complete")


def _resolves(frame: DataFrame, condition: str) -> bool:
    try:
        frame.select(F.expr(condition)).schema
    except AnalysisException:
        return False
    return True


def with_state_checks(rows: DataFrame, late: DataFrame, eviction: Memberships) -> DataFrame:
    """State rows with ``_dq_late`` (the record is also in late arrivals) and ``_dq_watermark`` (the highest cutoff
    among the buffers the row is in, null when none of them has one)."""
    ids = late.select(ID).distinct().withColumn("_dq_late", F.lit(True))
    flagged = rows.join(F.broadcast(ids), ID, "left").withColumn("_dq_late", F.coalesce("_dq_late", F.lit(False)))
    cutoffs = [F.when(F.col(name), F.lit(cutoff.below)) for name, cutoff in eviction.cutoffs.items() if cutoff is not None and name in rows.columns]
    highest = F.lit(None) if not cutoffs else cutoffs[0] if len(cutoffs) == 1 else F.greatest(*cutoffs)
    return flagged.withColumn("_dq_watermark", highest.cast("bigint"))


def with_state_checks_local(rows: pa.Table, late: pa.Table, eviction: Memberships) -> pa.Table:
    """``with_state_checks`` for a batch's rows held on the driver as Arrow (no Spark job per table)."""
    flagged = rows.append_column("_dq_late", pc.is_in(rows[ID], value_set=late[ID]))
    none = pa.scalar(None, pa.int64())
    cutoffs = [
        pc.if_else(pc.fill_null(rows[name], False), pa.scalar(cutoff.below, pa.int64()), none)
        for name, cutoff in eviction.cutoffs.items()
        if cutoff is not None and name in rows.column_names
    ]
    highest = pa.nulls(rows.num_rows, pa.int64()) if not cutoffs else pc.max_element_wise(*cutoffs, skip_nulls=True)
    return flagged.append_column("_dq_watermark", highest)


def without_checks(frame: DataFrame) -> DataFrame:
    return frame.drop(*[column for column in frame.columns if column.startswith(DERIVED_PREFIX)])
