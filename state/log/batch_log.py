"""The batch log (``silver/batches``): one row per batch, written last, when every other write of the batch is done.

A batch's **plan** pins everything it reads: the slice of the global arrival order, the bronze and state versions
before it, the watermarks, the landed files it takes (each with its places in the arrival order). Every write of the
batch carries the plan in its commit (``Commit.plan``), so a batch that died after any write is resumed with exactly its
plan (docs/design.md section 3), and the log row, its one bookkeeping commit, records the plan with what the batch
did: counts, watermarks after it, the rules' results.
"""

from __future__ import annotations

import base64
import json
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from state.clock import now
from state.engines.base import DeltaReader
from state.engines.table import Table, Writer
from state.log.progress import Progress

VERSIONS = pa.map_(pa.string(), pa.int64())
FILE = pa.struct(
    [
        ("relation", pa.string()),
        ("path", pa.string()),
        ("sha256", pa.string()),
        ("bytes", pa.int64()),
        ("first", pa.int64()),
        ("bound", pa.int64()),
        ("refused", pa.string()),
        ("copy_of", pa.string()),
    ]
)
RULE = pa.struct(
    [
        ("rule", pa.string()),
        ("table", pa.string()),
        ("policy", pa.string()),
        ("evaluated", pa.int64()),
        ("failed", pa.int64()),
        ("examples", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("seq_from", pa.int64()),  # exclusive
        ("seq_to", pa.int64()),  # inclusive
        ("bronze_versions", VERSIONS),  # before the batch
        ("state_versions", VERSIONS),  # before the batch
        ("watermarks", VERSIONS),  # after the batch
        ("arrivals", VERSIONS),
        ("late", VERSIONS),  # relation -> arrivals sent to quarantine/late_arrivals
        ("evicted", VERSIONS),  # state table -> rows evicted by the batch's MERGE
        (
            "changes",
            VERSIONS,
        ),  # change feeds: inserted, updated, deleted, ignored (as older), late, retracted (gold rows)
        ("landed", VERSIONS),  # relation -> rows its landed files brought to bronze
        ("quarantined", VERSIONS),  # relation -> rows of its landed files set aside in quarantine/ingest
        ("duplicates", VERSIONS),  # relation -> rows of its landed files skipped as copies of records already held
        ("files", pa.list_(FILE)),  # the landed files the batch took, and those it refused for good
        ("rules", pa.list_(RULE)),  # each rule's result on the batch's rows
        ("clock", pa.int64()),  # the time the plan read (microseconds since the epoch; state/log/progress.py)
        ("idle", VERSIONS),  # the relations idle in the batch -> their last arrival (microseconds)
        ("declared", VERSIONS),  # relation -> progress declared by 'lakejoin advance' (event-time axis)
        (
            "raised",
            pa.map_(pa.string(), pa.string()),
        ),  # after the batch: relation -> why its watermark stands above its own records'
        ("pairs", pa.int64()),
        ("recorded_at", pa.timestamp("us", tz="UTC")),
        ("seconds", pa.float64()),
    ]
)


@dataclass(frozen=True)
class LandedFile:
    """A file the batch lands from a relation's landing folder. Its rows take the places ``first + line`` of the arrival
    order, within ``bound`` places (at least its lines or rows), so a replay numbers them the same."""

    relation: str
    path: str
    sha256: str
    bytes: int
    first: int
    bound: int
    refused: str | None = (
        None  # why the file is refused for good (it lands nothing; recorded so as not to be tried again)
    )
    copy_of: str | None = None  # the file landed before with the same content: this one adds nothing

    @property
    def lands(self) -> bool:
        return self.refused is None and self.copy_of is None


@dataclass(frozen=True)
class BatchPlan:
    """What one batch reads: bronze's arrivals with ``seq_from < _arrival_seq <= seq_to`` (those ingested before it, and
    those its ``files`` land), and the state tables at pinned versions."""

    batch_id: int
    seq_from: int
    seq_to: int
    bronze_versions: dict[str, int]  # relation name -> bronze version before the batch (absent: no table yet)
    state_versions: dict[str, int]  # state table name -> version before the batch (absent: no table yet)
    watermarks: dict[str, int] = field(default_factory=dict)  # relation -> watermark before the batch
    progress: Progress = field(default_factory=Progress)  # idle relations and declared progress (state/log/progress.py)
    raised: dict[str, str] = field(default_factory=dict)  # before the batch: why a watermark stands where it is
    files: tuple[LandedFile, ...] = ()
    ingested_to: int | None = None  # the slice's arrivals ingested before the batch end here (None: at ``seq_to``)

    @property
    def ingested(self) -> str:
        """The batch's arrivals ingested before it, as a predicate on bronze's ``_arrival_seq``."""
        return (
            f"(_arrival_seq > {self.seq_from} AND _arrival_seq <= "
            f"{self.ingested_to if self.ingested_to is not None else self.seq_to})"
        )

    @property
    def slice(self) -> str:
        """All of the batch's arrivals in bronze: those ingested before it, then the places its files take (not the
        places a crashed ingest may have left between them)."""
        if not self.files:
            return self.ingested
        return (
            f"({self.ingested} OR (_arrival_seq > {min(file.first for file in self.files)} AND _arrival_seq <= "
            f"{self.seq_to}))"
        )

    @property
    def bound(self) -> int:
        """At most this many arrivals: the places of the slice."""
        return self.seq_to - self.seq_from

    def landing(self, relation: str) -> list[LandedFile]:
        """The files the batch lands into ``relation``'s bronze (not those refused, nor copies)."""
        return [file for file in self.files if file.relation == relation and file.lands]

    def encoded(self) -> str:
        """The plan as every write of the batch carries it: compressed JSON, for a commit's metadata."""
        return base64.b64encode(zlib.compress(json.dumps(asdict(self), separators=(",", ":")).encode())).decode()

    @classmethod
    def decoded(cls, text: str) -> BatchPlan:
        fields = json.loads(zlib.decompress(base64.b64decode(text)))
        fields["progress"] = Progress(**fields["progress"])
        fields["files"] = tuple(LandedFile(**file) for file in fields["files"])
        return cls(**fields)


@dataclass(frozen=True)
class RuleCount:
    """One rule's result on one table's rows of a batch."""

    rule: str
    table: str
    policy: str
    evaluated: int
    failed: int
    examples: str  # JSON: a few failing rows' keys


@dataclass(frozen=True)
class BatchOutcome:
    arrivals: dict[str, int]
    pairs: int
    seconds: float
    late: dict[str, int] = field(default_factory=dict)
    evicted: dict[str, int] = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)  # after the batch
    changes: dict[str, int] = field(default_factory=dict)  # change feeds' counts (state/join/changes.py), summed
    raised: dict[str, str] = field(default_factory=dict)  # after the batch (state/log/progress.py)
    landed: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    files: tuple[LandedFile, ...] = ()  # the files landed and those refused for good
    rules: tuple[RuleCount, ...] = ()


