"""The silver stage: every pending arrival joined in micro-batches, each a prefix of the arrival order.

Per batch (docs/design.md section 3): plan → compute from the pinned inputs → write gold and the state
tables, each commit tagged with the application transaction (pipeline:table, batch id) → commit the
batch log row last. A batch left unfinished by a crash is resumed with its own plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import reduce

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from expectations.batch import BatchChecks
from expectations.frames import with_pair_checks, with_state_checks_local
from expectations.reconcile import BOOKKEEPING as GOLD_BOOKKEEPING
from expectations.runner import Validator
from state.config import Config, on_warehouse_axis
from pipelines.gold import GOLD, Retraction, write_gold
from state.pointers import arrivals_with_source_columns
from state.batch_log import BatchLog, BatchOutcome, BatchPlan, LogTail
from state.bounds import advance, late_rows, split_late
from state.buffers import BufferUpdate, held_versions, read_sides, replacing, update_buffers
from state.changes import Applied, apply, ignored_rows, resolve
from state.checks import check_consistency
from state.engines import Data, DeltaEngine, Txn, as_frame
from state.errors import LakejoinError
from state.clock import now
from state.event_time import render, render_span
from state.progress import decide, moves, raised
from state.faults import step
from state.final import emit, state_updates
from state.phases import take, timed
from state.joiner import Projection, Side, batch_tuples, data_columns, identity_column
from state.layout import Warehouse
from state.relations import ID, TS, Relation, RelationSpec


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
    changes: dict[str, int] = field(default_factory=dict)  # change feeds' counts (state/changes.py), with gold rows retracted

    @property
    def check_seconds(self) -> float:
        """Of ``seconds``, those spent on data-quality rules: checking them, and writing their results and rows."""
        return sum(self.phases.get(phase, 0.0) for phase in ("rules", "dq_quarantine", "dq_results"))

    def describe(self) -> str:
        arrived = ", ".join(f"{count} {name.upper()}" for name, count in self.arrivals.items())
        again = " (resumed)" if self.resumed else ""
        notes = [f"{sum(self.late.values())} late"] if any(self.late.values()) else []
        notes += [f"{sum(self.evicted.values())} evicted"] if any(self.evicted.values()) else []
        notes += [f"{self.changes['retracted']} retracted"] if self.changes.get("retracted") else []
        notes += [f"{self.changes['ignored']} ignored as older"] if self.changes.get("ignored") else []
        notes += [f"{sum(self.rule_failures.values())} rule failures"] if self.rule_failures else []
        extra = "".join(f", {note}" for note in notes)
        return f"batch {self.batch_id}{again}: {arrived} arrivals, {self.pairs} pairs{extra}, {self.seconds:.2f} s"


@dataclass(frozen=True)
class RunReport:
    """What a run did: each batch it committed, in order, and the totals."""

    batches: list[BatchReport]
    interrupted: bool = False  # a follow stopped by a second signal, the batch under way abandoned
    sources: list = field(default_factory=list)  # each source table's ingest (pipelines/sources.py SourceResult)
    landed: list = field(default_factory=list)  # each file found in a landing folder (pipelines/ingest.py IngestResult)

    @property
    def refused(self) -> list:
        """The landing files refused as a whole this run (recorded in quarantine/ingest, not tried again)."""
        return [result for result in self.landed if result.refused is not None]

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

    def describe(self) -> str:
        """One line for the whole run: what it joined, what it set aside as late, what it evicted."""
        if not self.batches:
            return "nothing pending: every arrival is already joined"
        where = " (quarantine/late_arrivals)" if self.late else ""
        return f"{len(self.batches)} batches: {self.arrivals} arrivals, {self.pairs} pairs, {self.late} late{where}, {self.evicted} evicted from state"


def run(
    engine: DeltaEngine,
    warehouse: Warehouse,
    config: Config,
    progress: Callable[[BatchReport], None] = lambda _: None,
    stop: Callable[[], bool] = lambda: False,
    before_writing: Callable[[], None] = lambda: None,
) -> list[BatchReport]:
    """Process every pending arrival, batch by batch (or until ``stop`` says so, between batches), then return
    what each batch did; ``progress`` hears of each batch as it commits, ``before_writing`` is called before each
    batch's first write (the CLI records the definition there, once)."""
    engine.refresh()
    tail = check_consistency(engine, warehouse, config.pipeline)
    given = config
    log = BatchLog(engine, warehouse.batches, warehouse.app_id(config.pipeline, warehouse.batches))
    validator = Validator(engine.spark)
    reports, kind = [], None
    while True:
        started = time.perf_counter()  # a batch's seconds include planning
        take()  # and so do its phases
        with timed("planning"):
            if kind is None:  # known once bronze holds event times (an ingest may land the first during the run), then fixed
                config, kind = on_warehouse_axis(given, engine, warehouse)
            plan = None if stop() else tail.unfinished or _plan_next(engine, warehouse, config, tail)
        if plan is None:
            return reports
        checks = BatchChecks(validator, config, plan.batch_id)
        try:
            report, tail = _execute(engine, warehouse, config, kind, log, plan, checks, started, tail.unfinished is not None, before_writing)
        finally:
            checks.release()
        reports.append(report)
        progress(report)


