"""lakejoin as a library: a ``Pipeline`` does in a caller's Spark session (a notebook's, a job's) what each ``lakejoin``
command does in a session of its own. The CLI is a thin layer over it.

Every method opens the warehouse afresh, as a command does: it checks the given config against the warehouse's
recorded definition (pipelines/definition.py), picks the engine, then works. Errors are ``LakejoinError``: one line
saying what is wrong and what to do, with nothing written. A caller's session is used as it is: lakejoin sets none
of its settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from pipelines.commands.maintain import SAFE_RETENTION_HOURS
from state.config import Config, config_from
from state.config_file import load_config
from state.errors import LakejoinError

if TYPE_CHECKING:  # Spark loads when a Pipeline is made, not when the CLI parses its arguments
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from expectations.audit import Audit
    from pipelines.batch.land import Landing
    from pipelines.bronze.ingest import IngestResult
    from pipelines.bronze.sources import SourceResult
    from pipelines.commands.status import WarehouseStatus
    from pipelines.definition import Settled
    from pipelines.silver import BatchReport, RunReport
    from state.engines import DeltaEngine
    from state.engines.base import DeltaReader
    from state.join.relations import Relation
    from state.layout import Warehouse
    from state.log.lock import Held, Takings


T = TypeVar("T")


@dataclass(frozen=True)
class _Opened:
    """A warehouse opened for one call: its engine, its tables under the config in force, and that config."""

    engine: DeltaReader  # a DeltaEngine, except for the commands that only read or drop tables (``_reader``)
    warehouse: Warehouse
    settled: Settled

    @property
    def config(self) -> Config:
        return self.settled.config


class Pipeline:
    """A lakejoin warehouse and how it joins: the tables under ``warehouse`` (a folder, or a Unity Catalog schema
    ``catalog.schema``), joined as ``config`` says.

    ``config``: a YAML file's path, a mapping of the same settings, a ``Config``, or None for the warehouse's recorded
    definition (the first config a warehouse is given is recorded; a later one that would change gold is refused).
    ``spark``: the caller's session, used as it is; None uses the process's session, else starts a local one, which
    ``close`` (or leaving a ``with`` block) stops.
    """

    def __init__(
        self,
        warehouse: str,
        config: str | os.PathLike | Mapping | Config | None = None,
        spark: SparkSession | None = None,
        *,
        verbose: bool = False,
    ) -> None:
        self.root = os.fspath(warehouse)
        self._given = _config(config)
        self._spark, self._verbose, self._owns_session = spark, verbose, False
        self._engines: dict[tuple[str, bool], DeltaEngine] = {}
        from state.log.lock import Takings

        # The warehouse locks' takings this pipeline made and saw: a call whose taking finds none other since keeps
        # what its engines saw of the tables' logs (state/log/lock.py)
        self._takings = Takings()

    @property
    def spark(self) -> SparkSession:
        """The session lakejoin computes with: the caller's, else the active one, else a local one started on first
        use."""
        if self._spark is None:
            from pyspark.sql import SparkSession

            from pipelines.spark import get_spark
            from state.engines.jvm import classic_spark_running

            active = SparkSession.getActiveSession()  # a classic one on this thread, or a Spark Connect one
            if active is None and not classic_spark_running():  # no Spark in this process yet: lakejoin's own
                self._spark, self._owns_session = get_spark(verbose=self._verbose), True
            else:  # the process's session (another thread's), its settings untouched
                self._spark = active or SparkSession.builder.getOrCreate()
        return self._spark

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the session lakejoin started for this pipeline; a caller's session is left running."""
        if self._owns_session and self._spark is not None:
            from pipelines.spark import stop_session

            stop_session(self._spark)
            self._spark, self._owns_session = None, False

    def ingest(
        self,
        relation: str,
        source: str | os.PathLike | Sequence[str | os.PathLike] | DataFrame,
        *,
        progress: Callable[[IngestResult], None] | None = None,
    ) -> list[IngestResult]:
        """Append raw arrivals to ``relation``'s bronze table: files (.jsonl, .csv, .parquet) in the order given, or a
        Spark DataFrame of records (typed as it declares them, in its row order). A file ingested before adds nothing;
        a file that cannot be read as a whole is refused in its result (``.refused``) and the next goes on."""
        from pyspark.sql import DataFrame

        if isinstance(source, DataFrame):
            return [self._ingest_frame(relation, source)]
        files = [os.fspath(source)] if isinstance(source, (str, os.PathLike)) else [os.fspath(file) for file in source]
        if not files:
            raise LakejoinError(f"nothing to ingest into {relation}: pass files or a DataFrame")
        return self._ingesting(relation, lambda opened, rel: _files(opened, rel, files, progress))

    def ingest_landing(
        self,
        relation: str,
        folder: str,
        checkpoint: str | None = None,
        *,
        progress: Callable[[IngestResult], None] | None = None,
    ) -> list[IngestResult]:
        """Ingest every file under ``folder`` not ingested yet (Auto Loader on Databricks, its checkpoint by default
        under ``folder/_lakejoin_checkpoint``, one per warehouse). A file refused as a whole is recorded and not tried
        again."""
        from pipelines.bronze.ingest import ingest_landing
        from pipelines.bronze.landing import require_landing

        require_landing(folder, relation)  # before the ingest records the definition: a refused call writes nothing

        def ingest(opened: _Opened, rel: Relation) -> list[IngestResult]:
            results: list[IngestResult] = []
            ingest_landing(
                opened.engine,
                opened.warehouse,
                rel,
                folder,
                checkpoint,
                _reporting(results, progress),
                opened.config.relations,
            )
            return results

        return self._ingesting(relation, ingest)

    def foreach_batch(self, relation: str) -> Callable[[DataFrame, int], None]:
        """A function for ``writeStream.foreachBatch`` that lands each micro-batch of any Structured Streaming source
        in ``relation``'s bronze, exactly once: a micro-batch replayed after a restart holds the same records, and a
        DataFrame whose records were ingested before adds nothing (as a file whose content was). ``run`` joins what
        landed."""

        def land_micro_batch(batch: DataFrame, batch_id: int) -> None:
            self._ingest_frame(relation, batch, f"foreachBatch:{relation}/{batch_id}")

        return land_micro_batch

    def run(
        self,
        max_batch_rows: int | None = None,
        *,
        follow: float | None = None,
        wait: float = 0.0,
        progress: Callable[[BatchReport | SourceResult | Landing | IngestResult], None] | None = None,
    ) -> RunReport:
        """Join every pending arrival in micro-batches of at most ``max_batch_rows`` (config ``max_batch_rows``), then
        return what the batches did. Source tables' new versions and the files new in the landing folders are ingested
        first. ``progress`` hears of each source's ingest, each landing file's and each batch as it commits. ``follow``:
        keep looking for new arrivals every so many seconds until SIGTERM or Ctrl-C, which let the batch under way
        commit. ``wait``: how long to wait for another run holding the warehouse before raising ``WarehouseBusy``. A
        second signal abandons the batch under way (the next run resumes it): the report says ``interrupted``."""
        from pipelines.batch.land import Landing
        from pipelines.bronze.ingest import IngestResult
        from pipelines.bronze.sources import SourceResult
        from pipelines.commands.follow import StopSignal
        from pipelines.definition import recorder
        from pipelines.silver import BatchReport, RunReport, look_again
        from state.log.lock import JOIN

        if follow is not None and not follow > 0:
            raise LakejoinError(
                f"follow is the seconds between looks for new arrivals: a positive number, got {follow!r}"
            )
        done: list[BatchReport | SourceResult | Landing | IngestResult] = []
        report, interrupted = _reporting(done, progress), False
        with (
            self._call("run"),
            self._lock("run", JOIN, wait) as held,
            ExitStack() as pin,
        ):
            opened = self._open("run", pin=pin, kept=held.unchanged)
            record = recorder(opened.engine, opened.warehouse, opened.settled)
            config = opened.config.with_overrides(max_batch_rows=max_batch_rows)
            joining = partial(_join_pending, opened, config, report, record=record, held=held, takings=self._takings)
            if follow is None:
                joining(lambda: False)
            else:
                with StopSignal() as stop:
                    try:
                        while True:
                            joining(stop.asked)
                            if stop.wait(follow):
                                break
                            look_again(opened.engine, opened.warehouse, self._takings)
                    except KeyboardInterrupt:  # a second signal: the work under way is abandoned
                        interrupted = True
            record()  # a run with nothing to write records the config it was given too
        return RunReport(
            [item for item in done if isinstance(item, BatchReport)],
            interrupted,
            [item for item in done if isinstance(item, SourceResult)],
            [item for item in done if isinstance(item, (Landing, IngestResult))],
        )

    def status(self) -> dict:
        """Every table's version and rows, the last batch, pending arrivals and watermarks
        (``lakejoin status --json``)."""
        return self.status_report().as_dict()

    def status_report(self) -> WarehouseStatus:
        """``status`` as an object: ``describe()`` is what ``lakejoin status`` prints, ``problem`` what is wrong."""
        from pipelines.commands.status import warehouse_status

        reader = self._reader()
        with self._call("status"):
            opened = self._open("status", reader)
            return warehouse_status(opened.engine, opened.warehouse, opened.config)

    def validate(self, docs: str | None = None) -> Audit:
        """Every data-quality suite over the whole tables and gold reconciled against the batch join of bronze
        (``lakejoin validate``); Data Docs go under ``docs`` (default ``<warehouse>/quality/gx``). The result has
        ``success`` and ``failures``."""
        from expectations.audit import audit

        with self._call("validate"):
            opened = self._open("validate")
            if docs is None and opened.warehouse.in_catalog:
                raise LakejoinError(
                    "a Unity Catalog warehouse has no folder for Data Docs: pass docs= (e.g. a Volumes path)"
                )
            return audit(
                opened.engine,
                opened.warehouse,
                opened.config,
                docs or os.path.join(opened.warehouse.root, "quality", "gx"),
            )

    def table(self, name: str) -> DataFrame:
        """A DataFrame of one of the warehouse's tables, by its name: ``gold``, ``bronze/r``, ``silver/r_state``,
        ``quarantine/ingest``, ... (``gold`` is ``gold/join_results``)."""
        with self._call("status"):
            opened = self._open("status")
            rows = opened.engine.read(_path_of(opened.warehouse, name))  # type: ignore[attr-defined] - with Spark
            return _existing(name, rows, self.root)

    def head(self, name: str = "gold", limit: int = 20) -> pa.Table:
        """The first ``limit`` rows of a table (named as for ``table``), on the driver as Arrow (``lakejoin show``);
        on a local warehouse read by delta-rs alone, with no Spark session started."""
        reader = self._reader()
        with self._call("status"):
            opened = self._open("status", reader)
            return _existing(name, opened.engine.head(_path_of(opened.warehouse, name), limit), self.root)

    def advance(self, relation: str, to: str | int | datetime | date) -> str:
        """Declare that no record of ``relation`` older than ``to`` will come (a backfill finished, a day closed):
        the next batch takes it as the relation's watermark, which only moves forward, so rows waiting on the
        relation come out and later records below it are late (``lakejoin advance``). Returns what was recorded."""
        from pipelines.definition import record
        from state.clock import now
        from state.engines.table import Tables
        from state.event_time import bronze_kind, on_axis_value, render
        from state.join.relations import relation as named
        from state.log.lock import INGEST
        from state.log.progress import declare

        # under the ingest lock, as every lakejoin writer takes one: a declaration queues behind an ingest
        with (
            self._call("advance"),
            self._lock("advance", INGEST, None) as held,
            ExitStack() as pin,
        ):
            opened = self._open("advance", pin=pin, kept=held.unchanged)
            rel = named(relation, opened.warehouse.relations)
            kind = bronze_kind(Tables.of(opened.engine, opened.warehouse).bronze, opened.config.event_times)
            value = on_axis_value(to, kind, "--to")
            shown = render(value, kind) or str(value)
            declare(opened.engine, opened.warehouse, rel, value, shown, now())
            record(opened.engine, opened.warehouse, opened.settled)
            return (
                f"{rel.name}: no record older than {shown} will come; the next run takes it as {rel.label}'s watermark"
            )

    def maintain(self, retention_hours: int = SAFE_RETENTION_HOURS) -> list[str]:
        """OPTIMIZE every table (bronze sorted on arrival order), then VACUUM files no version of the last
        ``retention_hours`` needs (at least 168); returns the tables maintained."""
        from pipelines.commands.maintain import maintain
        from pipelines.definition import record
        from state.log.lock import JOIN, hold

        with self._call("maintain"):
            opened = self._open("maintain")
            # a rewrite must not race a batch's MERGE; the definition is recorded under the lock, as every write is
            with hold(opened.warehouse.root, JOIN, None, self._locking_spark()):
                maintained = maintain(opened.engine, opened.warehouse, retention_hours)
                record(
                    opened.engine, opened.warehouse, opened.settled
                )  # a maintain that fails leaves the definition as it was
            return maintained

    def reset(self) -> list[str]:
        """Drop silver and gold (bronze stays) so the next run rebuilds them from bronze; returns the tables dropped."""
        from pipelines.commands.reset import reset
        from state.log.lock import JOIN, hold

        reader = self._reader()
        with self._call("reset"):
            opened = self._open("reset", reader)
            with hold(opened.warehouse.root, JOIN, 0.0, self._locking_spark()):
                return reset(opened.engine, opened.warehouse)

    def _ingest_frame(self, relation: str, frame: DataFrame, label: str | None = None) -> IngestResult:
        """``ingest_frame`` under the ingest lock."""
        from pipelines.bronze.ingest import ingest_frame

        def ingest(opened: _Opened, rel: Relation) -> list[IngestResult]:
            return [ingest_frame(opened.engine, opened.warehouse, rel, frame, opened.config.relations, label)]

        (result,) = self._ingesting(relation, ingest)
        return result

    def _ingesting(
        self, relation: str, ingest: Callable[[_Opened, Relation], list[IngestResult]]
    ) -> list[IngestResult]:
        """Run ``ingest`` on the opened warehouse under the ingest lock (ingests queue: each takes the next places in
        the arrival order), the definition recorded before any row lands."""
        from pipelines.definition import record
        from state.join.relations import relation as named
        from state.log.lock import INGEST

        with (
            self._call("ingest"),
            self._lock("ingest", INGEST, None) as held,
            ExitStack() as pin,
        ):
            opened = self._open("ingest", pin=pin, kept=held.unchanged)
            rel = named(
                relation, opened.warehouse.relations
            )  # an unknown relation is refused before anything is recorded
            table = opened.config.spec(rel.name).table
            if table is not None:
                raise LakejoinError(
                    f"relation {rel.name} reads table {table} in place and takes no files: 'lakejoin run' joins what "
                    "the table gains"
                )
            with opened.engine.pinned():  # the lock is held: what this call writes, only it writes
                record(opened.engine, opened.warehouse, opened.settled)  # bronze's _id and _ts are derived under it
                return ingest(opened, rel)

    def _lock(self, command: str, job: str, wait: float | None) -> AbstractContextManager[Held]:
        """The warehouse's ``job`` lock for ``command``, which opens the warehouse under it, its takings recorded. A
        command that does not create a warehouse is refused first where there is none: a catalog schema would get a
        lease table."""
        from state.layout import Warehouse, is_catalog_schema
        from state.log.checks import not_a_warehouse
        from state.log.lock import hold

        creates = _creates(command, self._given or Config.of())
        if (
            not creates
            and is_catalog_schema(self.root)
            and not self.spark.catalog.tableExists(Warehouse(self.root).definition)
        ):
            raise not_a_warehouse(self.root)
        return hold(self.root, job, wait, self._locking_spark(), self._takings)

    def _locking_spark(self) -> SparkSession | None:
        """The session a catalog warehouse's lease is taken through (state/log/lease.py); a folder's lock needs none."""
        from state.layout import is_catalog_schema

        return self.spark if is_catalog_schema(self.root) else None

    def _reader(self) -> DeltaReader | None:
        """delta-rs alone, for a command that only reads tables or drops them, when the pipeline has no Spark to hand:
        no caller's or running session, no Spark Connect server, not on Databricks, and a local warehouse folder.
        Either engine's tables read the same, so the command then starts no JVM whatever engine wrote them."""
        from pyspark.sql import SparkSession

        from pipelines.spark import REMOTE
        from state.engines.deltars import DeltaRsReader
        from state.engines.jvm import classic_spark_running
        from state.log.lock import is_local

        if (
            self._spark is not None
            or os.environ.get(REMOTE)
            or "DATABRICKS_RUNTIME_VERSION" in os.environ
            or not is_local(self.root)
        ):
            return None
        if SparkSession.getActiveSession() is not None or classic_spark_running():
            return None
        return DeltaRsReader()

    def _open(
        self, command: str, reader: DeltaReader | None = None, pin: ExitStack | None = None, kept: bool = False
    ) -> _Opened:
        """The warehouse checked for ``command`` and the config in force: the one given, checked against the recorded
        definition (which it may extend), else the recorded one. ``reset`` drops the tables of the recorded one.
        With a ``reader`` (``_reader``) no Spark starts, unless a relation reads a catalog table, which needs Spark.
        ``pin``: a call that took its lock first (an ingest, a run) pins the engine there as soon as it is made, so what
        the checks look up is not looked up again; ``kept``: its taking found no other since this pipeline's last
        (``Held.unchanged``), so what the engine saw of the tables then is still their newest."""
        from pipelines.definition import Settled, in_force, recorded, settle
        from state.engines.delta_log import is_connect
        from state.layout import Warehouse
        from state.log.checks import check_ingest_target, require_engine_for, require_warehouse
        from state.log.lock import is_local

        given = self._given or Config.of()
        creates = _creates(command, given)
        if reader is not None and not _names_catalog_tables(given):
            warehouse, engine = given.placed(Warehouse(self.root)), reader
        else:
            # A Spark Connect server resolves a relative path against its own working folder, not this process's.
            root = os.path.abspath(self.root) if is_connect(self.spark) and is_local(self.root) else self.root
            warehouse = given.placed(Warehouse(root))
            engine = self._engine(given.engine, warehouse.holds_catalog_tables, kept)
            if pin is not None:
                pin.enter_context(engine.pinned(kept))
        require_engine_for(warehouse, engine)
        if creates:  # a warehouse is created in an empty folder only
            check_ingest_target(engine, warehouse)
        else:
            require_warehouse(engine, warehouse)
        if command == "reset":
            current = in_force(recorded(engine, warehouse))
            settled = Settled(self._given or current)
            warehouse = current.placed(warehouse)
        else:
            settled = settle(engine, warehouse, self._given, command)
            warehouse = settled.config.placed(warehouse)
        if engine is reader and _names_catalog_tables(settled.config):
            engine = self._engine(settled.config.engine, True)
        elif engine is not reader and settled.config.engine not in ("auto", engine.name):
            engine = self._engine(settled.config.engine, warehouse.holds_catalog_tables)
            require_engine_for(warehouse, engine)
        return _Opened(engine, warehouse, settled)

    def _engine(self, name: str, catalog: bool, kept: bool = False) -> DeltaEngine:
        """The pipeline's engine of that kind, built once: its open tables and what it knows of their snapshots (a
        column's maximum at a version) serve the next call instead of being read again. Each call forgets the tables
        it holds open (``refresh``), as another process may have replaced one since, unless they are ``kept``."""
        from state.engines import make_engine

        engine = self._engines.get((name, catalog))
        if engine is None:
            engine = self._engines[(name, catalog)] = make_engine(self.spark, name, catalog=catalog)
        elif not kept:
            engine.refresh()
        return engine

    def _require_folder(self, command: str) -> None:
        from state.log.lock import is_local

        if not _creates(command, self._given or Config.of()) and is_local(self.root) and not os.path.isdir(self.root):
            raise LakejoinError(f"no warehouse at {self.root}: land files there first with 'lakejoin ingest'")

    @contextmanager
    def _call(self, command: str) -> Iterator[None]:
        """A call's frame: a warehouse folder that is not there is refused before Spark starts; a lakejoin error is
        raised without the chain of Spark errors behind it."""
        try:
            self._require_folder(command)
            yield
        except LakejoinError as exc:
            raise exc from None


