"""Landing a batch's files: every file the batch takes from a relation's landing folder read in one pass, typed and
classified together, appended to bronze under the batch's transaction; the batch then reads its arrivals back from
bronze, as it reads those ``ingest`` landed before it.

Files of one kind are read together (JSON Lines; CSV of one header; Parquet of one schema), so a batch costs a few
Spark jobs whatever its number of files, and the rows' places in the arrival order come from the plan (a file's first
place, plus the line). Rows are checked as ``ingest`` checks them (pipelines/classify.py): a row that breaks its
relation's mapping or types is quarantined with its file and line, and a copy of a record the state holds, or of one
earlier in the batch, adds nothing. A file that cannot be read as a whole is left out on its own: for good when its
form is wrong (the batch records it, so it is not read again), for now when Spark could not read it (it is recorded
in quarantine/ingest as not lasting, so a resumed batch leaves it out too, and a later batch tries it again).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import reduce
from urllib.parse import quote

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from pipelines.classify import configured_types, outcomes, typed
from pipelines.ingest import UNREADABLE, Provenance, bronze_rows, quarantine_rows, refusal, refusal_rows
from pipelines.parse import csv_header, format_of, parse_files
from state.batch_log import BatchPlan, LandedFile
from state.clock import now
from state.config import Config
from state.engines import DeltaEngine, Txn, as_frame
from state.engines.base import DeltaReader
from state.errors import FileRefused
from state.faults import step
from state.layout import Warehouse
from state.relations import Relation

OUTCOMES = ("accepted", "quarantined", "duplicate")


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
    engine: DeltaEngine, warehouse: Warehouse, config: Config, plan: BatchPlan, known: Callable[[Relation], DataFrame | None], txn: Callable[[str], Txn]
) -> list[Landing]:
    """Land the plan's files of every relation (the bronze commits at once), then set aside, in one commit, the rows
    they quarantine and the files refused. ``known``: a relation's records already held (``_id``, ``_content_hash``)."""
    retried = retried_files(engine, warehouse, plan.batch_id) if plan.files else {}
    relations = [rel for rel in warehouse.relations if plan.landing(rel.name)]
    with ThreadPoolExecutor(max_workers=max(1, len(relations))) as pool:
        futures = [pool.submit(_land, engine, warehouse, config, plan, rel, known(rel), retried, txn) for rel in relations]
        landed = [future.result() for future in futures]
    refused = [file for file in plan.files if file.refused is not None] + [file for landing, _ in landed for file in landing.files if file.refused is not None]
    parts = [rows for _, rows in landed if rows is not None]
    if refused:
        table = refusal_rows([(file.relation, file.path, file.refused, True) for file in refused], batch_tag(plan.batch_id), now())  # type: ignore[misc] - refused
        parts.append(as_frame(engine.spark, table))
    with step("quarantine"):
        if parts:
            engine.append(warehouse.quarantine, reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts), txn(warehouse.quarantine))
    outside = [file for file in plan.files if not file.lands]
    return [replace(landing, files=(*landing.files, *[file for file in outside if file.relation == landing.relation])) for landing, _ in landed] + [
        Landing(rel.name, plan.batch_id, 0, 0, 0, tuple(file for file in outside if file.relation == rel.name))
        for rel in warehouse.relations
        if rel not in relations and any(file.relation == rel.name for file in outside)
    ]


