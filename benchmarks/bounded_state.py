"""Does a batch cost the same late in a long stream as early on? Bounded state says it should.

Streams the demo's generator (one record per relation per ts unit, Zipf keys, bounded disorder) through
ingest + run, chunk by chunk, with ``allowed_lateness`` = the disorder and a band window, and reports
the median seconds of the first and last tenth of batches (after a warm-up), their ratio (target
<= 1.3), and the state tables' sizes. Run it alone: timings on a shared machine are noisy.

    .venv/bin/python -m benchmarks.bounded_state [--rows N] [--window W] [--unbounded]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from benchmarks.report import tenths, write_json
from benchmarks.stream import replay
from expectations.reconcile import check_gold
from pipelines.commands.demo import DemoOptions, generate_stream, write_chunks
from pipelines.silver import BatchReport
from pipelines.spark import get_spark
from state.config import Config
from state.engines import make_engine
from state.layout import Warehouse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=60_000, help="records per relation (default 60000)")
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--disorder", type=int, default=2_000, help="max arrival delay; also the allowed lateness")
    parser.add_argument("--window", type=int, default=500, help="band window W in ts units (default 500)")
    parser.add_argument("--chunk-rows", type=int, default=4_000)
    parser.add_argument("--max-batch-rows", type=int, default=2_000)
    parser.add_argument("--warmup", type=int, default=3, help="batches left out before the first tenth")
    parser.add_argument("--unbounded", action="store_true", help="no lateness and no window: the full-history baseline")
    parser.add_argument("--out", default="benchmarks/results/bounded_state.json")
    args = parser.parse_args()

    options = DemoOptions(
        rows=args.rows,
        keys=args.keys,
        disorder=args.disorder,
        chunk_rows=args.chunk_rows,
        max_batch_rows=args.max_batch_rows,
    )
    bounds = {} if args.unbounded else {"allowed_lateness": args.disorder, "window": args.window}
    config = Config.of(max_batch_rows=args.max_batch_rows, engine="delta-rs", **bounds)
    workdir = tempfile.mkdtemp(prefix="lakejoin-bench-state-")
    warehouse = Warehouse(os.path.join(workdir, "warehouse"))
    chunks = write_chunks(generate_stream(options), workdir, args.chunk_rows)

    spark = get_spark()
    engine = make_engine(spark, "delta-rs")
    state_rows: list[dict[str, int]] = []

    def measure_state(number: int, reports: list[BatchReport]) -> None:
        state_rows.append({name: engine.read(path).count() for name, path in warehouse.buffers().items()})
        print(
            f"[chunk {number}/{len(chunks)}] batches {len(reports)}, last {reports[-1].seconds:.2f} s, state {state_rows[-1]}",
            flush=True,
        )

    started = time.perf_counter()
    batch_seconds = [report.seconds for report in replay(engine, warehouse, config, chunks, measure_state)]
    total = time.perf_counter() - started

    measured = batch_seconds[args.warmup :]
    early, late = tenths(measured)
    check = check_gold(engine, warehouse, config)
    result = {
        "config": {**vars(args), "bounded": not args.unbounded},
        "batches": len(batch_seconds),
        "batch_seconds": batch_seconds,
        "early_median_s": early,
        "late_median_s": late,
        "late_over_early": late / early,
        "p95_batch_s": statistics.quantiles(batch_seconds, n=20)[-1],
        "state_rows_final": state_rows[-1],
        "state_rows_max": {name: max(rows[name] for rows in state_rows) for name in state_rows[-1]},
        "pairs": check.actual,
        "check": "PASS" if check.passed else "FAIL",
        "total_s_including_ingest": total,
    }
    write_json(args.out, result)
    print(f"batches: {len(batch_seconds)} (warm-up {args.warmup})")
    print(
        f"median seconds per batch: first tenth {early:.3f}, last tenth {late:.3f}, ratio {late / early:.2f} (target <= 1.3)"
    )
    print(f"state rows at the end: {result['state_rows_final']}; largest: {result['state_rows_max']}")
    print(f"{check.describe()}\nwritten: {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()