def _names_catalog_tables(config: Config) -> bool:
    """A relation reads a Unity Catalog table, which only Spark can open."""
    from state.layout import is_table_name

    return any(spec.table is not None and is_table_name(spec.table) for spec in config.relations.values())


def _path_of(warehouse: Warehouse, name: str) -> str:
    """The path of the table called ``name`` (``gold``, ``bronze/r``, ``silver/r_state``, ...); one line listing the
    names when there is none."""
    tables = warehouse.tables()
    path = warehouse.gold if name == "gold" else warehouse.path_of(name)
    if path not in tables:
        names = ", ".join(sorted(warehouse.name_of(each) for each in tables))
        raise LakejoinError(f"no table {name!r} in {warehouse.root}: use one of gold, {names}")
    return path


def _existing(name: str, table: T | None, root: str) -> T:
    if table is None:
        raise LakejoinError(
            f"table {name!r} of {root} does not exist yet: it is written by the first ingest or run that has rows for "
            "it"
        )
    return table


def _creates(command: str, config: Config) -> bool:
    """Whether ``command`` may create the warehouse: an ingest, or a run whose relations read source tables or
    landing folders (it ingests them)."""
    return command == "ingest" or (command == "run" and (config.reads_tables or bool(config.landings)))


def _config(config: str | os.PathLike | Mapping | Config | None) -> Config | None:
    if config is None or isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        return config_from(dict(config), "config")
    return load_config(os.fspath(config))


