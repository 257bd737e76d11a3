"""Planning a batch: what it reads, fixed before its first write and carried by every write after.

A batch takes the arrivals ingested and not yet joined (a prefix of the arrival order, at most ``max_batch_rows``)
and, once those all fit, the files new in the relations' landing folders, in name order, while the batch stays within
``max_batch_rows``, ``max_batch_files`` and ``max_batch_bytes`` (one file at least). Each file's rows get places in the
arrival order before they are read: after every place taken, as many as the file can hold (pipelines/bronze/landing.py).
Nothing here runs a Spark job: the driver reads logs, lists folders and reads each new file once, for its digest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.batch.context import Run
from pipelines.bronze.landing import Known, found_files
from pipelines.bronze.write import last_arrival_seq
from state.clock import now
from state.errors import FileRefused
from state.log.batch_log import BatchPlan, LandedFile, LogTail
from state.log.progress import decide, moves


@dataclass(frozen=True)
class Planned:
    """The next batch's plan (None: nothing to do), and the landing files it leaves for a later try (read failures)."""

    plan: BatchPlan | None
    retried: list[FileRefused] = field(default_factory=list)


def plan_next(run: Run, tail: LogTail, known: Known) -> Planned:
    """The batch after ``tail``, or no plan when nothing is pending, no file landed and no watermark would move.

    Only arrivals of finished ingests are pending: an ingest logs its file after its bronze commit, so reading the
    ingest log before bronze's versions makes every logged arrival part of those versions."""
    tables, config = run.tables, run.config
    pending_to = max(tail.last_seq, tables.ingest_log.max_value("seq_to") or 0)
    idle_after = {rel: seconds for rel in run.relations if (seconds := config.spec(rel.name).idle_after) is not None}
    progress = decide(tables, idle_after, tail.last_seq, now())
    ingested_to = max(tail.last_seq, min(tail.last_seq + config.max_batch_rows, pending_to))
    files, retried = [], []
    if run.landings and ingested_to == pending_to:  # files land once the ingested arrivals before them fit in a batch
        files, retried = _files(run, known, max(0, pending_to - tail.last_seq))
    places = [file for file in files if file.lands]
    if ingested_to <= tail.last_seq and not files and not moves(progress, tail.watermarks, run.relations):
        return Planned(None, retried)  # nothing to join, and no watermark to move (an idle relation, declared progress)
    bronze_versions = {  # looked up only for a plan: with nothing pending, a run's last look costs no bronze look-up
        rel.name: version for rel, bronze in tables.bronze.items() if (version := bronze.version()) is not None
    }
    plan = BatchPlan(
        batch_id=tail.last_batch_id + 1,
        seq_from=tail.last_seq,
        seq_to=max((file.first + file.bound for file in places), default=ingested_to),
        bronze_versions=bronze_versions,
        state_versions=run.state_versions(),
        watermarks=tail.watermarks,
        progress=progress,
        raised=tail.raised,
        files=tuple(files),
        ingested_to=ingested_to if files else None,
    )
    return Planned(plan, retried)


def _files(run: Run, known: Known, ingested: int) -> tuple[list[LandedFile], list[FileRefused]]:
    """The landing files the batch takes, each placed in the arrival order after every place taken; and those that
    could not be read now. Files refused for good, and copies of files landed before, come along without places: the
    batch records them, so they are not looked at again."""
    config = run.config
    place = last_arrival_seq(run.tables)
    taken: list[LandedFile] = []
    retried: list[FileRefused] = []
    rows, size = ingested, 0
    for found in found_files(run.landings, known):
        if isinstance(found, FileRefused):
            retried.append(found)
            continue
        copy = known.digests.get(found.relation, {}).get(found.sha256)
        if found.refused is not None or copy is not None:
            taken.append(
                LandedFile(
                    found.relation,
                    found.path,
                    found.sha256,
                    found.bytes,
                    place,
                    0,
                    None if found.refused is None else str(found.refused),
                    copy,
                )
            )
            known.add(found.relation, found.path, found.sha256, found.refused is not None)
            continue
        landing = [file for file in taken if file.lands]
        full = (
            rows + found.rows > config.max_batch_rows
            or size + found.bytes > config.max_batch_bytes
            or len(landing) >= config.max_batch_files
        )
        if full and (landing or ingested):
            break
        taken.append(LandedFile(found.relation, found.path, found.sha256, found.bytes, place, found.rows))
        known.add(found.relation, found.path, found.sha256, False)
        place, rows, size = place + found.rows, rows + found.rows, size + found.bytes
    return taken, retried
