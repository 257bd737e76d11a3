"""``lakejoin``: ingest raw files to bronze, join them into gold, inspect or rebuild a warehouse, run the demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from pipelines.config import Config, load_config
from state.errors import LakejoinError

if TYPE_CHECKING:  # Spark loads only for the commands that need it, so --help and argument errors stay fast
    from pipelines.ingest import IngestResult
    from pipelines.silver import BatchReport
    from state.engines import DeltaEngine
    from state.layout import Warehouse


DEFAULT_TRIGGER = 10.0  # seconds between two looks for new arrivals of 'run --follow'


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakejoin", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, warehouse_required: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--warehouse", required=warehouse_required, metavar="DIR",
            help="root folder of the Delta tables, or a Unity Catalog schema 'catalog.schema'",
        )
        sub.add_argument(
            "--config", metavar="FILE",
            help="YAML config (README: Config); the first one given is kept in the warehouse and used when none is given",
        )
        sub.add_argument("--verbose", action="store_true", help="show Spark's start-up lines and PySpark's error log")
        return sub

    ingest = command("ingest", "append raw arrivals (.jsonl, .csv, .parquet) to a relation's bronze table (bronze/NAME)")
    which = ingest.add_mutually_exclusive_group(required=True)
    which.add_argument("--relation", metavar="NAME", help="the relation the files belong to, as the config names it")
    which.add_argument("--side", choices=["r", "s"], help="the same, for a join of r and s (the default relations)")
    ingest.add_argument("files", nargs="*", metavar="FILE", help="ingested in this order, line by line")
    ingest.add_argument("--landing", metavar="DIR", help="instead of FILEs: every new file under DIR (Auto Loader on Databricks)")
    ingest.add_argument("--checkpoint", metavar="DIR", help="Auto Loader's checkpoint (default DIR/_lakejoin_checkpoint/NAME)")

    run = command("run", "join every pending arrival in micro-batches, then exit (or, with --follow, keep joining)")
    run.add_argument("--max-batch-rows", type=_positive, metavar="N", help="arrivals per micro-batch (config: max_batch_rows)")
    run.add_argument(
        "--follow", action="store_true",
        help="keep running: join new arrivals every --trigger seconds until SIGTERM or Ctrl-C, which let the batch under way commit, then exit 0",
    )
    run.add_argument(
        "--trigger", type=_seconds, metavar="SECONDS", help=f"with --follow: seconds between looks for new arrivals (default {DEFAULT_TRIGGER:g})"
    )
    run.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="when another run holds the warehouse, wait this long for it before giving up (default 0: exit 3 at once)",
    )

    status = command("status", "show every table's version and rows, the last batch, pending arrivals and watermarks")
    status.add_argument("--json", action="store_true", help="print the status as JSON")

    validate = command("validate", "run every data-quality suite over the whole tables, reconcile gold, write Data Docs")
    validate.add_argument("--docs", metavar="DIR", help="where Great Expectations writes Data Docs (default: DIR/quality/gx)")

    maintain = command("maintain", "OPTIMIZE every table (bronze sorted on arrival order), then VACUUM old files")
    maintain.add_argument(
        "--retention-hours", type=_positive, default=168, metavar="H",
        help="VACUUM keeps files any version of the last H hours needs (default and minimum 168)",
    )

    reset = command("reset", "drop silver and gold (bronze stays) so the next run rebuilds them from bronze")
    reset.add_argument("--yes", action="store_true", help="confirm: without it, reset changes nothing")

    demo = command("demo", "generate an out-of-order stream, ingest and join it as a scheduled job would, check gold", warehouse_required=False)
    demo.add_argument("--rows", type=_positive, default=20_000, metavar="N", help="records per relation (default 20000)")
    demo.add_argument("--keys", type=_positive, default=5_000, metavar="K", help="distinct join keys (default 5000)")
    demo.add_argument("--skew", type=float, default=0.5, metavar="Z", help="Zipf exponent of key popularity; 0 is uniform (default 0.5)")
    demo.add_argument("--disorder", type=int, default=2_000, metavar="D", help="max arrival delay in seconds (default 2000)")
    demo.add_argument("--chunk-rows", type=_positive, default=4_000, metavar="C", help="arrivals per ingested chunk (default 4000)")
    demo.add_argument("--max-batch-rows", type=_positive, default=2_000, metavar="N", help="arrivals per micro-batch (default 2000)")
    demo.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    demo.add_argument(
        "--relations", type=int, choices=[2, 3, 4], default=2,
        help="2: orders and payments (default); 3 or 4: trades, quotes, news (and fills) on one symbol within an hour",
    )
    demo.add_argument(
        "--join", choices=["inner", "left", "right", "full", "semi", "anti", "asof", "asof_left"], default="inner",
        help="inner (default); or orders without a payment within the hour too (left), payments without an order (right), both "
        "(full), orders with one (semi), orders without one (anti): each such row once the other's watermark makes it final; "
        "asof: each trade with the latest quote of its symbol at or before it, within the hour (asof_left: with none too)",
    )
    demo.add_argument("--engine", metavar="NAME", help="the Delta engine: auto, delta-rs or spark (config: engine; default auto)")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        given = load_config(args.config) if args.config else None  # a bad config fails before Spark starts
        if args.command == "demo":
            from pipelines.demo import DemoOptions, run_demo

            options = DemoOptions(args.rows, args.keys, args.skew, args.disorder, args.chunk_rows, args.max_batch_rows, args.seed, args.relations, args.join)
            return 0 if run_demo(options, given, args.engine, args.warehouse, verbose=args.verbose) else 1
        return _on_warehouse(args, given)
    except LakejoinError as exc:
        print(f"lakejoin: error: {exc}", file=sys.stderr)
        return exc.exit_code


def _on_warehouse(args: argparse.Namespace, given: Config | None) -> int:
    """Commands on one warehouse: cheap argument checks first, then Spark, the definition, then the command.

    ingest, run and maintain record the config they are given as the warehouse's definition (pipelines/definition.py):
    ingest before it lands anything, run right before its first write or once it succeeded (a run killed after some
    batches leaves them under the definition they were joined with; one stopped by a rule first leaves the warehouse
    as it was), maintain once it succeeded. The others
    check it against the recorded one and change nothing."""
    from pipelines.definition import Settled, in_force, record, recorded, recorder, settle
    from pipelines.spark import get_spark
    from state.checks import check_ingest_target, require_engine_for, require_warehouse
    from state.engines import make_engine
    from state.layout import Warehouse
    from state.lock import is_local
    from state.relations import relation

    if args.command == "run" and args.trigger is not None and not args.follow:
        raise LakejoinError("--trigger sets how often 'run --follow' looks for new arrivals: add --follow, or drop --trigger")
    # ingest creates a warehouse; so does a run whose relations read source tables (it ingests their versions)
    creates = args.command == "ingest" or (args.command == "run" and (given or Config()).reads_tables)
    if not creates and is_local(args.warehouse) and not os.path.isdir(args.warehouse):
        raise LakejoinError(f"no warehouse at {args.warehouse}: land files there first with 'lakejoin ingest'")
    if args.command == "ingest" and bool(args.files) == bool(args.landing):
        raise LakejoinError("ingest takes FILEs or --landing DIR (one of the two)")
    if args.command == "reset" and not args.yes:
        raise LakejoinError(
            f"reset drops silver and gold of {args.warehouse} (bronze stays) and nothing was changed: "
            "rerun with --yes to confirm"
        )
    spark = get_spark(verbose=args.verbose)
    try:
        commands = {"ingest": _ingest, "status": _status, "validate": _validate, "maintain": _maintain, "reset": _reset}
        warehouse, engine = Warehouse(args.warehouse, (given or Config()).joined), make_engine(spark, (given or Config()).engine)
        require_engine_for(warehouse, engine)
        if creates:  # before the definition is recorded: a warehouse is created in an empty folder only
            check_ingest_target(engine, warehouse)
        else:
            require_warehouse(engine, warehouse)
        if args.command == "reset":  # drops the tables of the definition in force; a given config takes over after
            current = in_force(recorded(engine, warehouse))
            settled = Settled(given or current)
            warehouse = replace(warehouse, relations=current.joined)
        else:
            settled = settle(engine, warehouse, given, args.command)
            warehouse = replace(warehouse, relations=settled.config.joined)
        if settled.config.engine not in ("auto", engine.name):
            engine = make_engine(spark, settled.config.engine)
            require_engine_for(warehouse, engine)
        if args.command == "ingest":  # an unknown relation is refused before anything is recorded
            relation(args.relation or args.side, warehouse.relations)
        if creates:  # bronze's _id and _ts are derived under it: recorded before any row lands
            record(engine, warehouse, settled)
        if args.command == "run":
            return _run(args, settled.config, engine, warehouse, recorder(engine, warehouse, settled))
        code = commands[args.command](args, settled.config, engine, warehouse)
        if args.command == "maintain":  # a maintain that fails leaves the definition as it was
            record(engine, warehouse, settled)
        return code
    finally:
        spark.stop()


def _ingest(args: argparse.Namespace, config: Config, engine: DeltaEngine, warehouse: Warehouse) -> int:
    from pipelines.ingest import ingest_files
    from pipelines.landing import ingest_landing
    from state.lock import INGEST, hold
    from state.relations import relation

    rel = relation(args.relation or args.side, warehouse.relations)
    table = config.spec(rel.name).table
    if table is not None:
        raise LakejoinError(f"relation {rel.name} reads table {table} in place and takes no files: 'lakejoin run' joins what the table gains")
    refused: list[IngestResult] = []

    def show(result: IngestResult) -> None:
        """Each file's outcome as it ends; a refused file on stderr, as an error, and the command goes on."""
        if result.refused is None:
            print(result.describe(), flush=True)
        else:
            print(f"lakejoin: error: {result.describe()}", file=sys.stderr, flush=True)
            refused.append(result)

    with hold(warehouse.root, INGEST, wait_seconds=None):  # ingests queue: each is short
        if args.landing:
            ingest_landing(engine, warehouse, rel, args.landing, args.checkpoint, show, config.relations)
        else:
            for result in ingest_files(engine.spark, engine, warehouse, rel, args.files, config.relations):
                show(result)
    return 2 if refused else 0