def _land(
    engine: DeltaEngine,
    warehouse: Warehouse,
    config: Config,
    plan: BatchPlan,
    rel: Relation,
    known: DataFrame | None,
    retried: dict[str, str],
    txn: Callable[[str], Txn],
) -> tuple[Landing, DataFrame | None]:
    """One relation's files to bronze: the landing, and its quarantined rows (None when none). A file Spark fails to
    read while the rows are written is recorded as refused for now, and the rest written again without it."""
    files = [file for file in plan.landing(rel.name) if file.path not in retried]
    now_refused = tuple(FileRefused(reason, lasting=False) for path, reason in retried.items() if any(file.path == path for file in plan.landing(rel.name)))
    typed_rows, refused = _typed(engine, warehouse, config, rel, files)
    kept = [file for file in files if file.path not in refused]
    source = Provenance(rel, "", batch_tag(plan.batch_id), now(), F.col("_source_file"), F.col("_source_line"), F.lit(None).cast("long"), named=F.col("_source_file"))
    lasting = tuple(replace(file, refused=str(refused[file.path])) for file in files if file.path in refused and refused[file.path].lasting)
    for_now = tuple(refused[file.path] for file in files if file.path in refused and not refused[file.path].lasting)
    if typed_rows is None:
        return Landing(rel.name, plan.batch_id, 0, 0, 0, lasting, now_refused + for_now), None
    classified = outcomes(typed_rows, known, config.spec(rel.name).changes is not None)
    metrics = [*[F.count(F.when(F.col("_outcome") == outcome, 1)).alias(outcome) for outcome in OUTCOMES], F.collect_set(F.when(F.col("_outcome") == "quarantined", F.col("_source_file"))).alias("bad")]
    observation = Observation()
    try:
        with step(f"bronze_{rel.name}"):
            written = engine.append(warehouse.bronze(rel), bronze_rows(classified.observe(observation, *metrics), source, F.col("_arrival_seq")), txn(warehouse.bronze(rel)))
    except UNREADABLE as exc:
        failed = next((file for file in kept if _names(exc, file.path)), None)
        if failed is None:
            raise
        reason = str(refusal(failed.path, exc))
        engine.append(warehouse.quarantine, refusal_rows([(rel.name, failed.path, reason, False)], batch_tag(plan.batch_id), now()), Txn(f"{warehouse.app_id(config.pipeline, warehouse.quarantine)}:{failed.sha256}", plan.batch_id))
        return _land(engine, warehouse, config, plan, rel, known, {**retried, failed.path: reason}, txn)
    counts = observation.get if written is not None else classified.agg(*metrics).first().asDict()
    quarantined = None
    if counts["quarantined"]:
        quarantined = quarantine_rows(classified.where(F.col("_source_file").isin(*counts["bad"])), source)
    return Landing(rel.name, plan.batch_id, counts["accepted"], counts["quarantined"], counts["duplicate"], (*kept, *lasting), now_refused + for_now), quarantined


def _typed(engine: DeltaEngine, warehouse: Warehouse, config: Config, rel: Relation, files: list[LandedFile]) -> tuple[DataFrame | None, dict[str, FileRefused]]:
    """``files`` parsed and typed, kind by kind (each kind's types settled by bronze's, then the earlier kinds'): their
    rows in one frame, each at its place in the arrival order (None when none is left), and the files refused. A kind
    of several files refused as a whole is typed again file by file, so only the files at fault are refused."""
    schema = engine.schema(warehouse.bronze(rel))
    settled: dict[str, DataType] = {} if schema is None else {field.name: field.dataType for field in schema.fields}
    configured = configured_types(rel, config.spec(rel.name))
    frames, refused = [], {}
    pending = _kinds(files)
    while pending:
        group = pending.pop(0)
        try:
            parsed = parse_files(engine.spark, [file.path for file in group], format_of(group[0].path))
            first = F.create_map(*[F.lit(value) for file in group for value in (file.path, file.first)])
            placed = replace(parsed, frame=parsed.frame.withColumn("_arrival_seq", first[F.col("_source_file")] + F.col("_source_line")))
            frame, types = typed(engine, warehouse, rel, config.relations, placed, configured, settled)
        except UNREADABLE as exc:
            if len(group) > 1:
                pending = [[file] for file in group] + pending
            else:
                refused[group[0].path] = refusal(group[0].path, exc)
            continue
        frames.append(frame)
        settled = {**types, **settled}
    if not frames:
        return None, refused
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames), refused


def _kinds(files: list[LandedFile]) -> list[list[LandedFile]]:
    """The files by what reads them together: JSON Lines; CSV by header; Parquet by schema (in the order of each
    kind's first file)."""
    kinds: dict[tuple, list[LandedFile]] = {}
    for file in files:
        fmt = format_of(file.path)
        key = (fmt, csv_header(file.path) if fmt == "csv" else str(pq.read_schema(file.path)) if fmt == "parquet" else None)
        kinds.setdefault(key, []).append(file)
    return list(kinds.values())


def _names(error: BaseException, path: str) -> bool:
    """Whether Spark's ``error`` names the file at ``path`` (as it names files: a URI, percent-encoded)."""
    text = str(error)
    return path in text or quote(os.path.abspath(path)) in text


def retried_files(engine: DeltaReader, warehouse: Warehouse, batch_id: int) -> dict[str, str]:
    """The files batch ``batch_id`` refused for now in a run before this one (it died after): file -> why."""
    schema = engine.schema(warehouse.quarantine)
    if schema is None or "lasting" not in schema.fieldNames():
        return {}
    rows = engine.rows(warehouse.quarantine, where=f"ingest_id = '{batch_tag(batch_id)}' AND lasting = false")
    return dict(zip(rows.column("source_file").to_pylist(), rows.column("reason").to_pylist()))  # type: ignore[union-attr] - the table exists
