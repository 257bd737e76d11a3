"""Landing a batch's files: every file the batch takes from a relation's landing folder landed through the one road
into bronze (pipelines/bronze/write.py), relation by relation at once, under the batch's transaction; the batch then
reads its arrivals back from bronze, as it reads those ``ingest`` landed before it.

Each file's places in the arrival order come from the plan (a file's first place, plus the line), and its rows are
checked against the records the state holds and those ingested before the batch. A file that cannot be read as a whole
is left out on its own: for good when its form is wrong (the batch records it, so it is not read again), for now when
Spark could not read it (it is recorded in quarantine/ingest as not lasting before the rest is written, so a resumed
batch leaves it out too, and a later batch tries it again).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from pyspark.sql import DataFrame

from pipelines.batch.context import Batch
from pipelines.bronze.write import Landed, Lander, Placed, Watch, land_files, quarantine, refusal_rows
from state.clock import now
from state.engines.table import Table
from state.errors import FileRefused
from state.join.relations import Relation
from state.log.batch_log import BatchPlan, LandedFile


@dataclass(frozen=True)
class Landing:
    """What a batch landed from one relation's files."""

    relation: str
    batch_id: int
    landed: int
    quarantined: int
    duplicates: int
    files: tuple[LandedFile, ...]  # the files landed, and those refused for good (so as not to be read again)
    retried: tuple[FileRefused, ...] = ()  # refused for now: a later batch tries them again
    watched: dict | None = (
        None  # what the bronze write counted for the batch's measure (pipelines/batch/measure.py ``watch``)
    )

    def describe(self) -> str:
        taken = sum(file.lands for file in self.files)
        return (
            f"batch {self.batch_id}: {taken} files to bronze/{self.relation}: {self.landed:,} rows, "
            f"{self.quarantined:,} quarantined, {self.duplicates:,} duplicates skipped"
        )


def batch_tag(batch_id: int) -> str:
    """The ``_ingest_id`` of the rows a batch lands: the batch names them."""
    return f"batch {batch_id}"


def land(
    batch: Batch, known: Callable[[Relation], DataFrame | None], watch: Callable[[Relation, DataFrame], Watch | None]
) -> list[Landing]:
    """Land the plan's files of every relation (the bronze commits at once), then set aside, in one commit, the rows
    they quarantine and the files refused. ``known``: a relation's records already held (``held_digests``); ``watch``:
    what else each bronze write counts."""
    plan, table = batch.plan, batch.tables.quarantine
    retried = retried_files(table, plan.batch_id) if plan.files else {}

    def left_out(rel: Relation, path: str, reason: str) -> None:
        """A file Spark failed to read, recorded before the rest is written: a resumed batch leaves it out too."""
        sha256 = next(file.sha256 for file in plan.landing(rel.name) if file.path == path)
        rows = refusal_rows([(rel.name, path, reason, False)], batch_tag(plan.batch_id), now())
        quarantine(table.writer(table.commit(plan.batch_id, part=sha256)), [rows])

    lander = Lander(
        batch.engine,
        batch.run.warehouse,
        batch.config.relations,
        batch_tag(plan.batch_id),
        now(),
        known,
        lambda rel: batch.writer(batch.tables.bronze[rel]),
        left_out,
        watch,
    )
    relations = [rel for rel in batch.relations if plan.landing(rel.name)]
    with ThreadPoolExecutor(max_workers=max(1, len(relations))) as pool:
        futures = [pool.submit(_land, lander, plan, rel, retried) for rel in relations]
        landed = [future.result() for future in futures]
    refused = [file for file in plan.files if file.refused is not None] + [
        file for landing, _ in landed for file in landing.files if file.refused is not None
    ]
    parts = [rows for _, rows in landed if rows is not None]
    if refused:
        refused_rows = refusal_rows(
            [(file.relation, file.path, file.refused, True) for file in refused], batch_tag(plan.batch_id), now()
        )  # type: ignore[misc] - refused
        parts.append(refused_rows)
    quarantine(batch.writer(table), parts)
    outside = [file for file in plan.files if not file.lands]
    return [
        replace(landing, files=(*landing.files, *[file for file in outside if file.relation == landing.relation]))
        for landing, _ in landed
    ] + [
        Landing(rel.name, plan.batch_id, 0, 0, 0, tuple(file for file in outside if file.relation == rel.name))
        for rel in batch.relations
        if rel not in relations and any(file.relation == rel.name for file in outside)
    ]


def _land(lander: Lander, plan: BatchPlan, rel: Relation, retried: dict[str, str]) -> tuple[Landing, DataFrame | None]:
    """One relation's files to bronze: the landing, and its quarantined rows (None when none). Files a run before this
    one refused for now are left out (their refusal is recorded)."""
    files = [file for file in plan.landing(rel.name) if file.path not in retried]
    before = tuple(
        FileRefused(reason, lasting=False)
        for path, reason in retried.items()
        if any(file.path == path for file in plan.landing(rel.name))
    )
    landed: Landed = land_files(
        lander, rel, [Placed(file.path, file.first, file.bound) for file in files], by_input=False
    )
    total = landed.total
    lasting = tuple(
        replace(file, refused=str(landed.refused[file.path]))
        for file in files
        if file.path in landed.refused and landed.refused[file.path].lasting
    )
    for_now = tuple(why for why in landed.refused.values() if not why.lasting)
    kept = tuple(file for file in files if file.path not in landed.refused)
    landing = Landing(
        rel.name,
        plan.batch_id,
        total.landed,
        total.quarantined,
        total.duplicates,
        (*kept, *lasting),
        before + for_now,
        landed.watched,
    )
    return landing, landed.quarantined


def retried_files(quarantined: Table, batch_id: int) -> dict[str, str]:
    """The files batch ``batch_id`` refused for now in a run before this one (it died after): file -> why."""
    engine, path = quarantined.engine, quarantined.path
    schema = engine.schema(path)
    if schema is None or "lasting" not in schema.fieldNames():
        return {}
    rows = engine.rows(path, where=f"ingest_id = '{batch_tag(batch_id)}' AND lasting = false")
    files, reasons = rows.column("source_file"), rows.column("reason")  # type: ignore[union-attr] - the table exists
    return dict(zip(files.to_pylist(), reasons.to_pylist()))
