"""The one road into bronze: every way records reach ``bronze/<relation>`` lands them here, in one pass per relation.

The roads are files given to ``ingest`` or found in a landing folder (pipelines/bronze/ingest.py,
pipelines/bronze/landing.py), a DataFrame or a stream's micro-batch (pipelines/bronze/ingest.py), a source table's new
versions (pipelines/bronze/sources.py) and the files a batch takes from a landing folder (pipelines/batch/land.py). Each
gives this module its inputs already *placed* in the global arrival order: an input (a file, a frame, a table's new
rows) holds the places ``first + 1`` to ``first + bound``, and its n-th line or row takes ``first + n``
(``_arrival_seq``), so no job counts rows before they are written and a replay numbers them the same. A place an input
leaves unused (a blank line, a row set aside) is never taken by anything else.

One landing of one relation: its files parsed kind by kind (pipelines/bronze/parse.py), every row typed and classified
together (pipelines/bronze/classify.py) against the records already held, and appended to bronze in one commit. The job
that writes them counts the rows by outcome as it writes (an observation), each input's or the landing's as the road
needs, so a road reports without a job of its own. The rows set aside come back as one frame, for the caller's one
quarantine commit. A file whose form is wrong is refused before anything is written; a file Spark fails to read while
the rows are written is left out (refused for now) and the rest written again without it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from pipelines.bronze.classify import DIGEST, configured_types, held_digests, outcomes, typed
from pipelines.bronze.parse import Parsed, csv_header, format_of, parse_files
from state.clock import now
from state.engines import Data, DeltaEngine, as_frame
from state.engines.base import DeltaReader
from state.engines.table import Tables, Writer, table_in
from state.errors import FileRefused, LakejoinError, first_line
from state.faults import step
from state.frames import union_by_name
from state.join.relations import ID, OP, SEQ, TS, Relation, RelationSpec
from state.layout import BRONZE_STATISTICS, Warehouse, statistics_of
from state.log.batch_log import BatchPlan, bronze_read
from state.names import column, literal, quoted

OUTCOMES = ("accepted", "quarantined", "duplicate")
TALLY = "_tally"  # a row's input and outcome, as the write's observation counts them
QUARANTINED = OUTCOMES.index("quarantined")
SET_ASIDE = "_set_aside"  # the inputs with rows set aside, when the outcomes are counted for the landing as a whole
INGESTED_AT = pa.timestamp("us", tz="UTC")

QUARANTINE_SCHEMA = pa.schema(
    [
        ("relation", pa.string()),
        ("reason", pa.string()),
        ("source_file", pa.string()),
        ("source_line", pa.int64()),
        ("raw", pa.string()),
        ("id", pa.string()),
        ("ingest_id", pa.string()),
        ("ingested_at", INGESTED_AT),
        ("source_version", pa.int64()),  # the source table's version that added the row; null for a file
        ("lasting", pa.bool_()),  # a file refused as a whole: for good (its form), or for now (it could not be read)
    ]
)

# What Parquet's reader says of a data page it cannot decode (its footer read): damage, not a form lakejoin refuses.
DAMAGED_PAGE = re.compile(
    r"FAILED_TO_UNCOMPRESS|could not decode|ParquetDecodingException|Can ?not read value|corrupt|decompress", re.I
)

# What ends reading a file: its form (FileRefused from lakejoin's own checks, values nested deeper than Python
# recurses), or a failure while reading it (Spark's, the file system's).
UNREADABLE = (FileRefused, RecursionError, PySparkException, Py4JJavaError, OSError)


@dataclass(frozen=True)
class Placed:
    """One input of a landing and its places in the arrival order: its rows take ``first + 1`` to ``first + bound``."""

    name: str  # a file's path, a frame's label, a source table
    first: int
    bound: int
    shown: str | None = None  # how a refusal names it (a file as it was given), when not by ``name``

    @property
    def called(self) -> str:
        return self.shown or self.name

    @property
    def rows(self) -> str:
        """Its rows, as a SQL predicate on ``_arrival_seq``."""
        return f"(_arrival_seq > {self.first} AND _arrival_seq <= {self.first + self.bound})"


@dataclass(frozen=True)
class Tally:
    """One input's rows by outcome."""

    landed: int = 0
    quarantined: int = 0
    duplicates: int = 0

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.landed + other.landed, self.quarantined + other.quarantined, self.duplicates + other.duplicates
        )


