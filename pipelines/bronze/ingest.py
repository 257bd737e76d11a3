"""The calls that put records into bronze before a batch joins them: files given to ``ingest`` (``lakejoin ingest``,
``Pipeline.ingest``, a landing folder's new files through ``ingest --landing``), and a DataFrame or a stream's
micro-batch (``Pipeline.ingest``, ``foreach_batch``).

A call is one landing of its relation (pipelines/bronze/write.py): its inputs placed after every place taken, parsed,
typed and classified together and appended to bronze in one commit; the rows they set aside (and, from a landing folder,
the files refused for good) in one quarantine commit; then one commit of the ingest log, a row per input with its
content's SHA-256 and its places: last, so until it lands a run does not see these arrivals. An input whose content was
ingested before adds nothing, and a file refused as a whole is reported alone while the others land.

A call that dies after its bronze commit and before its log is tried again whole: its rows in bronze are found as
duplicates of records held (and the places its first try took stay covered by the retry's log row), and its
quarantine commit carries an application transaction named by the call's inputs, which the retry finds recorded.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.bronze.landing import Found, default_checkpoint, examined, known_files, listed, on_databricks, readable
from pipelines.bronze.parse import counted, parse_frame, stored_columns
from pipelines.bronze.write import (
    INGESTED_AT,
    Landed,
    Lander,
    Placed,
    Tally,
    land_files,
    land_rows,
    last_arrival_seq,
    quarantine,
    refusal,
    refusal_rows,
    require_files,
)
from pipelines.spark import held
from state.engines import Commit, DeltaEngine, as_frame
from state.engines.table import Tables, table_in
from state.errors import FileRefused
from state.faults import step
from state.join.relations import Relation, RelationSpec, default_specs
from state.layout import Warehouse
from state.names import column, literal

# A DataFrame's rows are numbered in this column while they are parsed (a user's column may not start with '_').
FRAME_ROW = "_frame_row"
# At most this many files land in one pass (one bronze commit): each pass counts its files' rows one by one.
FILES_PER_LANDING = 500

INGEST_LOG_SCHEMA = pa.schema(
    [
        ("ingest_id", pa.string()),
        ("relation", pa.string()),
        ("source_file", pa.string()),
        ("sha256", pa.string()),
        ("rows_landed", pa.int64()),
        ("rows_quarantined", pa.int64()),
        ("rows_duplicate", pa.int64()),
        ("seq_from", pa.int64()),  # the input's places: seq_from to seq_to (empty for a refused file)
        ("seq_to", pa.int64()),
        ("ingested_at", INGESTED_AT),
        ("refused", pa.string()),  # why a landing file was refused as a whole (or a source table's version skipped)
        ("source_version", pa.int64()),  # a source table's last version this ingest covers; null for a file
        ("source_table_id", pa.string()),  # that table's identity (Delta metadata id); null for a file
    ]
)


@dataclass(frozen=True)
class IngestResult:
    file: str
    relation: str
    landed: int = 0
    quarantined: int = 0
    duplicates: int = 0
    already_ingested: bool = False
    already_refused: bool = False  # a landing file refused before: skipped, its refusal is recorded
    refused: str | None = None  # why the file was refused as a whole (it landed nothing)
    recorded: bool = False  # the refusal is in quarantine/ingest, so the file is not tried again

    def describe(self) -> str:
        if self.already_refused:
            return f"{self.file}: refused before (quarantine/ingest says why), skipped"
        if self.refused is not None:
            then = "recorded in quarantine/ingest and not tried again" if self.recorded else "nothing of it was written"
            return f"{self.refused}; {then}"
        if self.already_ingested:
            return f"{self.file}: already ingested into bronze/{self.relation}, nothing added"
        return (
            f"{self.file}: {self.landed} rows to bronze/{self.relation}, "
            f"{self.quarantined} quarantined, {self.duplicates} duplicates skipped"
        )


def ingest_files(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    files: Sequence[str],
    specs: dict[str, RelationSpec] | None = None,
    progress: Callable[[IngestResult], None] = lambda _: None,
    landing: bool = False,
) -> list[IngestResult]:
    """Ingest ``files`` into ``rel``'s bronze, their rows arriving in the order given, line by line; a result per file,
    in that order, each also handed to ``progress``. ``specs`` maps every relation to its columns (config
    ``relations``; default: id, ts, key). ``landing``: the files come from a landing folder, where nobody passes a file
    again by hand, so a file refused for its form is recorded (in quarantine/ingest and the ingest log) and skipped
    from then on."""
    if not landing:  # a landing folder's files were listed: one gone since is refused for now, like one unreadable
        require_files(files)
    results: list[IngestResult] = []
    for start in range(0, len(files), FILES_PER_LANDING):
        results += _ingest_files(
            engine, warehouse, rel, files[start : start + FILES_PER_LANDING], specs or default_specs(), landing
        )
    for result in results:
        progress(result)
    return results


def _ingest_files(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    files: Sequence[str],
    specs: dict[str, RelationSpec],
    landing: bool,
) -> list[IngestResult]:
    """One call's files: each read once on the driver for its digest and lines, the new ones landed together."""
    examined = [_examined(rel, file) for file in files]
    logged = _logged(engine, warehouse, rel, [item.sha256 for item in examined if isinstance(item, Found)])
    results: dict[int, IngestResult] = {}
    taken: dict[int, Found] = {}  # the files this call lands, or records as refused for good (from a landing folder)
    for index, (file, item) in enumerate(zip(files, examined)):
        skipped = _skipped(file, rel, item, logged, {found.sha256 for found in taken.values()}, landing)
        if skipped is None:
            taken[index] = item  # type: ignore[assignment] - not skipped: examined
        else:
            results[index] = skipped
    lander = Lander.for_call(engine, warehouse, specs)
    start = last_arrival_seq(Tables.of(engine, warehouse))
    placed = _placed(start, {index: item for index, item in taken.items() if item.refused is None}, files)
    landed = land_files(lander, rel, list(placed.values())) if placed else Landed(rel.name)
    refused = {**{item.path: item.refused for item in taken.values() if item.refused is not None}, **landed.refused}
    recorded = {path: str(why) for path, why in refused.items() if landing and why.lasting}
    refusals = (
        [
            as_frame(
                engine.spark,
                refusal_rows([(rel.name, path, why, True) for path, why in recorded.items()], lander.tag, lander.at),
            )
        ]
        if recorded
        else []
    )
    logged_now = [item for item in taken.values() if item.path not in refused or item.path in recorded]
    set_aside(
        engine,
        warehouse,
        rel,
        refusals + ([] if landed.quarantined is None else [landed.quarantined]),
        [item.sha256 for item in logged_now],
    )
    log_ingests(
        engine,
        warehouse,
        [
            log_row(
                lander,
                rel,
                placed.get(item.path, Placed(item.path, start, 0)),
                item.sha256,
                landed.tallies.get(item.path, Tally()),
                recorded.get(item.path),
            )
            for item in logged_now
        ],
    )
    for index, item in taken.items():
        tally, why = landed.tallies.get(item.path, Tally()), refused.get(item.path)
        results[index] = IngestResult(
            files[index],
            rel.name,
            tally.landed,
            tally.quarantined,
            tally.duplicates,
            refused=None if why is None else str(why),
            recorded=item.path in recorded,
        )
    return [results[index] for index in range(len(files))]


