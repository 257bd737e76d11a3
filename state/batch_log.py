"""The batch log (``silver/batches``): a batch's plan is appended before any output, its commit last.

The plan pins everything the batch reads — the slice of the global arrival order, the bronze versions
that hold it, the version of every state table before the batch — so a batch that did not commit can
be resumed with exactly the same inputs (docs/design.md section 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from state.clock import now
from state.engines import DeltaEngine, Txn
from state.errors import LakejoinError
from state.progress import Progress

PLANNED, COMMITTED = "planned", "committed"

VERSIONS = pa.map_(pa.string(), pa.int64())
SCHEMA = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("phase", pa.string()),
        ("seq_from", pa.int64()),  # exclusive
        ("seq_to", pa.int64()),  # inclusive
        ("bronze_versions", VERSIONS),
        ("state_versions", VERSIONS),
        ("watermarks", VERSIONS),  # planned: before the batch; committed: after it
        ("arrivals", VERSIONS),
        ("late", VERSIONS),  # relation -> arrivals sent to quarantine/late_arrivals
        ("evicted", VERSIONS),  # state table -> rows evicted by the batch's MERGE
        ("changes", VERSIONS),  # change feeds: inserted, updated, deleted, ignored (as older), late, retracted (gold rows)
        ("clock", pa.int64()),  # planned: the time the plan read (microseconds since the epoch; state/progress.py)
        ("idle", VERSIONS),  # planned: the relations idle in the batch -> their last arrival (microseconds)
        ("declared", VERSIONS),  # planned: relation -> progress declared by 'lakejoin advance' (event-time axis)
        ("raised", pa.map_(pa.string(), pa.string())),  # relation -> why its watermark stands above its own records'
        ("pairs", pa.int64()),
        ("recorded_at", pa.timestamp("us", tz="UTC")),
        ("seconds", pa.float64()),
    ]
)


@dataclass(frozen=True)
class BatchPlan:
    """What one batch reads: arrivals with ``seq_from < _arrival_seq <= seq_to``, at pinned versions."""

    batch_id: int
    seq_from: int
    seq_to: int
    bronze_versions: dict[str, int]  # relation name -> bronze version holding the slice (absent: no table yet)
    state_versions: dict[str, int]  # state table name -> version before the batch (absent: no table yet)
    watermarks: dict[str, int] = field(default_factory=dict)  # relation -> watermark before the batch
    progress: Progress = field(default_factory=Progress)  # idle relations and declared progress (state/progress.py)
    raised: dict[str, str] = field(default_factory=dict)  # before the batch: why a watermark stands where it is


@dataclass(frozen=True)
class BatchOutcome:
    arrivals: dict[str, int]
    pairs: int
    seconds: float
    late: dict[str, int] = field(default_factory=dict)
    evicted: dict[str, int] = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)  # after the batch
    changes: dict[str, int] = field(default_factory=dict)  # change feeds' counts (state/changes.py), summed
    raised: dict[str, str] = field(default_factory=dict)  # after the batch (state/progress.py)


@dataclass(frozen=True)
class LogTail:
    last_batch_id: int  # the newest batch, committed or not (0 before the first batch)
    last_seq: int  # the arrival order is processed up to here (0 before the first batch)
    unfinished: BatchPlan | None  # planned, not committed: to resume with its own plan
    newest: BatchPlan | None = None  # the plan of the newest batch, committed or not
    watermarks: dict[str, int] = field(default_factory=dict)  # after the last committed batch
    raised: dict[str, str] = field(default_factory=dict)  # why those watermarks stand (state/progress.py)

    @property
    def committed_batch_id(self) -> int:
        return self.last_batch_id - (self.unfinished is not None)


class BatchLog:
    def __init__(self, engine: DeltaEngine, path: str, app_id: str) -> None:
        self.engine, self.path, self.app_id = engine, path, app_id

    def tail(self) -> LogTail:
        last_id = self.engine.max_value(self.path, "batch_id")
        if last_id is None:
            return LogTail(0, 0, None)
        rows = self.engine.rows(self.path, where=f"batch_id = {last_id}").to_pylist()  # at most two rows
        phases = {row["phase"]: row for row in rows}
        if PLANNED not in phases:
            raise LakejoinError(
                f"batch log {self.path} has batch {last_id} without a plan, so lakejoin did not write it: "
                "move it away, or rebuild with 'lakejoin reset'"
            )
        plan = _plan_of(phases[PLANNED])
        if COMMITTED in phases:
            committed = phases[COMMITTED]
            return LogTail(last_id, plan.seq_to, None, plan, dict(committed["watermarks"] or {}), dict(committed.get("raised") or {}))
        return LogTail(last_id, plan.seq_from, plan, plan, plan.watermarks, plan.raised)

    def record_plan(self, plan: BatchPlan) -> None:
        self._append(plan, PLANNED, None)

    def record_commit(self, plan: BatchPlan, outcome: BatchOutcome) -> None:
        self._append(plan, COMMITTED, outcome)

    def _append(self, plan: BatchPlan, phase: str, outcome: BatchOutcome | None) -> None:
        row = {
            "batch_id": plan.batch_id,
            "phase": phase,
            "seq_from": plan.seq_from,
            "seq_to": plan.seq_to,
            "bronze_versions": list(plan.bronze_versions.items()),
            "state_versions": list(plan.state_versions.items()),
            "watermarks": list((plan.watermarks if outcome is None else outcome.watermarks).items()),
            "arrivals": None if outcome is None else list(outcome.arrivals.items()),
            "late": None if outcome is None else list(outcome.late.items()),
            "evicted": None if outcome is None else list(outcome.evicted.items()),
            "changes": None if outcome is None or not outcome.changes else list(outcome.changes.items()),
            "clock": plan.progress.clock,
            "idle": list(plan.progress.idle.items()),
            "declared": list(plan.progress.declared.items()),
            "raised": list((plan.raised if outcome is None else outcome.raised).items()),
            "pairs": None if outcome is None else outcome.pairs,
            "recorded_at": now(),
            "seconds": None if outcome is None else outcome.seconds,
        }
        # The plan and the commit of a batch are distinct transactions: 2 * id - 1 and 2 * id.
        version = 2 * plan.batch_id - (phase == PLANNED)
        self.engine.append(self.path, pa.Table.from_pylist([row], SCHEMA), Txn(self.app_id, version))


def _plan_of(row: dict[str, Any]) -> BatchPlan:
    return BatchPlan(
        batch_id=row["batch_id"],
        seq_from=row["seq_from"],
        seq_to=row["seq_to"],
        bronze_versions=dict(row["bronze_versions"] or {}),
        state_versions=dict(row["state_versions"] or {}),
        watermarks=dict(row["watermarks"] or {}),
        progress=Progress(row.get("clock"), dict(row.get("idle") or {}), dict(row.get("declared") or {})),
        raised=dict(row.get("raised") or {}),
    )