@dataclass(frozen=True)
class Watch:
    """What else a landing's write counts of the rows it writes, for its caller (a batch's measure,
    pipelines/batch/measure.py): ``signals`` adds the columns the ``counts`` read to bronze's rows, and they go again
    before the rows are written."""

    signals: Callable[[DataFrame], DataFrame]
    counts: list[str]  # aggregates in Spark SQL


@dataclass(frozen=True)
class Landed:
    """What one landing put into one relation's bronze: each input's tally (or, counted as a whole, one tally under the
    relation's name), the files refused as a whole, the rows set aside (as ``quarantine/ingest`` keeps them; None
    when none), and the watch's counts (None: no watch, or the rows were written before and nothing was counted)."""

    relation: str
    tallies: dict[str, Tally] = field(default_factory=dict)
    refused: dict[str, FileRefused] = field(default_factory=dict)
    quarantined: DataFrame | None = None
    watched: dict | None = None

    @property
    def total(self) -> Tally:
        return sum(self.tallies.values(), Tally())


@dataclass(frozen=True)
class Lander:
    """Where and as what a landing writes: the warehouse, its relations' columns, the ``_ingest_id`` its rows carry and
    when they came; ``known`` gives a relation's records held already (``held_digests``), ``bronze`` the writer of a
    relation's bronze (under a batch's commit), ``left_out`` hears of a file refused for now while the rows are
    written (a batch records it before it writes the rest, so a resumed batch leaves it out too), and ``watch`` what
    else the write counts of a relation's rows (given the rows it writes)."""

    engine: DeltaEngine
    warehouse: Warehouse
    specs: dict[str, RelationSpec]
    tag: str
    at: datetime
    known: Callable[[Relation], DataFrame | None]
    bronze: Callable[[Relation], Writer] | None = None  # None: no commit of a batch's
    left_out: Callable[[Relation, str, str], None] = lambda *_: None
    watch: Callable[[Relation, DataFrame], Watch | None] = lambda *_: None

    @classmethod
    def for_call(cls, engine: DeltaEngine, warehouse: Warehouse, specs: dict[str, RelationSpec]) -> Lander:
        """A call's landing (``ingest``, a frame, a source table): a new ingest id, checked against the records held."""
        return cls(engine, warehouse, specs, str(uuid.uuid4()), now(), lambda rel: held_records(engine, warehouse, rel))

    def writer(self, rel: Relation) -> Writer:
        """The writer of ``rel``'s bronze: the batch's, else one of no commit."""
        if self.bronze is not None:
            return self.bronze(rel)
        return table_in(self.engine, self.warehouse, self.warehouse.bronze(rel)).writer(None)

    def provenance(self, rel: Relation) -> Provenance:
        """Where a landed file's rows come from: their file and line."""
        return Provenance(
            rel,
            "",
            self.tag,
            self.at,
            F.col("_source_file"),
            F.col("_source_line"),
            F.lit(None).cast("long"),
            named=F.col("_source_file"),
        )


@dataclass(frozen=True)
class Provenance:
    """What every row of one landing records about where it came from: a file and its line, or a source table's data
    file, the row within it and the table version that added it (pipelines/bronze/sources.py)."""

    relation: Relation
    path: str  # the source table ("" for files, which each row names)
    ingest_id: str
    ingested_at: datetime
    file: Column  # bronze's _source_file
    line: Column  # _source_line: the file's line, or the row's index in its data file
    version: Column  # the source table's version; null for a file
    kept: tuple[str, ...] | None = None  # the data columns bronze keeps (None: all; a table source: the event time)
    named: Column | None = None  # what quarantine/ingest names a row's file by (None: ``path``)


def land_files(lander: Lander, rel: Relation, files: Sequence[Placed], by_input: bool = True) -> Landed:
    """``files`` of ``rel`` (each at its places) parsed kind by kind, typed and classified together, and appended to
    bronze in one commit. A file that cannot be read as a whole is refused alone: before the write when its form is
    wrong, during it when Spark cannot read it (then the rest is written again without it; a failure that names no
    file is traced to its file by reading each alone). ``by_input``: whether the
    caller needs each file's tally (an ingest logs each file), or the landing's total alone (a batch), which the
    write counts with three counts whatever the files' number, where each file's takes three of its own."""
    typed_rows, refused = _typed_files(lander, rel, files)
    kept = [file for file in files if file.name not in refused]

    def without(failed: str, why: FileRefused) -> Landed:
        lander.left_out(rel, failed, str(why))
        again = land_files(lander, rel, [file for file in files if file.name != failed], by_input)
        return replace(again, refused={**refused, **again.refused, failed: why})

    landed = _land(lander, rel, typed_rows, kept, lander.provenance(rel), without, by_input)
    return replace(landed, refused={**refused, **landed.refused})