def _plan_next(engine: DeltaEngine, warehouse: Warehouse, config: Config, tail: LogTail) -> BatchPlan | None:
    """The next prefix of the arrival order (at most ``max_batch_rows``), or None when nothing is pending; an empty
    prefix when only watermarks move (state/progress.py).

    Only arrivals of finished ingests are pending: an ingest logs its file after its bronze commit, so
    reading the ingest log before bronze's versions makes every logged arrival part of those versions,
    even while another ingest is landing rows.
    """
    pending_to = engine.max_value(warehouse.ingest_log, "seq_to") or 0
    bronze_versions = {
        rel.name: version for rel in warehouse.relations if (version := engine.version(warehouse.bronze(rel))) is not None
    }
    idle_after = {rel: seconds for rel in warehouse.relations if (seconds := config.spec(rel.name).idle_after) is not None}
    progress = decide(engine, warehouse, idle_after, tail.last_seq, now())
    if pending_to <= tail.last_seq and not moves(progress, tail.watermarks, warehouse.relations):
        return None  # nothing to join, and no watermark to move (an idle relation, declared progress)
    state_versions = {
        name: version for name, path in warehouse.buffers().items() if (version := engine.version(path)) is not None
    }
    if config.reads_changes and (gold := engine.version(warehouse.gold)) is not None:
        state_versions[GOLD] = gold  # what the batch's retractions take out of gold (pipelines/gold.py)
    return BatchPlan(
        batch_id=tail.last_batch_id + 1,
        seq_from=tail.last_seq,
        seq_to=max(tail.last_seq, min(tail.last_seq + config.max_batch_rows, pending_to)),
        bronze_versions=bronze_versions,
        state_versions=state_versions,
        watermarks=tail.watermarks,
        progress=progress,
        raised=tail.raised,
    )


def _arrivals(engine: DeltaEngine, warehouse: Warehouse, rel: Relation, spec: RelationSpec, plan: BatchPlan) -> pa.Table:
    """The plan's slice of ``rel``'s arrivals, read once and held on the driver (at most a batch). For a relation
    read from a table, bronze holds pointers: the rows' columns are read from the table's data files (a change
    feed's bronze holds its rows whole)."""
    table = None if spec.changes is not None else spec.table
    version = plan.bronze_versions.get(rel.name)
    where = f"_arrival_seq > {plan.seq_from} AND _arrival_seq <= {plan.seq_to}"
    sliced = None if version is None else engine.rows(warehouse.bronze(rel), version, where)
    if sliced is None:
        return engine.spark.createDataFrame([], f"{ID} string, {TS} bigint, _arrival_seq bigint").toArrow()
    return sliced if table is None else arrivals_with_source_columns(engine, table, sliced)


