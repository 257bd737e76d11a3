"""Drive the real pipeline from tests: land records as files, run the joiner, read gold back."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from unittest import mock

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.bronze.ingest import IngestResult, ingest_files
from pipelines.bronze.sources import ingest_sources
from pipelines.silver import BatchReport, run
from pipelines.spark import DELTA_JARS
from state.config import Config
from state.engines import DeltaEngine
from state.errors import FileRefused
from state.faults import CRASH_AT, InjectedCrash
from state.join.relations import relation
from state.layout import IN_STORE, Warehouse
from tests.reference import Match, Pair, Record

_files = itertools.count()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAKEJOIN = [sys.executable, "-m", "pipelines.cli"]


def lakejoin(
    *args: str, cwd: str, engine: str = "delta-rs", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``lakejoin ARGS`` in a fresh process on ``engine`` (and ``env`` added to its environment), to completion."""
    return subprocess.run(
        [*LAKEJOIN, *args], capture_output=True, text=True, cwd=cwd, env={**_env(engine), **(env or {})}, timeout=600
    )


def lakejoin_here(*args: str, cwd: str, engine: str = "delta-rs") -> subprocess.CompletedProcess:
    """``lakejoin ARGS`` run in this process on the tests' Spark session, as ``lakejoin`` would in a process of its own
    (its exit status, what it prints), without a JVM's start: for what a command does, where the process boundary is
    not what a test is about. ``engine`` is the one ``engine: auto`` picks, as for a process (Delta's jars or not)."""
    from pipelines import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), mock.patch("state.engines.session_has_delta", lambda spark: engine == "spark"):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(list(args))
    return subprocess.CompletedProcess([*LAKEJOIN, *args], status, out.getvalue(), err.getvalue())


