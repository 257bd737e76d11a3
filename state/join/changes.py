"""Records that change (docs/design.md section 2.11): a batch's change rows of a relation, resolved against the versions
its state table holds into what the store/probe join already does.

A change names a record by its id and carries a whole version of it: the new one (an insert or an update, both
*upserts*) or the last one (a delete), with a sequence; the highest sequence per id wins. A batch takes, per id, its
latest change (sequence, then arrival) and compares it with the version held before the batch, the state table's
row of that id, a deleted record's *tombstone* included:

- not newer than the held version: ignored (kept in ``quarantine/late_arrivals`` with the reason, as is every
  change of the batch that a later one of its id replaces), so an older change arriving later changes nothing;
- newer: applied. The held version leaves every buffer (the MERGE replaces its row), the results it is a member of
  leave gold (retracted by its id, whichever store produced them), and an upsert's version enters the batch as an
  ordinary arrival, joined against buffers that no longer hold the versions it replaces. A delete's tombstone stays
  in the state table in no buffer, so an older insert arriving later stays deleted.

Gold is then the join of the current versions after every batch, whatever the arrival order or the batch split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from state.join.relations import DELETE, ID, INSERT, OP, SEQ, TS

DELETED = "_deleted"  # a state table's column: the row is a deleted record's tombstone, in no buffer
HELD_SEQ, HELD_DELETED = "_held_seq", "_held_deleted"  # the version a state table holds of an id, before the batch
NEWEST = "_newest"  # an ignored change's record's newest sequence, held or in the batch


@dataclass(frozen=True)
class Resolved:
    """One relation's change rows of a batch, against the versions held before it."""

    upserts: DataFrame  # the newer inserts and updates, one per id: the relation's arrivals, still to split by lateness
    deletes: DataFrame  # the newer deletes, one per id (the deleted version's columns)
    current: DataFrame  # ``_id``s of the ids changed that had a version held before the batch (not a tombstone)
    ignored: DataFrame  # rows older than their record's newest change (held, or in the batch), with ``_newest``

    @property
    def candidates(self) -> DataFrame:
        """The changes the batch may carry out, one per id: what the relation's rules screen."""
        return self.upserts.unionByName(self.deletes)


@dataclass(frozen=True)
class Applied:
    """What a batch does with one relation's changes once screened and split by lateness."""

    on_time: DataFrame  # upserts on time: the relation's arrivals in the join
    late: DataFrame  # upserts whose new version is late: quarantined, the held version stays
    deletes: DataFrame  # deletes (never late: a delete adds no result)
    resolved: Resolved

    @property
    def changed(self) -> DataFrame:
        return self.on_time.unionByName(self.deletes, allowMissingColumns=True)

    @property
    def replaced(self) -> DataFrame:
        """The ``_id``s whose held version (if any) leaves every buffer before the batch joins."""
        return self.changed.select(ID)

    @property
    def retracted(self) -> DataFrame:
        """The ``_id``s whose results may be in gold: those with a current version before the batch, and updates and
        deletes of records whose version the state no longer holds (evicted: their results are still in gold)."""
        current = self.resolved.current.withColumn("_current", F.lit(True))
        changed = self.changed.select(ID, OP).join(current, ID, "left")
        return changed.where(F.col("_current").isNotNull() | (F.col(OP) != INSERT)).select(ID).distinct()

    def state_rows(self) -> DataFrame:
        """What the relation's state table gains: the new versions and the deletes' tombstones."""
        return versions(self.on_time).unionByName(tombstones(self.deletes), allowMissingColumns=True)

    def counts(self) -> dict[str, tuple[DataFrame, Column]]:
        """What ``status`` reports, each a frame and the aggregate that counts it: inserted (no version held), updated,
        deleted, ignored as older, late."""
        updated = self.on_time.join(self.resolved.current, ID, "left_semi")
        rows = F.count(F.lit(1))
        return {
            "inserted": (self.on_time.join(self.resolved.current, ID, "left_anti"), rows),
            "updated": (updated, rows),
            "deleted": (self.deletes, rows),
            "ignored": (self.resolved.ignored, rows),
            "late": (self.late, rows),
        }


