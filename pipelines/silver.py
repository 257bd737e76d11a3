"""The silver stage: every pending arrival joined in batches, each a prefix of the arrival order, with the files new
in the relations' landing folders.

A batch is a short pipeline of named steps (docs/design.md section 3): plan (pipelines/batch/plan.py) → land its files
in bronze (land.py) → read its arrivals back, and the state at the plan's versions (read.py) → measure them in one job,
or take what the bronze writes counted of the rows they landed (measure.py) → emit every table's rows (emit.py) →
write them (write.py), each commit carrying the batch's transaction and plan → log the batch, its one bookkeeping
commit, last. A batch that died after some of its writes is resumed with the plan they carry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame

from expectations.batch import stopped
from pipelines.batch.context import Batch, Run
from pipelines.batch.emit import emit
from pipelines.batch.land import Landing, land
from pipelines.batch.measure import measure, watch, watched
from pipelines.batch.plan import plan_next
from pipelines.batch.read import gold_at_plan, known_records, read, tables_at_plan
from pipelines.batch.write import write
from pipelines.bronze.ingest import IngestResult
from pipelines.bronze.landing import Known, known_files
from state.config import Config
from state.engines import DeltaEngine
from state.errors import LakejoinError, first_line, lost_a_race
from state.faults import step
from state.join.joiner import BROADCAST_ROWS
from state.join.relations import Relation
from state.layout import Warehouse
from state.log.batch_log import BatchOutcome, BatchPlan, LogTail
from state.log.checks import check_consistency
from state.log.lock import INGEST, Takings, hold
from state.log.pointers import missing_rows
from state.phases import take, timed


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    arrivals: dict[str, int]
    pairs: int
    seconds: float
    resumed: bool
    late: dict[str, int]
    evicted: dict[str, int]
    rule_failures: dict[str, int] = field(default_factory=dict)  # rows failing each warn/quarantine rule
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase (state/phases.py)
    changes: dict[str, int] = field(
        default_factory=dict
    )  # change feeds' counts (state/join/changes.py), with gold rows retracted
    races: int = 0  # times this batch was tried again after a commit of it lost a race to another writer

    def describe(self) -> str:
        arrived = ", ".join(f"{count} {name.upper()}" for name, count in self.arrivals.items())
        again = " (resumed)" if self.resumed else ""
        notes = [f"{sum(self.late.values())} late"] if any(self.late.values()) else []
        notes += [f"{sum(self.evicted.values())} evicted"] if any(self.evicted.values()) else []
        notes += [f"{self.changes['retracted']} retracted"] if self.changes.get("retracted") else []
        notes += [f"{self.changes['ignored']} ignored as older"] if self.changes.get("ignored") else []
        notes += [f"{sum(self.rule_failures.values())} rule failures"] if self.rule_failures else []
        notes += [f"tried again {self.races} times after losing a commit race"] if self.races else []
        extra = "".join(f", {note}" for note in notes)
        return f"batch {self.batch_id}{again}: {arrived} arrivals, {self.pairs} pairs{extra}, {self.seconds:.2f} s"


@dataclass(frozen=True)
class RunReport:
    """What a run did: each batch it committed, in order, and the totals."""

    batches: list[BatchReport]
    interrupted: bool = False  # a follow stopped by a second signal, the batch under way abandoned
    sources: list = field(default_factory=list)  # each source table's ingest (pipelines/bronze/sources.py SourceResult)
    landed: list = field(
        default_factory=list
    )  # what each batch landed from the landing folders (Landing), and each file refused or skipped (IngestResult)

    @property
    def refused(self) -> list:
        """The landing files refused as a whole this run (for good: recorded, not tried again; or for now)."""
        return [result for result in self.landed if getattr(result, "refused", None) is not None]

    @property
    def arrivals(self) -> int:
        return sum(sum(batch.arrivals.values()) for batch in self.batches)

    @property
    def pairs(self) -> int:
        return sum(batch.pairs for batch in self.batches)

    @property
    def late(self) -> int:
        return sum(sum(batch.late.values()) for batch in self.batches)

    @property
    def evicted(self) -> int:
        return sum(sum(batch.evicted.values()) for batch in self.batches)

    @property
    def races(self) -> int:
        """Times a batch was tried again after a commit of it lost a race to another writer (OPTIMIZE, VACUUM)."""
        return sum(batch.races for batch in self.batches)

    def describe(self) -> str:
        """One line for the whole run: what it joined, what it set aside as late, what it evicted."""
        if not self.batches:
            return "nothing pending: every arrival is already joined"
        where = " (quarantine/late_arrivals)" if self.late else ""
        return (
            f"{len(self.batches)} batches: {self.arrivals} arrivals, {self.pairs} pairs, {self.late} late{where}, "
            f"{self.evicted} evicted from state"
            + (f", {self.races} batch tries again after losing a commit race" if self.races else "")
        )


def run(
    engine: DeltaEngine,
    warehouse: Warehouse,
    config: Config,
    progress: Callable[[BatchReport | Landing | IngestResult], None] = lambda _: None,
    stop: Callable[[], bool] = lambda: False,
    before_writing: Callable[[], None] = lambda: None,
    fence: Callable[[], None] = lambda: None,
    takings: Takings | None = None,
) -> list[BatchReport]:
    """Process every pending arrival and every file new in the landing folders, batch by batch (or until ``stop``
    says so, between batches), then return what each batch did; ``progress`` hears of what each batch landed and of
    each batch as it commits, ``before_writing`` is called before each batch's first write (the CLI records the
    definition there, once), ``fence`` before each batch's first write and before its log row: it raises when the
    run no longer holds the warehouse (a catalog warehouse's lease taken by another run: state/log/lease.py).
    ``takings``: the caller's record of the warehouse locks' takings, given when it took the run's lock and so decided
    what the engine keeps of the tables it saw (state/log/lock.py); without it, the run forgets every table first."""
    if takings is None:
        engine.refresh()

    def fenced() -> None:
        before_writing()
        fence()

    return _batches(Run.of(engine, warehouse, config, takings), progress, stop, fenced, fence)


# A batch whose commit lost a race is resumed from its last committed write: tried this many times at most, waiting
# RACE_BACKOFF seconds, doubled each time, before each try (the winner, an OPTIMIZE, is usually done by then).
RACES_PER_BATCH = 5
RACE_BACKOFF = 0.5


def _batches(
    run: Run,
    progress: Callable,
    stop: Callable[[], bool],
    before_writing: Callable[[], None],
    fence: Callable[[], None],
) -> list[BatchReport]:
    """Batch after batch, from the log's tail: an unfinished batch first (resumed with its plan), then new plans. A
    batch whose commit lost a race to another writer is resumed as a new run would resume it: each write under its
    transaction marker, so what it committed before is not written again."""
    reports: list[BatchReport] = []
    races = 0
    while True:
        try:
            tail = check_consistency(run.tables, run.warehouse, creates=bool(run.landings))
            known = known_files(run.tables.ingest_log, run.tables.batches) if run.landings else Known()
            while True:
                report, tail = _batch(run, tail, known, progress, stop, before_writing, fence)
                if report is None:
                    return reports
                report, races = replace(report, races=races), 0
                reports.append(report)
                progress(report)
                look_again(run.engine, run.warehouse, run.takings)  # the next plan sees what was ingested meanwhile
        except Exception as exc:
            if not lost_a_race(exc):
                raise
            if races == RACES_PER_BATCH:
                raise LakejoinError(
                    f"a batch lost {races + 1} commit races in a row to another writer of its tables (OPTIMIZE, "
                    f"VACUUM, another job): {first_line(exc)}; nothing is lost, run again once that writer is done"
                ) from exc
            time.sleep(RACE_BACKOFF * 2**races)
            races += 1
            run.engine.refresh()


def _batch(
    run: Run,
    tail: LogTail,
    known: Known,
    progress: Callable,
    stop: Callable[[], bool],
    before_writing: Callable[[], None],
    fence: Callable[[], None],
) -> tuple[BatchReport | None, LogTail]:
    """The next batch, planned, landed and executed; None when there is nothing (more) to do. Each table's latest
    commit is looked up once (``pinned``): the run holds the lock of what a batch writes, lands under the ingest lock
    (taking it forgets what ingests write), and reads bronze at the versions it planned."""
    started = time.perf_counter()  # a batch's seconds include planning
    take()  # and so do its phases
    resumed = tail.unfinished
    for file in resumed.files if resumed is not None else ():  # its files are taken: no later batch plans them
        known.add(file.relation, file.path, file.sha256, file.refused is not None)
    with run.engine.pinned():
        with _landing(run, resumed is None):
            with timed("planning"):
                plan = None if resumed is None and stop() else resumed or _planned(run, tail, known, progress)
            if plan is None:
                return None, tail
            batch = run.batch(plan)
            states = tables_at_plan(batch)
            _report_skipped(plan, progress)
            landed = _landed(batch, states, before_writing)
        for landing in landed:
            progress(landing)
            for refused in landing.retried:
                progress(IngestResult(str(refused), landing.relation, refused=str(refused)))
        return _execute(batch, states, landed, started, resumed is not None, before_writing, fence)


@contextmanager
def _landing(run: Run, lands: bool) -> Iterator[None]:
    """Under the ingest lock when the batch may land files: its files' places in the arrival order follow every place
    taken, and no ingest takes one while it plans and lands them."""
    if not (run.landings and lands):
        yield
        return
    with hold(run.warehouse.root, INGEST, None, run.engine.spark, run.takings) as held:
        look_again(run.engine, run.warehouse, run.takings, ingest_unchanged=held.unchanged)
        yield


def look_again(
    engine: DeltaEngine, warehouse: Warehouse, takings: Takings, ingest_unchanged: bool | None = None
) -> None:
    """Forget what other lakejoin calls may have written beside a run that holds its lock since it last looked: the
    tables beside the run's own, unless no ingest took the lock since (``ingest_unchanged``, as the run's own taking of
    it found, else as the lock file says: ``Takings.peek``); every table once what is kept reaches its age limit."""
    if takings.expired():
        engine.refresh()
    elif not (takings.peek(warehouse.root, INGEST) if ingest_unchanged is None else ingest_unchanged):
        engine.refresh(*warehouse.beside_runs())


def _planned(run: Run, tail: LogTail, known: Known, progress: Callable) -> BatchPlan | None:
    planned = plan_next(run, tail, known)
    for refused in planned.retried:
        progress(IngestResult(str(refused), "", refused=str(refused)))
    return planned.plan


def _report_skipped(plan: BatchPlan, progress: Callable) -> None:
    """The files a plan takes only to record them: refused for good, or copies of files landed before."""
    for file in plan.files:
        if file.refused is not None:
            progress(IngestResult(file.path, file.relation, refused=file.refused, recorded=True))
        elif file.copy_of is not None:
            progress(IngestResult(file.path, file.relation, already_ingested=True))


def _landed(
    batch: Batch, states: dict[Relation, DataFrame | None], before_writing: Callable[[], None]
) -> list[Landing]:
    """The batch's files in bronze (nothing when it takes none): its first writes."""
    if not batch.plan.files:
        return []
    before_writing()
    return land(batch, lambda rel: known_records(batch, rel, states[rel]), watch(batch, states))