def land_rows(lander: Lander, rel: Relation, parsed: Parsed, inputs: Sequence[Placed], source: Provenance) -> Landed:
    """Rows already parsed (a DataFrame's, a source table's), each at its ``_arrival_seq``, typed and classified as a
    file's, and appended to bronze in one commit. A failure to read them raises."""
    settled = _bronze_types(lander.engine, lander.warehouse, rel)
    frame, _ = typed(
        lander.engine,
        lander.warehouse,
        rel,
        lander.specs,
        parsed,
        configured_types(rel, lander.specs[rel.name]),
        settled,
    )
    return _land(lander, rel, frame, inputs, source, None)


def _land(
    lander: Lander,
    rel: Relation,
    typed_rows: DataFrame | None,
    inputs: Sequence[Placed],
    source: Provenance,
    without: Callable[[str, FileRefused], Landed] | None,
    by_input: bool = True,
) -> Landed:
    """Classify ``typed_rows`` and append the accepted ones, counting the outcomes in the write's own job: each
    input's, or (``by_input`` false) the landing's, with the inputs that set rows aside. ``without``: how to land the
    rest when Spark fails to read one of the files (None: the failure raises)."""
    if typed_rows is None:
        return Landed(rel.name)
    classified = outcomes(typed_rows, lander.known(rel), lander.specs[rel.name].changes is not None)
    each = by_input or len(inputs) == 1  # each input's tally, or the landing's (with the inputs setting rows aside)
    tallied = classified.withColumn(TALLY, 3 * _input_index(inputs) + _outcome_code() if each else _outcome_code())
    metrics = _tallies(len(inputs) if each else 1) + (
        [] if each else [F.collect_set(F.when(F.col(TALLY) == QUARANTINED, _input_index(inputs))).alias(SET_ASIDE)]
    )
    observation, watching = Observation(), Observation()
    rows = bronze_rows(tallied.observe(observation, *metrics), source)
    watch = lander.watch(rel, rows)
    if watch is not None:
        rows = watch.signals(rows).observe(watching, *map(F.expr, watch.counts)).selectExpr(*map(quoted, rows.columns))
    try:
        with step(f"bronze_{rel.name}"):
            written = lander.writer(rel).append(rows, properties=statistics_of(rows.columns, BRONZE_STATISTICS))
    except UNREADABLE as exc:
        if without is None:
            raise
        named = next(((placed, refusal(placed.called, exc)) for placed in inputs if _names(exc, placed.name)), None)
        found = named or _read_alone(lander, rel, inputs)
        if found is None:
            raise
        return without(found[0].name, found[1])
    counts = observation.get if written is not None else tallied.agg(*metrics).first().asDict()
    if each:
        tallies = {
            placed.name: Tally(*(counts[outcome][index] for outcome in OUTCOMES)) for index, placed in enumerate(inputs)
        }
        bad = [placed for placed in inputs if tallies[placed.name].quarantined]
    else:
        tallies = {rel.name: Tally(*(counts[outcome][0] for outcome in OUTCOMES))}
        bad = [inputs[index] for index in sorted(counts[SET_ASIDE])]
    quarantined = None
    if bad:  # read again only the inputs that set rows aside
        quarantined = quarantine_rows(classified.where(" OR ".join(placed.rows for placed in bad)), source)
    return Landed(
        rel.name, tallies, {}, quarantined, watching.get if watch is not None and written is not None else None
    )


def _read_alone(lander: Lander, rel: Relation, files: Sequence[Placed]) -> tuple[Placed, FileRefused] | None:
    """When the write's failure names no file: the first of ``files`` that fails read alone (parsed, typed and every
    row read by a job that writes nothing), and its refusal; None when each reads alone."""
    for file in files:
        try:
            frame, refused = _typed_files(lander, rel, [file])
            if frame is not None:
                frame.write.format("noop").mode("overwrite").save()
        except UNREADABLE as exc:
            return file, refusal(file.called, exc)
        if file.name in refused:
            return file, refused[file.name]
    return None


def _outcome_code() -> Column:
    return F.expr(f"CASE _outcome {' '.join(f'WHEN {name!r} THEN {code}' for code, name in enumerate(OUTCOMES))} END")