def _skipped(
    file: str, rel: Relation, item: Found | FileRefused, logged: dict[str, bool], taken: set[str], landing: bool
) -> IngestResult | None:
    """Why a call does not take ``file``, as its result: it cannot be read now, its content is ingested (or is another
    file's of this call), a landing file refused before, or a file given by hand refused for its form; None: taken."""
    if isinstance(item, FileRefused):
        return IngestResult(file, rel.name, refused=str(item))
    if logged.get(item.sha256) or item.sha256 in taken:
        return IngestResult(file, rel.name, already_ingested=True)
    if landing and logged.get(item.sha256) is False:
        return IngestResult(file, rel.name, already_refused=True)
    if item.refused is not None and not (landing and item.refused.lasting):
        return IngestResult(file, rel.name, refused=str(item.refused))
    return None


def _placed(last: int, files: dict[int, Found], given: Sequence[str]) -> dict[str, Placed]:
    """``files`` at the places after ``last``, one after another, each as many as its lines (a Parquet file: rows),
    named in refusals as ``given``."""
    placed = {}
    for index, file in files.items():
        placed[file.path] = Placed(file.path, last, file.rows, given[index])
        last += file.rows
    return placed


def ingest_landing(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    landing: str,
    checkpoint: str | None,
    report: Callable[[IngestResult], None],
    specs: dict[str, RelationSpec] | None = None,
) -> None:
    """``lakejoin ingest --landing``: every file under ``landing`` not landed or ingested yet, in name order, in one
    call; a file refused for its form is recorded and not tried again. On Databricks Auto Loader finds the files, and
    each of its micro-batches is a call. The caller has checked the folder (``require_landing``) before recording
    anything."""

    def ingest(paths: list[str]) -> None:
        if paths:
            ingest_files(engine, warehouse, rel, paths, specs, report, landing=True)

    if on_databricks():
        _auto_loader(engine, landing, checkpoint or default_checkpoint(landing, warehouse, rel), ingest)
        return
    tables = Tables.of(engine, warehouse)
    known = known_files(tables.ingest_log, tables.batches)
    new = []
    for path in listed(landing):
        if path in known.paths:
            refused = known.paths[path]
            report(IngestResult(path, rel.name, already_ingested=not refused, already_refused=refused))
        else:
            new.append(path)
    ingest(new)


