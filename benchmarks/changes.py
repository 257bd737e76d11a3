"""What a change feed costs a batch: one stream joined append-only, as a change feed of inserts only, and as a
change feed whose later chunks update and delete some of its records (docs/benchmarks.md, "Change feeds").

Each variant lands the demo's stream chunk by chunk in a warehouse of its own and runs after each chunk; reported
per variant: batches, the median seconds of a batch (after a warm-up), the changes applied and gold checked
against the join of the current records (``validate``'s reconciliation). Run it alone: timings are noisy.

    .venv/bin/python -m benchmarks.changes [--rows N] [--updates 0.1] [--deletes 0.05] [--engine spark]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import numpy as np
import pandas as pd

from benchmarks.report import write_json
from benchmarks.stream import replay
from expectations.reconcile import check_gold
from pipelines.commands.demo import DemoOptions, generate_stream, write_chunks
from pipelines.spark import get_spark
from state.config import Config
from state.engines import make_engine
from state.layout import Warehouse

CHANGES = {"op": "op", "sequence_by": "seq"}


def as_changes(stream: pd.DataFrame, updates: float, deletes: float, lag: int, keys: int, seed: int) -> pd.DataFrame:
    """``stream``'s records as inserts (``op`` c, ``seq`` their place), then a share of them updated (another key) and
    another share deleted, each change arriving ``lag`` arrivals after its record."""
    rng = np.random.default_rng(seed)
    inserts = stream.assign(op="c", seq=np.arange(len(stream)), place=np.arange(len(stream)) * 2.0)
    chosen = rng.permutation(len(stream))
    updated = inserts.iloc[np.sort(chosen[: int(updates * len(stream))])].copy()
    updated["key"] = rng.integers(0, keys, size=len(updated))
    updated["op"] = "u"
    deleted = inserts.iloc[np.sort(chosen[len(updated) : len(updated) + int(deletes * len(stream))])].copy()
    deleted["op"] = "d"
    changes = pd.concat([updated, deleted])
    changes["seq"] = len(stream) + np.arange(len(changes))
    changes["place"] = changes["place"] + 2 * lag + 1
    return (
        pd.concat([inserts, changes]).sort_values("place", kind="stable").drop(columns="place").reset_index(drop=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="records per relation (default 20000)")
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--chunk-rows", type=int, default=4_000)
    parser.add_argument("--max-batch-rows", type=int, default=2_000)
    parser.add_argument("--updates", type=float, default=0.10, help="share of records updated later (default 0.10)")
    parser.add_argument("--deletes", type=float, default=0.05, help="share of records deleted later (default 0.05)")
    parser.add_argument("--warmup", type=int, default=2, help="batches left out of each median")
    parser.add_argument(
        "--engine",
        default="delta-rs",
        choices=["delta-rs", "spark"],
        help="spark: Delta on Spark (LAKEJOIN_DELTA_JARS)",
    )
    parser.add_argument("--out", default="benchmarks/results/changes.json")
    args = parser.parse_args()

    options = DemoOptions(
        rows=args.rows, keys=args.keys, chunk_rows=args.chunk_rows, max_batch_rows=args.max_batch_rows
    )
    stream = generate_stream(options)
    inserts = as_changes(stream, 0.0, 0.0, args.chunk_rows, args.keys, options.seed)
    changed = as_changes(stream, args.updates, args.deletes, args.chunk_rows, args.keys, options.seed)
    feed = Config.of(
        relations={"r": {"changes": CHANGES}, "s": {"changes": CHANGES}},
        max_batch_rows=args.max_batch_rows,
        engine=args.engine,
    )
    variants = {
        "append-only": (Config.of(max_batch_rows=args.max_batch_rows, engine=args.engine), stream),
        "change feed, inserts only": (feed, inserts),
        f"change feed, {args.updates:.0%} updated and {args.deletes:.0%} deleted later": (feed, changed),
    }
    spark = get_spark()
    engine = make_engine(spark, args.engine)
    results = {}
    for name, (config, records) in variants.items():
        workdir = tempfile.mkdtemp(prefix="lakejoin-bench-changes-")
        warehouse = Warehouse(os.path.join(workdir, "warehouse"))
        reports = replay(engine, warehouse, config, write_chunks(records, workdir, args.chunk_rows))
        seconds = [report.seconds for report in reports][args.warmup :]
        check = check_gold(engine, warehouse, config)
        applied = engine.read(warehouse.batches).where("changes IS NOT NULL") if config.reads_changes else None
        counts = (
            {}
            if applied is None
            else {
                row["key"]: row["total"]
                for row in applied.selectExpr("explode(changes)")
                .groupBy("key")
                .agg({"value": "sum"})
                .withColumnRenamed("sum(value)", "total")
                .collect()
            }
        )
        results[name] = {
            "arrivals": len(records),
            "batches": len(reports),
            "median_batch_s": statistics.median(seconds),
            "gold_rows": check.actual,
            "check": "PASS" if check.passed else "FAIL",
            "changes": counts,
        }
        print(
            f"{name}: {len(reports)} batches, median {results[name]['median_batch_s']:.3f} s per batch, {check.actual} gold rows, {results[name]['check']}, {counts}",
            flush=True,
        )
    base = results["append-only"]["median_batch_s"]
    for name, result in results.items():
        result["over_append_only"] = result["median_batch_s"] / base
        print(f"{name}: {result['over_append_only']:.2f}x the append-only batch")
    write_json(args.out, {"config": vars(args), "variants": results})
    spark.stop()


if __name__ == "__main__":
    main()