def _reporting(into: list, progress: Callable | None) -> Callable:
    """Collects what a step reports into ``into``, handing each to ``progress`` too."""

    def report(item: object) -> None:
        into.append(item)
        if progress is not None:
            progress(item)

    return report


def _files(
    opened: _Opened, rel: Relation, files: list[str], progress: Callable[[IngestResult], None] | None
) -> list[IngestResult]:
    from pipelines.bronze.ingest import ingest_files

    return ingest_files(
        opened.engine, opened.warehouse, rel, files, opened.config.relations, progress or (lambda _: None)
    )


def _join_pending(
    opened: _Opened,
    config: Config,
    report: Callable,
    stop: Callable[[], bool],
    *,
    record: Callable[[], None],
    held: Held,
    takings: Takings,
) -> None:
    """Ingest the source tables' new versions, then join every pending arrival and the files new in the landing folders
    (unless ``stop`` says so), handing ``report`` each source's result, what each batch landed and each batch;
    ``record`` records the definition before the first write; ``held``, the run's lock, is proved held before each
    batch writes and before it commits; ``takings``, the pipeline's record of the locks' takings."""
    from pipelines.bronze.landing import require_landing
    from pipelines.bronze.sources import ingest_sources
    from pipelines.silver import look_again, run
    from state.join.relations import relation
    from state.log.lock import INGEST, hold

    for name, folder in config.landings.items():
        require_landing(
            folder, relation(name, opened.warehouse.relations).name
        )  # before the definition is recorded: a refused run writes nothing
    with opened.engine.pinned():  # the run's lock is held; the ingest lock and each batch forget what others write
        if config.reads_tables:
            record()
            # new rows take places in the order
            with hold(opened.warehouse.root, INGEST, None, opened.engine.spark, takings) as ingesting:
                look_again(opened.engine, opened.warehouse, takings, ingest_unchanged=ingesting.unchanged)
                for result in ingest_sources(opened.engine, opened.warehouse, config.relations):
                    report(result)
        run(
            opened.engine,
            opened.warehouse,
            config,
            progress=report,
            stop=stop,
            before_writing=record,
            fence=held.check,
            takings=takings,
        )