@dataclass(frozen=True)
class LogTail:
    """Where the log ends: its last batch (committed, as every logged batch is) and, when a batch after it wrote some
    of its outputs and died, that batch's plan, to resume (state/log/checks.py finds it)."""

    last_batch_id: int  # the newest committed batch (0 before the first)
    last_seq: int  # the arrival order is joined up to here (0 before the first batch)
    watermarks: dict[str, int] = field(default_factory=dict)  # after the last committed batch
    raised: dict[str, str] = field(default_factory=dict)  # why those watermarks stand (state/log/progress.py)
    last: dict[str, Any] | None = None  # the last committed batch's log row
    unfinished: BatchPlan | None = None


def bronze_read(batches: Table) -> dict[str, int]:
    """The version of each relation's bronze the log's last batch read, from the plan its log row's commit carries (no
    read of the log's rows): every commit of a later batch comes after it, so a search for one reads only the commits
    since (the ingests' since that batch, not bronze's history). Empty when the log has no batch, or its commits no
    longer carry its plan."""
    info = batches.info()
    plan = None if info is None else info.recorded.plan
    return {} if plan is None else BatchPlan.decoded(plan).bronze_versions


class BatchLog:
    def __init__(self, engine: DeltaReader, path: str, app_id: str) -> None:
        self.engine, self.path, self.app_id = engine, path, app_id

    def tail(self) -> LogTail:
        last_id = self.engine.max_value(self.path, "batch_id")
        if last_id is None:
            return LogTail(0, 0)
        found = self.engine.rows(self.path, where=f"batch_id = {last_id}")
        if found is None:  # dropped since: as good as no log
            return LogTail(0, 0)
        (row,) = found.to_pylist()
        return LogTail(last_id, row["seq_to"], dict(row["watermarks"] or {}), dict(row["raised"] or {}), row)

    def record(self, writer: Writer, plan: BatchPlan, outcome: BatchOutcome) -> None:
        """The batch's log row, by ``writer`` (the batch's commit to the log): its last write, which commits it."""
        row = {
            "batch_id": plan.batch_id,
            "seq_from": plan.seq_from,
            "seq_to": plan.seq_to,
            "bronze_versions": list(plan.bronze_versions.items()),
            "state_versions": list(plan.state_versions.items()),
            "watermarks": list(outcome.watermarks.items()),
            "arrivals": list(outcome.arrivals.items()),
            "late": list(outcome.late.items()),
            "evicted": list(outcome.evicted.items()),
            "changes": list(outcome.changes.items()) or None,
            "landed": list(outcome.landed.items()),
            "quarantined": list(outcome.quarantined.items()),
            "duplicates": list(outcome.duplicates.items()),
            "files": [asdict(file) for file in outcome.files],
            "rules": [asdict(rule) for rule in outcome.rules],
            "clock": plan.progress.clock,
            "idle": list(plan.progress.idle.items()),
            "declared": list(plan.progress.declared.items()),
            "raised": list(outcome.raised.items()),
            "pairs": outcome.pairs,
            "recorded_at": now(),
            "seconds": outcome.seconds,
        }
        writer.append(pa.Table.from_pylist([row], SCHEMA))