def _execute(
    engine: DeltaEngine,
    warehouse: Warehouse,
    config: Config,
    kind: str | None,
    log: BatchLog,
    plan: BatchPlan,
    checks: BatchChecks,
    started: float,
    resumed: bool,
    before_writing: Callable[[], None],
) -> tuple[BatchReport, LogTail]:
    """Compute the whole batch and check its rows against the rules, then write: plan (unless resumed),
    rule results, gold, late arrivals, state, and the commit row last. Returns what the batch did and the
    log's tail after it (this run holds the lock: nothing else appends to the log). ``config`` is on the
    event-time axis of ``kind``."""
    relations = warehouse.relations
    spec = config.join_spec
    tables = {table.relation: table for table in spec.state_tables(warehouse)}
    with timed("arrivals"):
        arrived = {rel: _arrivals(engine, warehouse, rel, config.spec(rel.name), plan) for rel in relations}
        resolved = {
            rel: resolve(arrived[rel], held_versions(engine, plan, tables[rel], arrived[rel])) for rel in relations if config.spec(rel.name).changes
        }
    screened = {
        rel: checks.screen(warehouse.name_of(warehouse.bronze(rel)), "bronze", resolved[rel].candidates if rel in resolved else rows, [ID], rel.name)
        for rel, rows in arrived.items()
    }

    def by_lateness(rel: Relation) -> Callable[[pa.Table], tuple[pa.Table, pa.Table]]:
        return lambda rows: split_late(rows, plan.watermarks.get(rel.name))

    changes = {rel: apply(resolved[rel], screened[rel], by_lateness(rel)) for rel in resolved}
    split = {rel: (changes[rel].on_time, changes[rel].late) if rel in changes else by_lateness(rel)(screened[rel]) for rel in relations}
    on_time = {rel: parts[0] for rel, parts in split.items()}
    late = {rel: parts[1] for rel, parts in split.items()}
    # Local relations: Spark knows their size and broadcasts them into the joins.
    sides = read_sides(
        engine, plan, list(tables.values()), {rel: as_frame(engine.spark, t) for rel, t in on_time.items()}, {rel: c.replaced for rel, c in changes.items()}
    )
    projection = Projection({rel.name: data_columns(arrived[rel].column_names) for rel in relations}, config.select)
    after, raised_why = raised(
        advance(plan.watermarks, on_time, config.allowed_lateness), plan.watermarks, plan.progress, relations, plan.raised,
        lambda value: render(value, kind) or str(value),
    )
    tuples = _pairs(sides, config.join_condition, projection, plan)  # a plan: an as-of join never runs it
    every_one = all(rel.name in plan.bronze_versions for rel in relations)  # else no tuples, and no record final yet
    with timed("final"):
        emitted = emit(spec, sides, tuples, projection, after if every_one else {})
    gold = emitted.rows.withColumns({"batch_id": F.lit(plan.batch_id), "produced_at": F.lit(now())})
    members = spec.kind.gold_relations(relations)
    if every_one:
        gold = with_pair_checks(
            gold, config.join_condition, projection, members, lambda: _members(sides), spec.kind.preserves(relations), spec.kind.owned_by(relations)
        )
    with timed("join"):
        pairs = _to_driver_if_small(engine, gold, config.driver_rows)
    gold_rows = checks.screen(warehouse.name_of(warehouse.gold), "gold", pairs, [identity_column(rel, ID) for rel in members])
    stored = {rel: changes[rel].state_rows() if rel in changes else rows for rel, rows in on_time.items()}
    updates = {
        name: replace(update, rows=checks.screen(warehouse.name_of(update.table.path), update.table.kind, _state_rows(update, late), [ID]))
        for name, update in state_updates(spec, warehouse, plan, stored, (plan.watermarks, after), emitted).items()
    }
    updates = replacing(updates, [rel for rel, applied in changes.items() if applied.resolved.stored])
    retracting = Retraction.of(
        engine, warehouse, plan, {rel: c.retracted for rel, c in changes.items()}, spec.kind.row_keys(members), lambda rows: _to_driver_if_small(engine, rows, config.driver_rows)
    )
    checks.raise_if_failed()

    def txn(path: str) -> Txn:
        return Txn(warehouse.app_id(config.pipeline, path), plan.batch_id)

    before_writing()
    if not resumed:
        with step("plan"):
            log.record_plan(plan)
    # Between the plan and the commit row, every output is an idempotent commit to a table of its own, so they
    # run at once (a commit mostly waits on the Delta log and the scheduler); a crash leaves any subset of them
    # committed, and the resumed batch writes the rest.
    with ThreadPoolExecutor(max_workers=3) as pool:
        recorded = pool.submit(_record_checks, engine, warehouse, checks, txn)
        gold_written = pool.submit(write_gold, engine, warehouse, plan, gold_rows, retracting, txn)
        ignored = [ignored_rows(applied.resolved, rel.name, plan.batch_id) for rel, applied in changes.items() if applied.resolved.ignored.num_rows]
        late_recorded = pool.submit(_quarantine_late, engine, warehouse, config, kind, plan, late, ignored, txn(warehouse.late_arrivals))
        evicted = update_buffers(engine, plan, updates, txn)
        recorded.result()
        late_recorded.result()
        written = gold_written.result()
    outcome = BatchOutcome(
        arrivals={rel.name: arrived[rel].num_rows for rel in relations},
        pairs=written,
        changes=_change_counts(changes, retracting),
        seconds=time.perf_counter() - started,
        late={rel.name: table.num_rows for rel, table in late.items()},
        evicted=evicted,
        watermarks=after,
        raised=raised_why,
    )
    with step("commit"):
        log.record_commit(plan, outcome)
    report = BatchReport(
        plan.batch_id, outcome.arrivals, written, outcome.seconds, resumed, outcome.late, outcome.evicted, checks.summary(), take(), outcome.changes
    )
    return report, LogTail(plan.batch_id, plan.seq_to, None, plan, after, raised_why)


def _change_counts(changes: dict[Relation, Applied], retraction: Retraction) -> dict[str, int]:
    """What the batch did with change feeds' rows, summed over relations, and the gold rows it retracted."""
    counts: dict[str, int] = {}
    for applied in changes.values():
        for name, count in applied.counts().items():
            counts[name] = counts.get(name, 0) + count
    if changes:
        counts["retracted"] = retraction.count
    return counts


