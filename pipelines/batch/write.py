"""Writing a batch: gold, the late arrivals and every state table at once, then the rows its rules set aside, each
under the batch's transaction (carrying its plan), each table's rows checked by its rules inside the job that writes
them (expectations/batch.py): the job counts the rules' failures as it writes (an observation), a ``fail`` rule's row
stops it before it commits. The log row comes last (pipelines/silver.py): a batch is committed once it is logged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from expectations.batch import TableChecks
from pipelines.batch.context import Batch
from pipelines.batch.emit import Outputs
from pipelines.gold import CHANGE, write_gold
from state.engines.table import Writer
from state.faults import step
from state.frames import union_by_name
from state.join.buffers import update_buffers
from state.log.batch_log import BatchPlan, RuleCount

R = TypeVar("R")


@dataclass(frozen=True)
class Written:
    """What the batch's writes did."""

    pairs: int  # gold rows added
    retracted: int  # gold rows taken out (change feeds)
    evicted: dict[str, int]  # per state table
    rules: list[RuleCount]  # the gold and state rules' results


@dataclass
class Checking:
    """The rules of the tables a batch writes, as the writes run them (from several threads)."""

    batch_id: int
    results: list[RuleCount] = field(default_factory=list)
    set_aside: list[DataFrame] = field(default_factory=list)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def write(self, checks: TableChecks, rows: DataFrame, write: Callable[[DataFrame], R | None]) -> R | None:
        """``write`` of what ``checks`` keep of ``rows``; the rules' results from the write's own job (or, for a write
        the run this one resumes had done, from a job of their own)."""
        flagged = checks.flagged(rows)
        metrics = checks.metrics()
        observation = Observation()
        observed = flagged.observe(observation, *metrics)
        try:
            done = write(checks.written(observed))
        except Exception as exc:
            if checks.broke(exc):
                raise checks.failure(flagged, self.batch_id, written=True) from None  # type: ignore[misc]
            raise
        counts = observation.get if done is not None else flagged.agg(*metrics).first().asDict()
        results = checks.results(flagged, counts)
        aside = checks.set_aside(flagged, results, self.batch_id)
        with self._guard:
            self.results += results
            if aside is not None:
                self.set_aside.append(aside)
        return done


def write(batch: Batch, outputs: Outputs) -> Written:
    """Every write of the batch but its log row. They are commits to tables of their own, each idempotent under its
    transaction, so they run at once (a commit mostly waits on the Delta log and the scheduler): a crash leaves any
    subset of them committed, and the resumed batch writes the rest."""
    checking = Checking(batch.plan.batch_id)
    tables, plan = batch.tables, batch.plan
    gold_writes = (batch.writer(tables.gold), batch.writer(tables.gold_changes))
    with ThreadPoolExecutor(max_workers=2) as pool:
        gold = pool.submit(_gold, *gold_writes, plan, outputs, checking)
        late = pool.submit(_late, batch.writer(tables.late_arrivals), outputs.late)
        evicted = update_buffers(
            outputs.updates,
            lambda table: batch.writer(tables.state[table.relation]),
            plan.state_versions,
            lambda table, rows, merge: checking.write(outputs.state_checks[table.name], rows, merge),
        )
        late.result()
        pairs, retracted = gold.result()
    aside = [frame for frame in (outputs.set_aside, *checking.set_aside) if frame is not None]
    with step("dq_quarantine"):
        if aside:
            batch.writer(tables.dq_quarantine).append(union_by_name(aside))
    return Written(pairs, retracted, evicted, checking.results)


def _gold(gold: Writer, changes: Writer, plan: BatchPlan, outputs: Outputs, checking: Checking) -> tuple[int, int]:
    """Gold's rows added and retracted (counted again when the run this one resumes wrote them)."""
    done = checking.write(
        outputs.gold_checks, outputs.gold, lambda rows: write_gold(gold, changes, plan, rows, outputs.retraction)
    )
    if done is not None:
        return done
    this_batch = f"batch_id = {plan.batch_id}"
    added = gold.table.read(where=this_batch).count()
    retracted = changes.table.read(where=this_batch) if outputs.retraction.tracked else None
    return added, 0 if retracted is None else retracted.where(F.col(CHANGE) == "-").count()


def _late(late_arrivals: Writer, rows: DataFrame | None) -> None:
    """Late arrivals (and changes ignored as older) kept in ``quarantine/late_arrivals``, never joined, never
    dropped."""
    with step("late_arrivals"):
        if rows is not None:
            late_arrivals.append(rows)