def _run(args: argparse.Namespace, config: Config, engine: DeltaEngine, warehouse: Warehouse, record: Callable[[], None]) -> int:
    from pipelines.follow import StopSignal
    from pipelines.silver import summarize
    from state.lock import JOIN, hold

    config = config.with_overrides(max_batch_rows=args.max_batch_rows)
    committed: list[BatchReport] = []
    with hold(warehouse.root, JOIN, args.wait):
        if not args.follow:
            _join_pending(engine, warehouse, config, committed.append, lambda: False, record)
        else:
            with StopSignal() as stop:
                try:
                    while True:
                        _join_pending(engine, warehouse, config, committed.append, stop.asked, record)
                        if stop.wait(args.trigger or DEFAULT_TRIGGER):
                            break
                except KeyboardInterrupt:  # a second signal: the work under way is abandoned
                    print("stopped before the work under way finished: the next run resumes an unfinished batch", flush=True)
        record()  # a run with nothing to write records the config it was given too
    print(summarize(committed) if committed else "nothing pending: every arrival is already joined")
    return 0


def _join_pending(
    engine: DeltaEngine,
    warehouse: Warehouse,
    config: Config,
    committed: Callable[[BatchReport], None],
    stop: Callable[[], bool],
    record: Callable[[], None],
) -> None:
    """Ingest the source tables' new versions, then join every pending arrival (unless ``stop`` says so), printing
    each batch and handing it to ``committed`` as it commits; ``record`` records the definition before the first
    write."""
    from pipelines.silver import run
    from pipelines.sources import ingest_sources
    from state.lock import INGEST, hold

    def report(batch: BatchReport) -> None:
        print(batch.describe(), flush=True)
        committed(batch)

    if config.reads_tables:
        record()
        with hold(warehouse.root, INGEST, wait_seconds=None):  # a source's rows take places in the arrival order
            for result in ingest_sources(engine, warehouse, config.relations):
                print(result.describe(), flush=True)
    run(engine, warehouse, config, progress=report, stop=stop, before_writing=record)