def _to_driver_if_small(engine: DeltaEngine, pairs: DataFrame, limit: int) -> Data:
    """A batch's pairs as Arrow when at most ``limit`` (one Spark job; checks and writes are quickest on the driver),
    else the DataFrame itself, checked and written where Spark computes it: a batch's pairs can outgrow the driver.
    An engine that writes from the driver takes them there in any case."""
    if engine.driver_writes:
        return pairs.toArrow()
    head = pairs.limit(limit + 1).toArrow()
    return head if head.num_rows <= limit else pairs


def _state_rows(update: BufferUpdate, late: dict[Relation, pa.Table]) -> pa.Table:
    """The rows a state table gains, with the columns its rules check (expectations/frames.py)."""
    return with_state_checks_local(update.rows, late[update.table.relation], update.eviction)


def _record_checks(engine: DeltaEngine, warehouse: Warehouse, checks: BatchChecks, txn: Callable[[str], Txn]) -> None:
    """Rule results and quarantined rows, each written once per batch (the app transaction makes a replay a no-op)."""
    quarantined = checks.quarantine_rows()
    with step("dq_quarantine"):
        if quarantined is not None:
            engine.append(warehouse.dq_quarantine, quarantined, txn(warehouse.dq_quarantine))
    with step("dq_results"):
        results = checks.result_rows()
        if results.num_rows:
            engine.append(warehouse.dq_results, results, txn(warehouse.dq_results))


def _quarantine_late(
    engine: DeltaEngine, warehouse: Warehouse, config: Config, kind: str | None, plan: BatchPlan, late: dict[Relation, pa.Table],
    ignored: list[pa.Table], txn: Txn,
) -> None:
    """Late arrivals are kept in ``quarantine/late_arrivals``, never joined and never dropped, and so are the
    changes a batch ignored as older (``ignored``, state/changes.py)."""
    rows = [
        late_rows(
            table, rel, plan.watermarks.get(rel.name), None if (span := config.lateness(rel.name)) is None else render_span(span, kind),  # type: ignore[arg-type] - on the axis
            config.spec(rel.name).event_time, kind, plan.batch_id, plan.raised.get(rel.name),
        )
        for rel, table in late.items()
        if table.num_rows
    ] + ignored
    with step("late_arrivals"):
        if rows:
            engine.append(warehouse.late_arrivals, pa.concat_tables(rows, promote_options="permissive"), txn)


def _pairs(sides: list[Side], predicate: str, projection: Projection, plan: BatchPlan) -> DataFrame:
    """The batch's pairs; none while some relation has never had a record (nothing to join with yet).

    Spark analyses the join as it is built, so a predicate or a ``select`` that does not resolve fails here,
    before any write."""
    if not all(side.relation.name in plan.bronze_versions for side in sides):
        return batch_tuples([_empty(side) for side in sides], "true", Projection({}))
    try:
        pairs = batch_tuples(sides, predicate, projection)
        named = pairs.columns[len(sides) * 2 : -1]  # the projection's own columns, between the identity and the owner
    except AnalysisException as exc:  # analysed here in a classic session, at .columns as a Spark Connect client
        columns = "; ".join(f"{side.relation.name}: {', '.join(data_columns(side.arrivals.columns))}" for side in sides)
        reason = str(exc).strip().splitlines()[0]
        what = f"join predicate {predicate!r}" if projection.select is None else f"join predicate {predicate!r} or select {list(projection.select)}"
        raise LakejoinError(f"{what} does not resolve ({reason}); columns are {columns}") from exc
    clashes = sorted(name for name in named if name.startswith("_") or name in (*GOLD_BOOKKEEPING, "owner"))
    if clashes:
        raise LakejoinError(
            f"select gives gold a column named {clashes[0]!r}, a name lakejoin keeps for itself (owner, batch_id, "
            "produced_at, names starting with '_'): alias it, e.g. 's.amount AS paid'"
        )
    return pairs


def _members(sides: list[Side]) -> dict[Relation, DataFrame]:
    """Every record a batch's pairs can have, each once: a relation's arrivals, its store, and its records in the
    other relations' probe buffers, at the plan's versions (not all of bronze: the batch's cost stays its own)."""
    members = {}
    for side in sides:
        frames = [side.arrivals, side.store, *(other.probes[side.relation] for other in sides if other is not side)]
        members[side.relation] = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames).dropDuplicates([ID])
    return members


def _empty(side: Side) -> Side:
    return Side(side.relation, side.arrivals.limit(0), side.store.limit(0), {rel: probes.limit(0) for rel, probes in side.probes.items()})