def apply(
    resolved: Resolved, screened: DataFrame, split: Callable[[DataFrame], tuple[DataFrame, DataFrame]]
) -> Applied:
    """``screened`` (the candidates its rules kept) as the batch carries them out: upserts ``split`` by lateness
    (their new version's), deletes as they are."""
    deleting = F.col(OP) == DELETE
    on_time, late = split(screened.where(~deleting))
    return Applied(on_time, late, screened.where(deleting), resolved)


def resolve(
    rows: DataFrame, held: DataFrame, settle: Callable[[DataFrame], DataFrame] = lambda frame: frame
) -> Resolved:
    """Per id, the latest of ``rows`` (by sequence, then arrival), split by whether it is newer than ``held`` (the
    state's ``_id``, ``_seq``, ``_deleted`` of those ids). ``settle`` takes the rows compared with what is held, from
    which every part is derived (a small batch holds them on the driver, so its many reads do not resolve again)."""
    by_id = Window.partitionBy(ID)
    ranked = rows.withColumns(
        {
            "_rank": F.row_number().over(by_id.orderBy(F.col(SEQ).desc(), F.col("_arrival_seq").desc())),
            "_batch_newest": F.max(SEQ).over(by_id),
        }
    )
    known = held.select(ID, F.col(SEQ).alias(HELD_SEQ), F.col(DELETED).alias(HELD_DELETED))
    compared = settle(ranked.join(known, ID, "left"))
    newer = (F.col("_rank") == 1) & F.coalesce(F.col(SEQ) >= F.col(HELD_SEQ), F.lit(True))
    applied = compared.where(newer)
    columns = rows.columns
    return Resolved(
        upserts=applied.where(F.col(OP) != DELETE).select(*columns),
        deletes=applied.where(F.col(OP) == DELETE).select(*columns),
        current=applied.where(F.col(HELD_SEQ).isNotNull() & ~F.col(HELD_DELETED)).select(ID),
        ignored=compared.where(~newer)
        .withColumn(NEWEST, F.greatest("_batch_newest", HELD_SEQ))
        .select(*columns, NEWEST),
    )


def ignored_rows(resolved: Resolved, relation: str, batch_id: int) -> DataFrame:
    """What ``quarantine/late_arrivals`` keeps of the changes a batch ignored: the row, and why."""
    reason = F.concat(
        F.lit("older change: sequence "),
        F.col(SEQ).cast("string"),
        F.lit(" is below sequence "),
        F.col(NEWEST).cast("string"),
        F.lit(" of the same record"),
    )
    return resolved.ignored.withColumns(
        {
            "relation": F.lit(relation),
            "reason": reason,
            "watermark": F.lit(None).cast("bigint"),
            "batch_id": F.lit(batch_id).cast("bigint"),
        }
    ).drop(NEWEST)


def tombstones(deletes: DataFrame) -> DataFrame:
    """The state rows a batch's deletes leave: the deleted version's id, time and sequence, marked deleted."""
    return deletes.select(ID, TS, SEQ, OP, "_arrival_seq", F.lit(True).alias(DELETED))


def versions(upserts: DataFrame) -> DataFrame:
    """The upserts as state rows: current versions, not tombstones."""
    return upserts.withColumn(DELETED, F.lit(False))


def latest_held(snapshot: DataFrame) -> DataFrame:
    """A state table's ``_id``, ``_seq`` and ``_deleted`` (false where the table predates tombstones)."""
    deleted = F.col(DELETED) if DELETED in snapshot.columns else F.lit(False)
    return snapshot.select(ID, F.col(SEQ).cast("long").alias(SEQ), F.coalesce(deleted, F.lit(False)).alias(DELETED))
