"""Writing a batch's gold: its new rows appended, or, when change feeds changed records gold holds results of, one
MERGE that takes those results out and puts the batch's in (state/join/changes.py), so a reader never sees half a
change; with change feeds, ``gold/changes`` also lists each batch's ``+`` and ``-`` rows, append-only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.spark import held
from state.clock import now
from state.engines.table import Writer
from state.faults import step
from state.frames import union_by_name
from state.join.joiner import identity_column
from state.join.relations import ID, Relation
from state.log.batch_log import BatchPlan
from state.names import quoted

GOLD = "gold"  # the name a plan pins gold's version under (with change feeds: retractions read it)
CHANGE = "_change"  # gold/changes: "+" a row gold gains, "-" a row it loses
CHANGE_FEED = {"delta.enableChangeDataFeed": "true"}  # gold's Change Data Feed, for readers that follow it
RETRACTION = "source.batch_id IS NULL"  # a MERGE source row that only takes its gold row out


@dataclass(frozen=True)
class Retraction:
    """The rows a batch's changes take out of gold: gold's rows (at the version the plan pinned) that have a member
    whose id the batch changed. ``rows`` is None when the batch changes nothing gold may hold; ``tracked`` when the
    join reads change feeds at all (gold then keeps its Change Data Feed and ``gold/changes``)."""

    rows: DataFrame | None
    keys: Sequence[str]  # gold's columns naming a row
    tracked: bool

    @classmethod
    def of(cls, gold: DataFrame | None, ids: dict[Relation, DataFrame], keys: Sequence[str]) -> Retraction:
        """``ids``: per relation, the ``_id``s whose results the batch retracts from ``gold`` (as the plan pinned it;
        None before its first write)."""
        if gold is None or not ids:
            return cls(None, keys, bool(ids))
        rows = gold
        parts = [
            rows.join(
                F.broadcast(changed.select(F.col(ID).alias(identity_column(rel, ID)))),
                identity_column(rel, ID),
                "left_semi",
            )
            for rel, changed in ids.items()
        ]
        return cls(union_by_name(parts).dropDuplicates(list(keys)), keys, True)


def write_gold(
    gold: Writer, changes: Writer, plan: BatchPlan, rows: DataFrame, retraction: Retraction
) -> tuple[int, int] | None:
    """Write the batch's rows (and take out what it retracts) in one commit to gold, logging them in gold/changes
    when change feeds are tracked: the rows it added and retracted, or None when the run this one resumes had written
    them."""
    if retraction.rows is None:
        with step("gold"):
            written = gold.append(rows, properties=CHANGE_FEED if retraction.tracked else None)
        if retraction.tracked:
            _log_changes(changes, [rows])
        return None if written is None else (written, 0)
    # The MERGE, its counts and gold/changes each read the batch's rows and its retractions: their plans (the change
    # feeds resolved against state, the stores' join terms) cost seconds to evaluate whatever their size, so once.
    with held(rows) as added, held(retraction.rows) as retracted:
        with step("gold"):
            changed = gold.apply_changes(
                merge_source(added, retracted, retraction.keys), keys=retraction.keys, retraction=RETRACTION
            )
            done = None if changed is None else _counted(added, retracted)
        stamped = retracted.withColumns({"batch_id": F.lit(plan.batch_id).cast("long"), "produced_at": F.lit(now())})
        _log_changes(changes, [added, stamped])
    return done


def merge_source(added: DataFrame, retracted: DataFrame, keys: Sequence[str]) -> DataFrame:
    """The MERGE's source: each added row (replacing the gold row of its key, if any), and each retracted row no added
    row replaces, with a null ``batch_id`` (``RETRACTION``). One full outer join on the keys, so the batch's rows are
    reached once in the plan: their rules' observation reached twice fails a Spark Connect client."""
    extra = [name for name in retracted.columns if name not in added.columns]
    present = "a.batch_id IS NOT NULL"  # every added row has its batch's id

    def chosen(name: str) -> str:
        if name in keys:
            return quoted(name)  # the join's USING column: one per key
        if name == "batch_id" or name not in retracted.columns:
            return f"a.{quoted(name)} AS {quoted(name)}"
        return f"CASE WHEN {present} THEN a.{quoted(name)} ELSE r.{quoted(name)} END AS {quoted(name)}"

    joined = added.alias("a").join(retracted.alias("r"), list(keys), "full_outer")
    return joined.selectExpr(
        *[chosen(name) for name in added.columns],
        *[f"CASE WHEN {present} THEN NULL ELSE r.{quoted(name)} END AS {quoted(name)}" for name in extra],
    )


def _log_changes(changes: Writer, signed: list[DataFrame]) -> None:
    """``gold/changes``: the batch's added rows as ``+`` and (a second frame) the rows it took out as ``-``."""
    with step("gold_changes"):
        marked = [frame.withColumn(CHANGE, F.lit(sign)) for frame, sign in zip(signed, "+-")]
        changes.append(union_by_name(marked, allow_missing=True))


def _counted(added: DataFrame, retracted: DataFrame) -> tuple[int, int]:
    """The rows a batch added to gold and those it took out, in one job."""
    first = added.select(F.lit(1).alias("_added"), F.lit(0).alias("_retracted"))
    counts = (
        first.unionByName(retracted.select(F.lit(0).alias("_added"), F.lit(1).alias("_retracted")))
        .agg(F.sum("_added"), F.sum("_retracted"))
        .first()
    )
    return int(counts[0] or 0), int(counts[1] or 0)