def _input_index(inputs: Sequence[Placed]) -> Column:
    """A row's input as its index in ``inputs`` (by its file's name)."""
    if len(inputs) == 1:
        return F.lit(0)
    index = ", ".join(f"{literal(placed.name)}, {number}" for number, placed in enumerate(inputs))
    return F.expr(f"element_at(map({index}), _source_file)")


def _tallies(inputs: int) -> list[Column]:
    """Per outcome, an array of each input's rows with it (``3 * input + outcome`` is a row's ``_tally``): SQL text,
    so one expression whatever the inputs' number."""
    return [
        F.expr(f"array({', '.join(f'count_if({TALLY} = {3 * number + code})' for number in range(inputs))})").alias(
            outcome
        )
        for code, outcome in enumerate(OUTCOMES)
    ]


def _bronze_types(engine: DeltaReader, warehouse: Warehouse, rel: Relation) -> dict[str, DataType]:
    schema = engine.schema(warehouse.bronze(rel))
    return {} if schema is None else {field.name: field.dataType for field in schema.fields}


def _typed_files(
    lander: Lander, rel: Relation, files: Sequence[Placed]
) -> tuple[DataFrame | None, dict[str, FileRefused]]:
    """``files`` parsed and typed, kind by kind (each kind's types settled by bronze's, then the earlier kinds'): their
    rows in one frame, each at its place (None when none is left), and the files refused. A kind of several files
    refused as a whole is typed again file by file, so only the files at fault are refused."""
    engine, warehouse = lander.engine, lander.warehouse
    settled = _bronze_types(engine, warehouse, rel)
    configured = configured_types(
        rel, lander.specs[rel.name]
    )  # a config error stops the command: it is no file's fault
    frames, refused = [], {}
    pending = _kinds(files)
    while pending:
        group = pending.pop(0)
        try:
            parsed = parse_files(engine.spark, [file.name for file in group], format_of(group[0].name))
            first = F.create_map(*[F.lit(value) for file in group for value in (file.name, file.first)])
            placed = replace(
                parsed,
                frame=parsed.frame.withColumn("_arrival_seq", first[F.col("_source_file")] + F.col("_source_line")),
            )
            frame, types = typed(engine, warehouse, rel, lander.specs, placed, configured, settled)
        except UNREADABLE as exc:
            if len(group) > 1:
                pending = [[file] for file in group] + pending
            else:
                refused[group[0].name] = refusal(group[0].called, exc)
            continue
        frames.append(frame)
        settled = {**types, **settled}
    if not frames:
        return None, refused
    return union_by_name(frames, allow_missing=True), refused


def _kinds(files: Sequence[Placed]) -> list[list[Placed]]:
    """The files by what reads them together: JSON Lines; CSV by header; Parquet by schema (in the order of each
    kind's first file)."""
    kinds: dict[tuple, list[Placed]] = {}
    for file in files:
        fmt = format_of(file.name)
        key = (
            fmt,
            csv_header(file.name) if fmt == "csv" else str(pq.read_schema(file.name)) if fmt == "parquet" else None,
        )
        kinds.setdefault(key, []).append(file)
    return list(kinds.values())


def _names(error: BaseException, path: str) -> bool:
    """Whether Spark's ``error`` names the file at ``path`` (as it names files: a URI, percent-encoded)."""
    text = str(error)
    return path in text or quote(os.path.abspath(path)) in text


def bronze_rows(classified: DataFrame, source: Provenance) -> DataFrame:
    """Accepted rows with their bookkeeping, each at its place in the arrival order."""
    accepted = classified.where(F.col("_outcome") == "accepted")
    data = [
        name for name in accepted.columns if not name.startswith("_") and (source.kept is None or name in source.kept)
    ]
    table_version = [] if source.kept is None else [source.version.alias("_source_version")]
    return accepted.select(
        *[column(name) for name in data],
        ID,
        TS,
        *[name for name in (OP, SEQ) if name in accepted.columns],  # a change feed's (pipelines/bronze/classify.py)
        F.col("_arrival_seq").cast("long").alias("_arrival_seq"),
        source.file.alias("_source_file"),
        source.line.cast("long").alias("_source_line"),
        *table_version,
        F.lit(source.ingest_id).alias("_ingest_id"),
        F.lit(source.ingested_at).alias("_ingested_at"),
        DIGEST,
    )


