"""How a batch's cost grows with the number of relations joined: 2, 3 and 4, over the same arrivals.

Streams the N-way demo's market events (``lakejoin demo --relations N``: every member on one symbol, every two
within the window) through ingest + run, chunk by chunk, on delta-rs, with the same total of arrivals split
evenly over N relations, and reports per N the median and p95 seconds of a batch (after a warm-up), the
tuples, the state tables and their rows at the end, and the ratio of the median to N = 2's. Run it alone:
timings on a shared machine are noisy.

    .venv/bin/python -m benchmarks.nway [--arrivals A] [--window SECONDS]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from benchmarks.report import write_json
from benchmarks.stream import replay
from pipelines.commands.demo import DemoOptions, generate_stream, market_events, market_settings, write_chunks
from pipelines.spark import get_spark
from state.config import Config
from state.engines import make_engine
from state.layout import Warehouse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arrivals", type=int, default=24_000, help="records of every relation together (default 24000)"
    )
    parser.add_argument("--keys", type=int, default=2_000, help="symbols (default 2000)")
    parser.add_argument("--disorder", type=int, default=600, help="max arrival delay in seconds (default 600)")
    parser.add_argument("--window", default="5 minutes", help="every two members within this (default 5 minutes)")
    parser.add_argument("--chunk-rows", type=int, default=4_000)
    parser.add_argument("--max-batch-rows", type=int, default=2_000)
    parser.add_argument("--warmup", type=int, default=2, help="batches left out of the medians")
    parser.add_argument("--out", default="benchmarks/results/nway.json")
    args = parser.parse_args()

    spark = get_spark()
    engine = make_engine(spark, "delta-rs")
    measured = {}
    for n in (2, 3, 4):
        settings = {**market_settings(n), "window": args.window, "allowed_lateness": f"{args.disorder} seconds"}
        config = Config.of(**settings, max_batch_rows=args.max_batch_rows, engine="delta-rs")  # type: ignore[arg-type]
        options = DemoOptions(
            rows=args.arrivals // n, keys=args.keys, disorder=args.disorder, chunk_rows=args.chunk_rows, seed=7
        )
        workdir = tempfile.mkdtemp(prefix=f"lakejoin-bench-nway-{n}-")
        warehouse = Warehouse(os.path.join(workdir, "warehouse"), config.joined)
        names = [rel.name for rel in config.joined]
        chunks = write_chunks(generate_stream(options, names), workdir, args.chunk_rows, market_events)
        reports = replay(engine, warehouse, config, chunks)
        seconds = [report.seconds for report in reports][args.warmup :]
        state = {name: engine.read(path).count() for name, path in warehouse.buffers().items()}
        measured[n] = {
            "batches": len(reports),
            "median_batch_s": statistics.median(seconds),
            "p95_batch_s": statistics.quantiles(seconds, n=20)[-1],
            "tuples": sum(report.pairs for report in reports),
            "state_tables": len(state),
            "state_rows": sum(state.values()),
        }
        print(f"N = {n}: {measured[n]}", flush=True)
    for n, row in measured.items():
        row["median_over_n2"] = row["median_batch_s"] / measured[2]["median_batch_s"]
    write_json(args.out, {"config": vars(args), "by_relations": measured})
    spark.stop()


if __name__ == "__main__":
    main()
