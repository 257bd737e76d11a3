"""The columns rules check that no table stores: pure ``DataFrame -> DataFrame`` functions (``_dq_*``).

Gold keeps every column of each record (prefixed by its relation), so the join predicate is evaluated on the
records rebuilt from gold; with a configured ``select`` it is evaluated on the pair's records as bronze holds them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.engines import Memberships
from state.join.joiner import Projection, identity_column, label, owner_label
from state.join.relations import ID, TS, Relation
from state.names import quoted

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
    only when gold does not carry what the condition needs. A gold of one relation's records (semi and anti joins) has
    no condition to check."""
    if len(relations) == 1:
        return with_nothing_to_check(gold)

    def member(rel: Relation) -> str:
        derived = [f"'{name}', {identity_column(rel, name)}" for name in (ID, TS)]
        carried = (
            []
            if projection.select is not None
            else [f"'{name}', {quoted(f'{rel.name}_{name}')}" for name in projection.columns.get(rel.name, ())]
        )
        return f"named_struct({', '.join([*derived, *carried])}) AS {quoted(rel.name)}"

    paired = gold.selectExpr("*", *[member(rel) for rel in relations])
    if projection.select is not None or not _resolves(paired, condition):  # with a select, gold has no records
        paired, members = gold, records()
        for rel in relations:
            bronze = members[rel].select(F.col(ID).alias(f"_dq_{rel.name}_id"), F.struct("*").alias(rel.name))
            paired = paired.join(bronze, paired[identity_column(rel, ID)] == bronze[f"_dq_{rel.name}_id"], "left")
    stamps = ", ".join(identity_column(rel, TS) for rel in relations)
    present = {rel: f"{identity_column(rel, ID)} IS NOT NULL" for rel in relations}
    complete = " AND ".join(present.values())
    alone = {
        rel: " AND ".join([present[rel], *[f"NOT ({present[other]})" for other in relations if other != rel]])
        for rel in relations
    }
    owner = (
        label(owned_by)
        if owned_by is not None
        else f"CASE WHEN {complete} THEN {owner_label(relations)} "
        + " ".join(f"WHEN {alone[rel]} THEN {label(rel)}" for rel in relations)
        + " END"
    )
    return paired.selectExpr(
        "*",
        f"CASE WHEN {complete} THEN coalesce({condition}, false) ELSE true END AS _dq_predicate",
        f"{owner} AS _dq_owner",
        f"greatest({stamps}) - least({stamps}) AS _dq_gap",
        f"({' OR '.join([f'({complete})', *[f'({alone[rel]})' for rel in relations if rel in preserved]])}) AS "
        "_dq_complete",
    ).drop(*[name for rel in relations for name in (rel.name, f"_dq_{rel.name}_id")])


def with_nothing_to_check(gold: DataFrame) -> DataFrame:
    """Gold rows whose members the rules have nothing to compare: a gold of one relation's records (semi and anti
    joins), or a batch before every relation has had a record (no tuple yet)."""
    return gold.withColumns(
        {
            "_dq_predicate": F.lit(True),
            "_dq_owner": F.col("owner"),
            "_dq_gap": F.lit(0).cast("bigint"),
            "_dq_complete": F.lit(True),
        }
    )


def _resolves(frame: DataFrame, condition: str) -> bool:
    try:
        frame.select(F.expr(condition)).schema
    except AnalysisException:
        return False
    return True


def with_state_checks(rows: DataFrame, late: str, eviction: Memberships) -> DataFrame:
    """State rows with ``_dq_late`` (``late``, in Spark SQL: the row's record is also among the late arrivals) and
    ``_dq_watermark`` (the highest cutoff among the buffers the row is in, null when none of them has one)."""
    cutoffs = [
        f"CASE WHEN {quoted(name)} THEN {cutoff.below} END"
        for name, cutoff in eviction.cutoffs.items()
        if cutoff is not None and name in rows.columns
    ]
    highest = (
        "CAST(NULL AS BIGINT)"
        if not cutoffs
        else cutoffs[0]
        if len(cutoffs) == 1
        else f"greatest({', '.join(cutoffs)})"
    )
    return rows.selectExpr("*", f"coalesce({late}, false) AS _dq_late", f"CAST({highest} AS BIGINT) AS _dq_watermark")