def _execute(
    given: Batch,
    states: dict[Relation, DataFrame | None],
    landed: list[Landing],
    started: float,
    resumed: bool,
    before_writing: Callable[[], None],
    fence: Callable[[], None],
) -> tuple[BatchReport, LogTail]:
    """Read the batch's arrivals, measure them, emit and write every table, and log the batch. Returns what it did
    and the log's tail after it (this run holds the lock: nothing else appends to the log)."""
    batch = given.on_axis()  # bronze holds event times once anything landed
    plan = batch.plan
    with timed("read"):
        arrived = read(batch, states)
    with timed("measure"):
        measured = watched(arrived, landed) or measure(
            batch.engine.spark, arrived, plan.watermarks, plan.bound <= BROADCAST_ROWS
        )
    for rel in batch.relations:
        missing = measured.pointers.get(rel.name)
        if missing is not None and (
            error := missing_rows(batch.config.spec(rel.name).table, missing, measured.rows[rel.name])
        ):  # type: ignore[arg-type] - a source table's
            raise error
    broken = stopped(
        plan.batch_id,
        [result for results in measured.rules.values() for result in results],
        written=bool(landed) or resumed,
    )
    if broken is not None:
        raise broken
    outputs = emit(batch, arrived, measured, gold_at_plan(batch))
    before_writing()
    written = write(batch, outputs)
    changes = measured.changed() | ({"retracted": written.retracted} if measured.changes else {})
    outcome = BatchOutcome(
        arrivals=measured.rows,
        pairs=written.pairs,
        seconds=time.perf_counter() - started,
        late=measured.late,
        evicted=written.evicted,
        watermarks=outputs.watermarks,
        changes=changes,
        raised=outputs.raised,
        landed={landing.relation: landing.landed for landing in landed},
        quarantined={landing.relation: landing.quarantined for landing in landed},
        duplicates={landing.relation: landing.duplicates for landing in landed},
        files=tuple(file for landing in landed for file in landing.files),
        rules=tuple([result for results in measured.rules.values() for result in results] + written.rules),
    )
    fence()
    with step("commit"):
        batch.run.log.record(batch.writer(batch.tables.batches), plan, outcome)
    failures = {rule.rule: rule.failed for rule in outcome.rules if rule.failed}
    report = BatchReport(
        plan.batch_id,
        outcome.arrivals,
        written.pairs,
        outcome.seconds,
        resumed,
        outcome.late,
        outcome.evicted,
        failures,
        take(),
        outcome.changes,
    )
    return report, LogTail(plan.batch_id, plan.seq_to, outputs.watermarks, outputs.raised)