def start_lakejoin(*args: str, cwd: str, engine: str = "delta-rs") -> subprocess.Popen:
    """``lakejoin ARGS`` started in a process group of its own (its JVM included), so a test can kill it all."""
    return subprocess.Popen(
        [*LAKEJOIN, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=_env(engine),
        start_new_session=True,
    )


@contextlib.contextmanager
def driver_log(spark: SparkSession, level: str = "WARN") -> Iterator[Callable[[], list[str]]]:
    """What the session's driver logs while the block runs, at ``level`` (Spark's default, as in a notebook or a
    Databricks job): a log4j appender on the root logger, read as lines. The JVM writes to the terminal the tests
    started with, which pytest's fd capture does not reach."""
    log4j = spark._jvm.org.apache.logging.log4j
    context = log4j.LogManager.getContext(False)
    root = context.getConfiguration().getRootLogger()
    before, writer = root.getLevel().toString(), spark._jvm.java.io.StringWriter()
    layout = log4j.core.layout.PatternLayout.newBuilder().withPattern("%p %c{1}: %m%n").build()
    appender = log4j.core.appender.WriterAppender.createAppender(layout, None, writer, "lakejoin-tests", False, True)
    appender.start()
    root.addAppender(appender, None, None)
    spark.sparkContext.setLogLevel(level)
    try:
        yield lambda: str(writer.toString()).splitlines()
    finally:
        spark.sparkContext.setLogLevel(before)
        root.removeAppender("lakejoin-tests")
        context.updateLoggers()


def damaged_parquet(path: str) -> str:
    """A Parquet file whose footer reads and whose first data page does not (its compressed bytes garbled): Spark
    fails only when the write's job reads the rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": f"p{n}", "ts": n, "key": "k", "payload": "x" * 50} for n in range(200)]
    pq.write_table(pa.Table.from_pylist(rows), path, compression="snappy")
    damaged = bytearray(open(path, "rb").read())
    damaged[30:200] = bytes(byte ^ 0x5A for byte in damaged[30:200])
    with open(path, "wb") as out:
        out.write(bytes(damaged))
    return path


def _env(engine: str) -> dict[str, str]:
    """The process's engine follows from its session, as for a user: Delta's jars named (``engine: auto`` picks
    Delta on Spark) or not (delta-rs)."""
    env = {**os.environ, "PYTHONPATH": REPO}
    if engine == "delta-rs":
        env.pop(DELTA_JARS, None)
    return env


@dataclass
class Pipeline:
    engine: DeltaEngine
    root: str
    config: Config = field(default_factory=Config.of)

    @property
    def warehouse(self) -> Warehouse:
        return Warehouse(os.path.join(self.root, "warehouse"), self.config.joined)

    def write_file(self, rows: Iterable[dict], suffix: str = ".jsonl") -> str:
        path = os.path.join(self.root, f"landing-{next(_files)}{suffix}")
        with open(path, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
        return path

    def ingest(self, side: str, path: str) -> IngestResult:
        """One file ingested on its own; a file refused as a whole raises its refusal."""
        (result,) = ingest_files(
            self.engine, self.warehouse, relation(side, self.config.joined), [path], self.config.relations
        )
        if result.refused is not None:
            raise FileRefused(result.refused)
        return result

    def land(self, records: Sequence[Record]) -> None:
        """Ingest records in the given order, one file per run of consecutive records of one relation."""
        for side, run_of in itertools.groupby(records, key=lambda rec: rec.relation):
            rows = [{"id": rec.id, "ts": rec.ts, "key": rec.key, "payload": rec.payload} for rec in run_of]
            self.ingest(side, self.write_file(rows))

    def land_chunk(self, records: Sequence[Record]) -> None:
        """Ingest a chunk as one file per relation (each relation's records in their order)."""
        for side in (rel.name for rel in self.config.joined):
            rows = [
                {"id": rec.id, "ts": rec.ts, "key": rec.key, "payload": rec.payload}
                for rec in records
                if rec.relation == side
            ]
            if rows:
                self.ingest(side, self.write_file(rows))

    def batches(self) -> list[list[Record]]:
        """The records of each committed batch, read back from the batch log and bronze."""
        arrivals = {}
        for rel in self.config.joined:
            bronze = self.engine.read(self.warehouse.bronze(rel))
            for row in [] if bronze is None else bronze.collect():
                arrivals[row["_arrival_seq"]] = Record(
                    rel.name, row["id"], row["ts"], row["key"], row["payload"], rel.rank
                )
        log = self.engine.read(self.warehouse.batches).orderBy("batch_id").collect()
        return [
            [arrivals[seq] for seq in range(row["seq_from"] + 1, row["seq_to"] + 1) if seq in arrivals] for row in log
        ]

    def late_ids(self) -> set[str]:
        late = self.engine.read(self.warehouse.late_arrivals)
        return set() if late is None else {row["id"] for row in late.select("id").collect()}

    def run(self, max_batch_rows: int | None = None) -> list[BatchReport]:
        """What ``lakejoin run`` does: the source tables' new versions ingested, then every pending arrival joined."""
        ingest_sources(self.engine, self.warehouse, self.config.relations)
        return run(self.engine, self.warehouse, self.config.with_overrides(max_batch_rows=max_batch_rows))

    def gold_rows(self) -> list[dict]:
        gold = self.engine.read(self.warehouse.gold)
        return [] if gold is None else [row.asDict() for row in gold.collect()]

    def gold_pairs(self) -> Counter[Pair]:
        return Counter(Pair(row["r_id"], row["s_id"], row["owner"]) for row in self.gold_rows())

    def gold_matches(self) -> Counter[Match]:
        """Gold's tuples, each with its members' ids and its owner, as the N-way reference gives them."""
        names = [rel.name for rel in self.config.joined]
        return Counter(
            Match(tuple((name, row[f"_{name}_id"]) for name in names), row["owner"].lower()) for row in self.gold_rows()
        )

    def state_rows(self) -> int:
        """The records every buffer holds (a record in two buffers counts twice, as the model keeps two copies)."""
        return sum(self.buffer_rows().values())

    def buffer_rows(self) -> dict[str, int]:
        """Rows per buffer, each a membership column of a state table: ``r_store`` (R's records in R's store),
        ``r_probes_s`` (S's records in R's probe buffer)."""
        counts = {}
        for rel in self.config.joined:
            rows = self.engine.read(self.warehouse.state(rel))
            columns = [] if rows is None else [column for column in rows.columns if column.startswith("_in_")]
            if not columns:
                continue
            sums = rows.agg(*[F.count(F.when(F.col(column), 1)).alias(column) for column in columns]).first()
            for column in columns:
                counts[f"{rel.name}_store" if column == IN_STORE else f"{column[4:-7]}_probes_{rel.name}"] = sums[
                    column
                ]
        return counts

    def versions(self) -> dict[str, int | None]:
        """Every table's Delta version: what a refused command must leave unchanged."""
        return {self.warehouse.name_of(path): self.engine.version(path) for path in self.warehouse.tables()}

    def snapshot(self) -> dict[str, Counter]:
        """Gold, every state table, rule results, quarantined rows and the committed batches as multisets,
        without wall-clock columns."""
        engine, warehouse = self.engine, self.warehouse
        gold = Counter(tuple(sorted((k, v) for k, v in row.items() if k != "produced_at")) for row in self.gold_rows())
        tables = {"gold": gold}
        for name, path in warehouse.buffers().items():
            rows = engine.read(path)  # None until the relation it holds has arrived
            kept = [
                "id",
                "ts",
                "key",
                "payload",
                "_arrival_seq",
                *(c for c in (rows.columns if rows is not None else []) if c == "_matched" or c.startswith("_in_")),
            ]
            tables[name] = Counter() if rows is None else Counter(tuple(row) for row in rows.select(*kept).collect())
        late = engine.read(warehouse.late_arrivals)
        late_columns = ("relation", "id", "ts", "reason", "watermark", "batch_id")
        tables["late_arrivals"] = (
            Counter() if late is None else Counter(tuple(row) for row in late.select(*late_columns).collect())
        )
        rows = engine.read(warehouse.dq_quarantine)
        tables["dq_quarantine"] = (
            Counter()
            if rows is None
            else Counter(tuple(row) for row in rows.select("batch_id", "rule", "table", "row_key").collect())
        )  # row names the file
        log_columns = ("batch_id", "seq_from", "seq_to", "watermarks", "late", "evicted", "rules")
        committed = engine.read(warehouse.batches).select(*log_columns)
        tables["batches"] = Counter(tuple(_hashable(value) for value in row) for row in committed.collect())
        return tables


def copied(pipeline: Pipeline, root: str, engine: DeltaEngine | None = None) -> Pipeline:
    """A pipeline of the same config on a copy of ``pipeline``'s warehouse under ``root`` (on ``engine``, else the same
    engine): a second starting point for the price of a folder copy."""
    twin = Pipeline(engine or pipeline.engine, str(root), pipeline.config)
    shutil.copytree(pipeline.warehouse.root, twin.warehouse.root)
    return twin


def _hashable(value: object) -> object:
    """Map columns arrive as dicts, and arrays of structs as lists of rows: as sorted tuples they can be counted."""
    if isinstance(value, dict):
        return tuple(sorted(value.items()))
    if isinstance(value, list):
        return tuple(sorted(tuple(item) for item in value))
    return value


def crash_at_each(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch, points: list[str], max_batch_rows: int) -> None:
    """Runs that each die at the next of ``points`` (each resuming what the last left unfinished), then a clean run."""
    for point in points:
        monkeypatch.setenv(CRASH_AT, point)
        with pytest.raises(InjectedCrash):
            pipeline.run(max_batch_rows=max_batch_rows)
    monkeypatch.delenv(CRASH_AT)
    pipeline.run(max_batch_rows=max_batch_rows)