def _status(args: argparse.Namespace, config: Config, engine: DeltaEngine, warehouse: Warehouse) -> int:
    from pipelines.status import warehouse_status

    status = warehouse_status(engine, warehouse, config)
    print(json.dumps(status.as_dict(), indent=2) if args.json else status.describe())
    return 0 if status.problem is None else 1


def _validate(args: argparse.Namespace, config: Config, engine: DeltaEngine, warehouse: Warehouse) -> int:
    from expectations.audit import audit

    if args.docs is None and warehouse.in_catalog:
        raise LakejoinError("a Unity Catalog warehouse has no folder for Data Docs: pass --docs DIR (e.g. a Volumes path)")
    result = audit(engine, warehouse, config, args.docs or os.path.join(warehouse.root, "quality", "gx"))
    print(result.describe())
    return 0 if result.passed else 1


def _maintain(args: argparse.Namespace, config: Config, engine: DeltaEngine, warehouse: Warehouse) -> int:
    from pipelines.maintain import maintain
    from state.lock import JOIN, hold

    with hold(warehouse.root, JOIN, wait_seconds=None):  # a rewrite must not race a batch's MERGE: queue behind runs
        maintained = maintain(engine, warehouse, args.retention_hours)
    print(f"optimized and vacuumed (retention {args.retention_hours} h): {', '.join(maintained)}")
    return 0


def _reset(args: argparse.Namespace, config: Config, engine: DeltaEngine, warehouse: Warehouse) -> int:
    from pipelines.reset import reset
    from state.lock import JOIN, hold

    with hold(warehouse.root, JOIN):
        dropped = reset(engine, warehouse)
    print(f"dropped {', '.join(dropped)}" if dropped else "nothing to drop: silver and gold are empty")
    print(f"bronze is kept; 'lakejoin run --warehouse {warehouse.root}' rebuilds silver and gold from it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
