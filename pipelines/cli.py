"""``lakejoin``: ingest raw files to bronze, run the silver joiner, or run the demo job."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pipelines.config import Config, load_config
from state.errors import LakejoinError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lakejoin", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, warehouse_required: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--warehouse", required=warehouse_required, metavar="DIR", help="root folder of the Delta tables")
        sub.add_argument("--config", metavar="FILE", help="YAML config (README: Config); defaults apply without one")
        return sub

    ingest = command("ingest", "append raw arrivals (.jsonl, .csv, .parquet) to bronze/r or bronze/s")
    ingest.add_argument("--side", required=True, choices=["r", "s"], help="the relation the files belong to")
    ingest.add_argument("files", nargs="+", metavar="FILE", help="ingested in this order, line by line")

    run = command("run", "join every pending arrival in micro-batches, then exit")
    run.add_argument("--max-batch-rows", type=_positive, metavar="N", help="arrivals per micro-batch (config: max_batch_rows)")

    demo = command("demo", "generate an out-of-order stream, ingest and join it as a scheduled job would, check gold", warehouse_required=False)
    demo.add_argument("--rows", type=_positive, default=20_000, metavar="N", help="records per relation (default 20000)")
    demo.add_argument("--keys", type=_positive, default=5_000, metavar="K", help="distinct join keys (default 5000)")
    demo.add_argument("--skew", type=float, default=0.5, metavar="Z", help="Zipf exponent of key popularity; 0 is uniform (default 0.5)")
    demo.add_argument("--disorder", type=int, default=2_000, metavar="D", help="max arrival delay in ts units (default 2000)")
    demo.add_argument("--chunk-rows", type=_positive, default=4_000, metavar="C", help="arrivals per ingested chunk (default 4000)")
    demo.add_argument("--max-batch-rows", type=_positive, default=2_000, metavar="N", help="arrivals per micro-batch (default 2000)")
    demo.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if args.command == "demo":
            from pipelines.demo import DemoOptions, run_demo

            options = DemoOptions(args.rows, args.keys, args.skew, args.disorder, args.chunk_rows, args.max_batch_rows, args.seed)
            return 0 if run_demo(options, config, args.warehouse) else 1
        return _run_command(args, config)
    except LakejoinError as exc:
        print(f"lakejoin: error: {exc}", file=sys.stderr)
        return 2


def _run_command(args: argparse.Namespace, config: Config) -> int:
    from pipelines.spark import get_spark
    from state.engines import make_engine
    from state.layout import Warehouse

    warehouse = Warehouse(args.warehouse)
    if args.command == "run" and "://" not in args.warehouse and not os.path.isdir(args.warehouse):
        raise LakejoinError(f"no warehouse at {args.warehouse}: land files there first with 'lakejoin ingest'")
    spark = get_spark()
    try:
        engine = make_engine(spark, config.engine)
        if args.command == "ingest":
            from pipelines.ingest import ingest_files
            from state.relations import relation

            for result in ingest_files(spark, engine, warehouse, relation(args.side), args.files):
                print(result.describe())
        else:
            from pipelines.silver import run

            reports = run(engine, warehouse, config.with_overrides(max_batch_rows=args.max_batch_rows), progress=print)
            if not reports:
                print("nothing pending: every arrival is already joined")
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