def quarantine_rows(classified: DataFrame, source: Provenance) -> DataFrame:
    """The rows set aside, with the reason, the file and the line."""
    return classified.where(F.col("_outcome") == "quarantined").select(
        F.lit(source.relation.name).alias("relation"),
        F.col("_reason").alias("reason"),
        (F.lit(source.path) if source.named is None else source.named).alias("source_file"),
        source.line.cast("long").alias("source_line"),
        F.col("_raw").alias("raw"),
        F.col(ID).alias("id"),
        F.lit(source.ingest_id).alias("ingest_id"),
        F.lit(source.ingested_at).alias("ingested_at"),
        source.version.alias("source_version"),
        F.lit(None).cast("boolean").alias("lasting"),
    )


def quarantine(writer: Writer, parts: Sequence[Data]) -> None:
    """``quarantine/ingest``'s one write, whichever road lands: what a landing set aside (the rows it quarantined, the
    files it refused) in one commit, ``writer``'s (a batch's, or a call's named by its inputs)."""
    if not parts:
        return
    spark = writer.table.engine.spark
    with step("quarantine"):
        writer.append(
            parts[0]
            if len(parts) == 1
            else union_by_name([as_frame(spark, part) for part in parts], allow_missing=True)
        )


def refusal_rows(refused: Sequence[tuple[str, str, str, bool]], ingest_id: str, ingested_at: datetime) -> pa.Table:
    """Files refused as a whole, kept where their rows would have been quarantined: a row each (relation, file, why,
    whether for good), without a line."""
    rows = [
        dict(
            relation=relation,
            reason=reason,
            source_file=path,
            source_line=None,
            raw=None,
            id=None,
            ingest_id=ingest_id,
            ingested_at=ingested_at,
            source_version=None,
            lasting=lasting,
        )
        for relation, path, reason, lasting in refused
    ]
    return pa.Table.from_pylist(rows, QUARANTINE_SCHEMA)


def refusal(file: str, exc: BaseException) -> FileRefused:
    """``exc`` as the one-line refusal of ``file``, in a user's words where its cause is known; lasting only when the
    file's form caused it."""
    if isinstance(exc, FileRefused):
        return FileRefused(f"cannot ingest {file}: {exc}", exc.lasting)
    if isinstance(exc, RecursionError) or "maximum recursion depth exceeded" in str(exc):  # PySpark may wrap it
        return FileRefused(f"cannot ingest {file}: its values are nested too deeply to read")
    if format_of(file) == "parquet" and DAMAGED_PAGE.search(str(exc)):
        return FileRefused(
            f"cannot ingest {file}: a Parquet data page cannot be read, the file is damaged ({first_line(exc)})",
            lasting=False,
        )
    return FileRefused(f"cannot ingest {file}: Spark cannot read it ({first_line(exc)})", lasting=False)


def held_records(engine: DeltaEngine, warehouse: Warehouse, rel: Relation) -> DataFrame | None:
    """The records a call's new arrivals of ``rel`` are checked against (``held_digests``): those its state
    table holds (each until it is below its relation's watermark: a copy arriving later is late anyway), and those
    ingested and not joined yet. Bounded by the lateness, not by bronze's history."""
    joined_to = engine.max_value(warehouse.batches, "seq_to") or 0
    frames = (
        engine.read(warehouse.state(rel)),
        engine.read(warehouse.bronze(rel), where=f"_arrival_seq > {joined_to}"),
    )
    return held_digests(*frames)


def last_arrival_seq(tables: Tables) -> int:
    """The last place taken in the global arrival order, across every relation (0 when none): by an arrival in bronze,
    by an ingest's inputs (the ingest log's places), by a batch's slice (a batch's files reserve places that they may
    not all take), or by the files of a batch that died after landing some of them (its plan, carried by its bronze
    commits after the versions the log's last batch read)."""
    taken = [bronze.max_value("_arrival_seq") for bronze in tables.bronze.values()]
    taken += [tables.batches.max_value("seq_to"), tables.ingest_log.max_value("seq_to")]
    read = bronze_read(tables.batches)
    for rel, bronze in tables.bronze.items():
        info = bronze.info(read.get(rel.name))
        if info is not None and info.recorded.plan is not None:
            taken.append(BatchPlan.decoded(info.recorded.plan).seq_to)
    return max((value for value in taken if value is not None), default=0)


def require_files(files: Sequence[str]) -> None:
    """Refuse, before anything is read, a file lakejoin cannot ingest by its name, or one that is not there."""
    for file in files:
        format_of(file)
        if not os.path.isfile(file):
            raise LakejoinError(f"no such file: {file}")
