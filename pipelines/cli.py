"""``lakejoin``: ingest raw files to bronze, join them into gold, inspect or rebuild a warehouse, run the demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from importlib.metadata import version
from typing import TYPE_CHECKING, NoReturn

from pipelines.commands.terminal import without_native_panics
from state.config import Config
from state.config_file import load_config
from state.errors import LakejoinError

if TYPE_CHECKING:  # Spark loads only for the commands that need it, so --help and argument errors stay fast
    from pyspark.sql import SparkSession

    from pipelines.api import Pipeline
    from pipelines.bronze.ingest import IngestResult
    from pipelines.bronze.sources import SourceResult
    from pipelines.silver import BatchReport


DEFAULT_TRIGGER = 10.0  # seconds between two looks for new arrivals of 'run --follow'


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakejoin", description=__doc__)
    parser.add_argument("--version", action="version", version=f"lakejoin {version('lakejoin')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, warehouse_required: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--warehouse",
            required=warehouse_required,
            metavar="DIR",
            help="root folder of the Delta tables, or a Unity Catalog schema 'catalog.schema'",
        )
        sub.add_argument(
            "--config",
            metavar="FILE",
            help="YAML config (docs/config.md); the first one given is kept in the warehouse and used when none is "
            "given",
        )
        sub.add_argument(
            "--verbose",
            action="store_true",
            help="show Spark's start-up lines, PySpark's error log and native libraries' panic messages",
        )
        sub.add_argument(
            "--master",
            metavar="URL",
            help="the Spark master to start lakejoin's session on (spark://host:7077; default: LAKEJOIN_MASTER, else "
            "local[2])",
        )
        sub.add_argument(
            "--remote",
            metavar="URL",
            help="run as a client of the Spark Connect server at URL (sc://host:15002; default: SPARK_REMOTE, else a "
            "local Spark)",
        )
        return sub

    ingest = command(
        "ingest", "append raw arrivals (.jsonl, .csv, .parquet) to a relation's bronze table (bronze/NAME)"
    )
    which = ingest.add_mutually_exclusive_group(required=True)
    which.add_argument("--relation", metavar="NAME", help="the relation the files belong to, as the config names it")
    which.add_argument("--side", choices=["r", "s"], help="the same, for a join of r and s (the default relations)")
    ingest.add_argument("files", nargs="*", metavar="FILE", help="ingested in this order, line by line")
    ingest.add_argument(
        "--landing", metavar="DIR", help="instead of FILEs: every new file under DIR (Auto Loader on Databricks)"
    )
    ingest.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="on Databricks, Auto Loader's checkpoint (default: the landing DIR's _lakejoin_checkpoint/WAREHOUSE/NAME)",
    )

    run = command("run", "join every pending arrival in micro-batches, then exit (or, with --follow, keep joining)")
    run.add_argument(
        "--max-batch-rows", type=_positive, metavar="N", help="arrivals per micro-batch (config: max_batch_rows)"
    )
    run.add_argument(
        "--follow",
        action="store_true",
        help="keep running: join new arrivals every --trigger seconds until SIGTERM or Ctrl-C, which let the batch "
        "under way commit, then exit 0",
    )
    run.add_argument(
        "--trigger",
        type=_seconds,
        metavar="SECONDS",
        help=f"with --follow: seconds between looks for new arrivals (default {DEFAULT_TRIGGER:g})",
    )
    run.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when another run holds the warehouse, wait this long for it before giving up (default 0: exit 3 at once)",
    )
    run.add_argument(
        "--refusals-since",
        type=_instant,
        metavar="TIME",
        help="also exit 2 for the files the landing refused for good since TIME (ISO 8601, UTC unless it says): a "
        "Databricks job passes its run's start, so that a retried try fails as the try that refused them did",
    )

    status = command("status", "show every table's version and rows, the last batch, pending arrivals and watermarks")
    status.add_argument("--json", action="store_true", help="print the status as JSON")

    show = command("show", "print the first rows of gold, or of another of the warehouse's tables")
    show.add_argument(
        "--table",
        default="gold",
        metavar="NAME",
        help="gold (default), bronze/NAME, silver/NAME_state, silver/batches, quarantine/ingest, ...",
    )
    show.add_argument("--limit", type=_positive, default=20, metavar="N", help="rows to print (default 20)")

    validate = command(
        "validate", "run every data-quality suite over the whole tables, reconcile gold, write Data Docs"
    )
    validate.add_argument(
        "--docs", metavar="DIR", help="where Great Expectations writes Data Docs (default: DIR/quality/gx)"
    )

    maintain = command("maintain", "OPTIMIZE every table (bronze sorted on arrival order), then VACUUM old files")
    maintain.add_argument(
        "--retention-hours",
        type=_positive,
        default=168,
        metavar="H",
        help="VACUUM keeps files any version of the last H hours needs (default and minimum 168)",
    )

    advance = command(
        "advance",
        "declare that no record of a relation older than TIME will come (a backfill done): rows waiting on it come out",
    )
    advance.add_argument("--relation", required=True, metavar="NAME", help="the relation, as the config names it")
    advance.add_argument(
        "--to",
        required=True,
        metavar="TIME",
        help="an event time as the relation's records give it (2026-11-25T00:00:00Z, 2026-11-25, 1200)",
    )

    reset = command("reset", "drop silver and gold (bronze stays) so the next run rebuilds them from bronze")
    reset.add_argument("--yes", action="store_true", help="confirm: without it, reset changes nothing")

    serve = commands.add_parser(
        "serve",
        help="start a local Spark that outlives commands: while it is up, commands connect to it instead of starting a "
        "JVM",
        description="start a local Spark (and a Spark Connect server on 127.0.0.1, token-protected, for this user "
        "only) that every computing command connects to instead of starting a JVM; it stops on --stop or after "
        "--idle-minutes",
    )
    serve.add_argument("--stop", action="store_true", help="stop the running server")
    serve.add_argument(
        "--idle-minutes",
        type=float,
        default=60.0,
        metavar="M",
        help="stop after M minutes with no command (default 60)",
    )
    serve.add_argument("--port", type=int, metavar="N", help="the port on 127.0.0.1 (default: a free one)")
    serve.add_argument(
        "--verbose", action="store_true", help="the server's log (server.log) with Spark's start-up lines"
    )

    failed = commands.add_parser(
        "failed",
        help="a job's last task: exit 1 naming the tasks whose state is a failure, 0 when there is none",
        description="the bundle's jobs end with it, run whatever the other tasks ended in: it fails when one of the "
        "tasks given did not succeed (failed, timed out, upstream failed), so that the run ends FAILED (Databricks "
        "judges a run by its leaf tasks) and its on_failure notifications are sent",
    )
    failed.add_argument(
        "tasks", nargs="+", metavar="TASK=STATE", help="each task and its result state ({{tasks.TASK.result_state}})"
    )

    acceptance = command(
        "acceptance",
        "check on this compute what lakejoin takes from Databricks (the bundle's lakejoin-acceptance job): exit 1 if a "
        "guarantee failed",
    )
    acceptance.add_argument(
        "--report", metavar="FILE", help="also write each guarantee's outcome there as JSON lines (a Volume path)"
    )
    chosen = acceptance.add_mutually_exclusive_group()
    chosen.add_argument(
        "--fail",
        action="store_true",
        help="check nothing and exit 1: the job's forced failure, whose run must end FAILED and notify",
    )
    chosen.add_argument(
        "--seed",
        metavar="FOLDER",
        help="make the warehouse anew for the join jobs to join: a landing file and config.yml in FOLDER (a Volume "
        "path), a source table in the warehouse's schema",
    )
    chosen.add_argument(
        "--killed-join",
        metavar="FOLDER",
        help="on a seeded warehouse: a first try adds more records to FOLDER and the source table, then dies mid-batch "
        "as a killed process does; its retry (a mark in FOLDER says it is one) must resume that batch",
    )
    chosen.add_argument(
        "--seeded",
        action="store_true",
        help="check that gold holds the join of what --seed seeded, each pair once, after the join jobs ran",
    )

    demo = command(
        "demo",
        "generate an out-of-order stream, ingest and join it as a scheduled job would, check gold",
        warehouse_required=False,
    )
    demo.add_argument(
        "--rows", type=_positive, default=20_000, metavar="N", help="records per relation (default 20000)"
    )
    demo.add_argument("--keys", type=_positive, default=5_000, metavar="K", help="distinct join keys (default 5000)")
    demo.add_argument(
        "--skew",
        type=float,
        default=0.5,
        metavar="Z",
        help="Zipf exponent of key popularity; 0 is uniform (default 0.5)",
    )
    demo.add_argument(
        "--disorder", type=int, default=2_000, metavar="D", help="max arrival delay in seconds (default 2000)"
    )
    demo.add_argument(
        "--chunk-rows", type=_positive, default=4_000, metavar="C", help="arrivals per ingested chunk (default 4000)"
    )
    demo.add_argument(
        "--max-batch-rows", type=_positive, default=2_000, metavar="N", help="arrivals per micro-batch (default 2000)"
    )
    demo.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    demo.add_argument(
        "--relations",
        type=int,
        choices=[2, 3, 4],
        default=2,
        help="2: orders and payments (default); 3 or 4: trades, quotes, news (and fills) on one symbol within an hour",
    )
    demo.add_argument(
        "--join",
        choices=["inner", "left", "right", "full", "semi", "anti", "asof", "asof_left"],
        default="inner",
        help="inner (default); or orders without a payment within the hour too (left), payments without an order "
        "(right), both (full), orders with one (semi), orders without one (anti): each such row once the other's "
        "watermark makes it final; asof: each trade with the latest quote of its symbol at or before it, within the "
        "hour (asof_left: with none too)",
    )
    demo.add_argument(
        "--engine", metavar="NAME", help="the Delta engine: auto, delta-rs or spark (config: engine; default auto)"
    )
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


def _instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an ISO 8601 time (2026-12-05T10:15:00Z), got {text}") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def exit_with_status(argv: Sequence[str] | None = None) -> NoReturn:
    """The ``lakejoin`` entry point: ends the process with the command's exit status itself, because a Databricks
    wheel task calls the entry point's function directly and ignores what it returns."""
    sys.exit(main(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``lakejoin`` command and return its exit status (0 done, 1 a check failed, 2 error, 3 busy)."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "failed":
        return _failed(args.tasks)
    if args.remote:
        os.environ["SPARK_REMOTE"] = args.remote  # where pipelines/spark.py, and PySpark itself, look for the server
    if args.master:
        os.environ["LAKEJOIN_MASTER"] = args.master  # where pipelines/spark.py looks for it
    with nullcontext() if args.verbose else without_native_panics():
        try:
            given = load_config(args.config) if args.config else None  # a bad config fails before Spark starts
            if given is not None:
                from expectations.rules import check_policies  # loading the suites can fail: within the try

                check_policies(given.quality)
            if args.command == "demo":
                from pipelines.commands.demo import DemoOptions, run_demo

                options = DemoOptions(
                    args.rows,
                    args.keys,
                    args.skew,
                    args.disorder,
                    args.chunk_rows,
                    args.max_batch_rows,
                    args.seed,
                    args.relations,
                    args.join,
                )
                return 0 if run_demo(options, given, args.engine, args.warehouse, verbose=args.verbose) else 1
            return _on_warehouse(args, given)
        except LakejoinError as exc:
            print(f"lakejoin: error: {exc}", file=sys.stderr)
            return exc.exit_code


def _on_warehouse(args: argparse.Namespace, given: Config | None) -> int:
    """Commands on one warehouse: cheap argument checks first, then Spark and the command, through ``Pipeline``
    (pipelines/api.py), which checks the definition and records the config given as the command needs."""
    from pipelines.api import Pipeline

    if args.command == "run" and args.trigger is not None and not args.follow:
        raise LakejoinError(
            "--trigger sets how often 'run --follow' looks for new arrivals: add --follow, or drop --trigger"
        )
    if args.command == "ingest" and bool(args.files) == bool(args.landing):
        raise LakejoinError("ingest takes FILEs or --landing DIR (one of the two)")
    if args.command == "reset" and not args.yes:
        raise LakejoinError(
            f"reset drops silver and gold of {args.warehouse} (bronze stays) and nothing was changed: "
            "rerun with --yes to confirm"
        )
    if args.command == "acceptance":
        return _acceptance(args)
    commands = {
        "ingest": _ingest,
        "run": _run,
        "status": _status,
        "show": _show,
        "validate": _validate,
        "maintain": _maintain,
        "reset": _reset,
        "advance": _advance,
    }
    with _served_spark(args) as spark, Pipeline(args.warehouse, given, spark, verbose=args.verbose) as pipeline:
        return commands[args.command](args, pipeline)


COMPUTING = frozenset({"ingest", "run", "validate", "maintain", "advance", "acceptance"})


def _served_spark(args: argparse.Namespace) -> AbstractContextManager[SparkSession | None]:
    """A session on the running ``lakejoin serve`` for a command that computes, unless a Spark of its own is asked for
    (``--remote``, ``--master``, ``SPARK_REMOTE``, ``LAKEJOIN_MASTER``); else None: the command's own Spark, as
    before."""
    from pipelines.commands import server

    chosen = os.environ.get("SPARK_REMOTE") or os.environ.get(
        "LAKEJOIN_MASTER"
    )  # main() puts --remote and --master there
    running = None if chosen or args.command not in COMPUTING else server.running()
    return nullcontext() if running is None else server.attached(running, args.verbose)


def _serve(args: argparse.Namespace) -> int:
    from pipelines.commands import server

    try:
        if args.stop:
            stopped = server.stop()
            print(f"stopped the lakejoin server (pid {stopped.pid})" if stopped else "no lakejoin server is up")
            return 0
        if args.idle_minutes <= 0:
            raise LakejoinError(f"--idle-minutes must be positive, got {args.idle_minutes:g}")
        print(server.start(args.idle_minutes, args.port, args.verbose).describe())
        return 0
    except LakejoinError as exc:
        print(f"lakejoin: error: {exc}", file=sys.stderr)
        return exc.exit_code


SUCCEEDED = frozenset({"success", "excluded"})  # a task's result states that are no failure


def _failed(tasks: list[str]) -> int:
    """A job run's verdict, as its leaf: exit 1 naming each task whose state is no success, else 0."""
    states = dict(task.partition("=")[::2] for task in tasks)
    named = ", ".join(
        f"{task} ({state or 'no state'})" for task, state in states.items() if state.lower() not in SUCCEEDED
    )
    if not named:
        print(f"every task succeeded or was skipped: {', '.join(tasks)}")
        return 0
    print(f"lakejoin: error: this run failed at {named}: the failed task's output says why", file=sys.stderr)
    return 1


def _acceptance(args: argparse.Namespace) -> int:
    from pipelines.api import Pipeline
    from pipelines.commands.acceptance import FORCED, accept, joined_as_seeded, killed_join, report, seed

    if args.fail:
        print(f"lakejoin: error: {FORCED}", file=sys.stderr)
        return 1
    with _served_spark(args) as served, Pipeline(args.warehouse, spark=served, verbose=args.verbose) as pipeline:
        if args.seed:
            print(f"seeded {args.warehouse}: its config is {seed(pipeline.spark, args.warehouse, args.seed)}")
            return 0
        if args.killed_join:
            outcomes = [killed_join(pipeline.spark, args.warehouse, args.killed_join)]
        elif args.seeded:
            outcomes = [joined_as_seeded(pipeline.spark, args.warehouse)]
        else:
            outcomes = accept(pipeline.spark, args.warehouse)
    for outcome in outcomes:
        print(outcome.line(), flush=True)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as handle:
            handle.write(report(outcomes))
    return 0 if all(outcome.passed for outcome in outcomes) else 1


def _ingest(args: argparse.Namespace, pipeline: Pipeline) -> int:
    relation = args.relation or args.side
    if args.landing:
        results = pipeline.ingest_landing(relation, args.landing, args.checkpoint, progress=_print_outcome)
    else:
        results = pipeline.ingest(relation, args.files, progress=_print_outcome)
    return 2 if any(result.refused is not None for result in results) else 0


def _run(args: argparse.Namespace, pipeline: Pipeline) -> int:
    follow = (args.trigger or DEFAULT_TRIGGER) if args.follow else None
    report = pipeline.run(args.max_batch_rows, follow=follow, wait=args.wait, progress=_print_outcome)
    if report.interrupted:
        print("stopped before the work under way finished: the next run resumes an unfinished batch", flush=True)
    print(report.describe())
    earlier = [] if args.refusals_since is None or report.refused else _refused_since(pipeline, args.refusals_since)
    for path, reason in earlier:
        print(f"lakejoin: error: refused since {args.refusals_since.isoformat()}: {path}: {reason}", file=sys.stderr)
    return 2 if report.refused or earlier else 0


def _refused_since(pipeline: Pipeline, since: datetime) -> list[tuple[str, str]]:
    """The files the landing refused for good since ``since``, as the batch log recorded them: a Databricks retry of
    a try that refused a file finds it recorded, takes it no more, and must still fail (docs/databricks.md)."""
    from pyspark.sql import functions as F

    try:
        batches = pipeline.table("silver/batches")
    except LakejoinError:  # no batch yet: nothing refused
        return []
    files = batches.where(F.col("recorded_at") >= F.lit(since)).select(F.explode("files").alias("file"))
    refused = files.where(F.col("file.refused").isNotNull()).select("file.path", "file.refused")
    return [(row["path"], row["refused"]) for row in refused.collect()]  # files refused by one job run: a few rows


def _print_outcome(done: IngestResult | SourceResult | BatchReport) -> None:
    """Each step's outcome as it ends; a file refused as a whole on stderr, as an error, and the command goes on."""
    if getattr(done, "refused", None) is not None:
        print(f"lakejoin: error: {done.describe()}", file=sys.stderr, flush=True)
    else:
        print(done.describe(), flush=True)


def _status(args: argparse.Namespace, pipeline: Pipeline) -> int:
    from pipelines.commands import server

    status = pipeline.status_report()
    running = server.running()
    if args.json:
        print(
            json.dumps(
                {
                    **status.as_dict(),
                    "server": None
                    if running is None
                    else {"pid": running.pid, "port": running.port, "version": running.version},
                },
                indent=2,
            )
        )
    else:
        print(status.describe())
        print(server.describe_running(running))
    return 0 if status.problem is None else 1


def _show(args: argparse.Namespace, pipeline: Pipeline) -> int:
    rows = pipeline.head(args.table, args.limit + 1)  # one more than shown: whether there are more
    records_first = sorted(rows.column_names, key=lambda name: name.startswith("_"))  # bookkeeping (_id, _ts, ...) last
    shown = rows.select(records_first).slice(0, args.limit)
    print(shown.to_pandas().to_string(index=False) if rows.num_rows else f"{args.table}: no rows yet")
    if rows.num_rows > args.limit:
        print(f"(the first {args.limit} rows; --limit N shows more)")
    return 0


def _validate(args: argparse.Namespace, pipeline: Pipeline) -> int:
    result = pipeline.validate(args.docs)
    print(result.describe())
    return 0 if result.success else 1


def _maintain(args: argparse.Namespace, pipeline: Pipeline) -> int:
    maintained = pipeline.maintain(args.retention_hours)
    print(f"optimized and vacuumed (retention {args.retention_hours} h): {', '.join(maintained)}")
    return 0


def _advance(args: argparse.Namespace, pipeline: Pipeline) -> int:
    print(pipeline.advance(args.relation, args.to))
    return 0


def _reset(args: argparse.Namespace, pipeline: Pipeline) -> int:
    dropped = pipeline.reset()
    print(f"dropped {', '.join(dropped)}" if dropped else "nothing to drop: silver and gold are empty")
    print(f"bronze is kept; 'lakejoin run --warehouse {args.warehouse}' rebuilds silver and gold from it")
    return 0


if __name__ == "__main__":
    exit_with_status()