def _auto_loader(engine: DeltaEngine, landing: str, checkpoint: str, ingest: Callable[[list[str]], None]) -> None:
    """Auto Loader (``cloudFiles``) finds the new files and records them in its checkpoint once the micro-batch that
    ingested them returns; only the paths are read (binaryFile without its content)."""

    def ingest_batch(files: DataFrame, _: int) -> None:
        paths = [
            row.path.removeprefix("dbfs:") for row in files.select("path").orderBy("path").collect()
        ]  # file names only: a few per trigger
        ingest([path for path in paths if readable(path)])

    stream = engine.spark.readStream.format("cloudFiles").option("cloudFiles.format", "binaryFile").load(landing)
    query = stream.select("path").writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    query.foreachBatch(ingest_batch).start().awaitTermination()


def _examined(rel: Relation, file: str) -> Found | FileRefused:
    try:
        return examined(rel.name, os.path.abspath(file), file)
    except OSError as exc:
        return FileRefused(f"cannot ingest {file}: cannot read it ({exc.strerror or exc})", lasting=False)


def ingest_frame(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    frame: DataFrame,
    specs: dict[str, RelationSpec] | None = None,
    label: str | None = None,
) -> IngestResult:
    """Ingest the records of a DataFrame (a notebook's, a stream's micro-batch) as those of a Parquet file: typed as
    it declares them, arriving in its own row order, quarantined and skipped as duplicates by the same rules; and, as
    a file whose content was ingested before, a frame whose records were (a micro-batch replayed after a restart)
    adds nothing.

    ``label`` is the source bronze and the quarantine record for its rows (default ``dataframe:<ingest id>``). The
    frame is cached for the ingest, so its rows are fingerprinted, numbered and classified once whatever its source
    computes: it should be a batch's worth, as a stream's micro-batch is. A session that caches nothing (Databricks
    serverless) reads it once per job instead: there it must give the same rows in the same order each time."""
    columns = frame.columns
    with held(frame) as cached:
        stored_columns(columns)  # a reserved or repeated name is refused before the frame is read
        record = F.to_json(
            F.struct(*[column(name) for name in columns])
        )  # JSON: hashable whatever the types (maps too)
        rows, count, sums = counted(
            cached,
            FRAME_ROW,
            F.sum(F.xxhash64(record).cast("decimal(38,0)")),
            F.sum(F.hash(record).cast("decimal(38,0)")),
        )
        digest = _frame_digest(columns, count, sums)
        if _logged(engine, warehouse, rel, [digest]).get(digest):
            return IngestResult(label or "dataframe", rel.name, already_ingested=True)
        lander = Lander.for_call(engine, warehouse, specs or default_specs())
        label = label or f"dataframe:{lander.tag}"
        placed = Placed(label, last_arrival_seq(Tables.of(engine, warehouse)), count)
        line = F.col(FRAME_ROW) + 1
        numbered = rows.withColumns({"_source_file": F.lit(label), "_arrival_seq": line + placed.first})
        try:
            landed = land_rows(lander, rel, parse_frame(numbered, columns, line), [placed], lander.provenance(rel))
        except FileRefused as exc:
            raise refusal(label, exc) from exc
        set_aside(engine, warehouse, rel, [] if landed.quarantined is None else [landed.quarantined], [digest])
        tally = landed.tallies.get(label, Tally())
        log_ingests(engine, warehouse, [log_row(lander, rel, placed, digest, tally)])
    return IngestResult(label, rel.name, tally.landed, tally.quarantined, tally.duplicates)


