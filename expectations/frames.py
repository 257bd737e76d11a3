"""The columns rules check that no table stores: pure ``DataFrame -> DataFrame`` functions (``_dq_*``).

Gold keeps each record's id, ts, key and payload; a join predicate over other columns is evaluated on the
pair's records as bronze holds them.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.joiner import PAIR_FIELDS, older
from state.relations import RELATIONS, Relation

DERIVED_PREFIX = "_dq_"


def with_pair_checks(gold: DataFrame, condition: str, records: Callable[[], dict[Relation, DataFrame]]) -> DataFrame:
    """Gold rows with ``_dq_predicate`` (the join condition holds), ``_dq_owner`` (label of the older
    member) and ``_dq_gap`` (|r_ts - s_ts|). ``records`` (bronze) are read only if the condition needs them."""
    a, b = RELATIONS
    carried = gold.withColumns(
        {rel.name: F.struct(*[F.col(f"{rel.name}_{field}").alias(field) for field in PAIR_FIELDS]) for rel in RELATIONS}
    )
    try:
        carried.select(F.expr(condition)).schema
        paired = carried
    except AnalysisException:
        paired, members = gold, records()
        for rel in RELATIONS:
            member = members[rel].select(F.col("id").alias(f"_dq_{rel.name}_id"), F.struct("*").alias(rel.name))
            paired = paired.join(member, paired[f"{rel.name}_id"] == member[f"_dq_{rel.name}_id"], "left")
    checked = paired.withColumns(
        {
            "_dq_predicate": F.coalesce(F.expr(condition), F.lit(False)),
            "_dq_owner": F.when(older(a, b), F.lit(a.label)).otherwise(F.lit(b.label)),
            "_dq_gap": F.abs(F.col(f"{a.name}_ts") - F.col(f"{b.name}_ts")),
        }
    )
    return checked.select(*gold.columns, "_dq_predicate", "_dq_owner", "_dq_gap")


def with_state_checks(rows: DataFrame, late: DataFrame, watermark: int | None) -> DataFrame:
    """State rows with ``_dq_late`` (the record is also in late arrivals) and ``_dq_watermark`` (the buffer's
    eviction cutoff, null when it has none)."""
    ids = late.select("id").distinct().withColumn("_dq_late", F.lit(True))
    flagged = rows.join(F.broadcast(ids), "id", "left").withColumn("_dq_late", F.coalesce("_dq_late", F.lit(False)))
    return flagged.withColumn("_dq_watermark", F.lit(watermark).cast("bigint"))


def with_state_checks_local(rows: pa.Table, late: pa.Table, watermark: int | None) -> pa.Table:
    """``with_state_checks`` for a batch's rows held on the driver as Arrow (no Spark job per table)."""
    flagged = rows.append_column("_dq_late", pc.is_in(rows["id"], value_set=late["id"]))
    return flagged.append_column("_dq_watermark", pa.array([watermark] * rows.num_rows, pa.int64()))


def without_checks(frame: DataFrame) -> DataFrame:
    return frame.drop(*[column for column in frame.columns if column.startswith(DERIVED_PREFIX)])
