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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from state.relations import DELETE, ID, INSERT, OP, SEQ, TS

DELETED = "_deleted"  # a state table's column: the row is a deleted record's tombstone, in no buffer
# The columns of the version held before a batch, as ``resolve`` reads them from the state table.
HELD = pa.schema([(ID, pa.string()), (SEQ, pa.int64()), (DELETED, pa.bool_())])


@dataclass(frozen=True)
class Resolved:
    """One relation's change rows of a batch, against the versions held before it."""

    upserts: pa.Table  # the newer inserts and updates, one per id: the relation's arrivals, still to split by lateness
    deletes: pa.Table  # the newer deletes, one per id (the deleted version's columns)
    current: pa.Array  # of the ids changed, those with a version held before the batch (not a tombstone)
    ignored: pa.Table  # rows older than their record's newest change (held, or in the batch): they change nothing
    stored: bool  # the state table holds a row (a version or a tombstone) of some id the batch changes

    @property
    def candidates(self) -> pa.Table:
        """The changes the batch may carry out, one per id: what the relation's rules screen."""
        return pa.concat_tables([self.upserts, self.deletes])


@dataclass(frozen=True)
class Applied:
    """What a batch does with one relation's changes once screened and split by lateness."""

    on_time: pa.Table  # upserts on time: the relation's arrivals in the join
    late: pa.Table  # upserts whose new version is late: quarantined, the held version stays
    deletes: pa.Table  # deletes (never late: a delete adds no result)
    resolved: Resolved

    @property
    def changed(self) -> pa.Table:
        return pa.concat_tables([self.on_time, self.deletes], promote_options="permissive")

    @property
    def replaced(self) -> pa.Array:
        """The ids whose held version (if any) leaves every buffer before the batch joins."""
        return self.changed[ID].combine_chunks()

    @property
    def retracted(self) -> pa.Array:
        """The ids whose results may be in gold: those with a current version before the batch, and updates and
        deletes of records whose version the state no longer holds (evicted: their results are still in gold)."""
        changed = self.changed
        had_version = pc.or_(pc.is_in(changed[ID], value_set=self.resolved.current), pc.not_equal(changed[OP], INSERT))
        return pc.unique(changed.filter(had_version)[ID].combine_chunks())

    def state_rows(self) -> pa.Table:
        """What the relation's state table gains: the new versions and the deletes' tombstones."""
        return pa.concat_tables([versions(self.on_time), tombstones(self.deletes)], promote_options="permissive")

    def counts(self) -> dict[str, int]:
        """What ``status`` reports: inserted (no version held), updated, deleted, ignored as older, late."""
        updated = int(pc.sum(pc.is_in(self.on_time[ID], value_set=self.resolved.current)).as_py() or 0) if self.on_time.num_rows else 0
        return {
            "inserted": self.on_time.num_rows - updated,
            "updated": updated,
            "deleted": self.deletes.num_rows,
            "ignored": self.resolved.ignored.num_rows,
            "late": self.late.num_rows,
        }


def apply(resolved: Resolved, screened: pa.Table, split: Callable[[pa.Table], tuple[pa.Table, pa.Table]]) -> Applied:
    """``screened`` (the candidates its rules kept) as the batch carries them out: upserts ``split`` by lateness
    (their new version's), deletes as they are."""
    deleting = pc.equal(screened[OP], DELETE)
    on_time, late = split(screened.filter(pc.invert(deleting)))
    return Applied(on_time, late, screened.filter(deleting), resolved)


def resolve(rows: pa.Table, held: pa.Table) -> Resolved:
    """Per id, the latest of ``rows`` (by sequence, then arrival), split by whether it is newer than ``held`` (the
    state's ``_id``, ``_seq``, ``_deleted`` of those ids)."""
    if rows.num_rows == 0:
        empty = rows.append_column(OP, pa.array([], pa.string())).append_column(SEQ, pa.array([], pa.int64())) if OP not in rows.column_names else rows
        return Resolved(empty, empty, pa.array([], pa.string()), empty, False)
    ordered = rows.sort_by([(ID, "ascending"), (SEQ, "ascending"), ("_arrival_seq", "ascending")])
    positions = ordered.select([ID]).append_column("_position", pa.array(np.arange(rows.num_rows)))
    last = positions.group_by(ID).aggregate([("_position", "max")])["_position_max"]
    latest = ordered.take(last).sort_by("_arrival_seq")  # in arrival order
    known = held.select([ID, SEQ, DELETED]).rename_columns([ID, "_held_seq", "_held_deleted"])
    compared = latest.select([ID, SEQ]).append_column("_row", pa.array(np.arange(latest.num_rows)))
    compared = compared.join(known, ID, join_type="left outer").sort_by("_row")
    newer = pc.fill_null(pc.greater_equal(compared[SEQ], compared["_held_seq"]), True)
    current = compared.filter(pc.and_(newer, pc.equal(pc.fill_null(compared["_held_deleted"], True), False)))[ID]
    applied = latest.filter(newer)
    deleting = pc.equal(applied[OP], DELETE)
    return Resolved(
        upserts=applied.filter(pc.invert(deleting)),
        deletes=applied.filter(deleting),
        current=current.combine_chunks() if isinstance(current, pa.ChunkedArray) else current,
        ignored=_older(rows, applied, known),
        stored=held.num_rows > 0,
    )


def _older(rows: pa.Table, applied: pa.Table, held: pa.Table) -> pa.Table:
    """The rows a batch does not apply, each with ``_newest``: its record's newest sequence, held or in the batch."""
    ignored = rows.filter(pc.invert(pc.is_in(rows["_arrival_seq"], value_set=applied["_arrival_seq"]))).sort_by("_arrival_seq")
    newest = rows.select([ID, SEQ]).group_by(ID).aggregate([(SEQ, "max")]).join(held.select([ID, "_held_seq"]), ID, join_type="left outer")
    keys = ignored.select([ID, "_arrival_seq"]).join(newest, ID, join_type="left outer").sort_by("_arrival_seq")
    top = pc.max_element_wise(keys[f"{SEQ}_max"], keys["_held_seq"], skip_nulls=True)
    return ignored.append_column("_newest", top)


def ignored_rows(resolved: Resolved, relation: str, batch_id: int) -> pa.Table:
    """What ``quarantine/late_arrivals`` keeps of the changes a batch ignored: the row, and why."""
    ignored = resolved.ignored
    reason = pc.binary_join_element_wise(
        "older change: sequence ", pc.cast(ignored[SEQ], pa.string()), " is below sequence ", pc.cast(ignored["_newest"], pa.string()),
        " of the same record", "",
    )
    extra = {
        "relation": pa.array([relation] * ignored.num_rows, pa.string()),
        "reason": reason,
        "watermark": pa.array([None] * ignored.num_rows, pa.int64()),
        "batch_id": pa.array([batch_id] * ignored.num_rows, pa.int64()),
    }
    for name, column in extra.items():
        ignored = ignored.append_column(name, column)
    return ignored.drop_columns(["_newest"])


def tombstones(deletes: pa.Table) -> pa.Table:
    """The state rows a batch's deletes leave: the deleted version's id, time and sequence, marked deleted."""
    kept = deletes.select([ID, TS, SEQ, OP, "_arrival_seq"])
    return kept.append_column(DELETED, pa.array([True] * kept.num_rows, pa.bool_()))


def versions(upserts: pa.Table) -> pa.Table:
    """The upserts as state rows: current versions, not tombstones."""
    return upserts.append_column(DELETED, pa.array([False] * upserts.num_rows, pa.bool_()))