def _frame_digest(columns: list[str], count: int, sums: list) -> str:
    """What the ingest log names a DataFrame's content by, as a file's SHA-256 names a file's: the SHA-256 of its
    records' count and two sums of per-record hashes, so the same records give the same digest whatever their order
    or partitioning (a micro-batch replayed after a restart)."""
    return hashlib.sha256(f"dataframe {list(columns)} {[str(value) for value in (count, *sums)]}".encode()).hexdigest()


def set_aside(
    engine: DeltaEngine, warehouse: Warehouse, rel: Relation, frames: list[DataFrame], digests: list[str]
) -> None:
    """One commit of what a call set aside, under an application transaction named by the call's inputs, which a
    retry of the call after a crash finds recorded."""
    name = digests[0] if len(digests) == 1 else hashlib.sha256(" ".join(sorted(digests)).encode()).hexdigest()
    table = table_in(engine, warehouse, warehouse.quarantine)
    quarantine(table.writer(Commit(f"lakejoin-ingest:{rel.name}:{name}", 1)), frames)


def log_row(
    lander: Lander,
    rel: Relation,
    placed: Placed,
    digest: str | None,
    tally: Tally,
    refused: str | None = None,
    **source: object,
) -> dict:
    """An input's row of the ingest log: what it landed and the places it holds (none for a file refused as a whole)."""
    last = placed.first if refused is not None else placed.first + placed.bound
    return dict(
        ingest_id=lander.tag,
        relation=rel.name,
        source_file=placed.name,
        sha256=digest,
        rows_landed=tally.landed,
        rows_quarantined=1 if refused is not None else tally.quarantined,
        rows_duplicate=tally.duplicates,
        seq_from=placed.first + 1,
        seq_to=last,
        ingested_at=lander.at,
        refused=refused,
        source_version=source.get("version"),
        source_table_id=source.get("table_id"),
    )


def log_ingests(engine: DeltaEngine, warehouse: Warehouse, rows: list[dict], commit: Commit | None = None) -> None:
    """The ingest log's one write: a call's (its arrivals become pending with it), or ``reset``'s record of the files
    batches landed (under its ``commit``)."""
    if rows:
        with step("ingest_log"):
            log = table_in(engine, warehouse, warehouse.ingest_log)
            log.writer(commit).append(pa.Table.from_pylist(rows, INGEST_LOG_SCHEMA))


def _logged(engine: DeltaEngine, warehouse: Warehouse, rel: Relation, digests: Sequence[str]) -> dict[str, bool]:
    """What the ingest log holds of each content: ingested (True), or else refused as a landing file (False)."""
    if not digests:
        return {}
    log = engine.lookup(warehouse.ingest_log, "sha256", digests, where=f"relation = {literal(rel.name)}")
    found: dict[str, bool] = {}
    for digest, refused in (
        [] if log is None else zip(log.column("sha256").to_pylist(), log.column("refused").to_pylist())
    ):
        found[digest] = found.get(digest, False) or refused is None
    return found
