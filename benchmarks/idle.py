"""How long after a relation stops do the rows waiting on it come out? A left join replayed in real time.

Orders (r) and payments (s) from the demo's generator are landed chunk by chunk with a run after each, as a job on
a trigger would; halfway through, payments stop while orders go on. With ``idle_after`` on payments, the first
batch that starts once they have been quiet that long takes them as idle and writes the orders still waiting
for a payment; without it those orders wait. Reported: the delay from payments' last arrival to the commit of that
batch, the rows it released, and the orders still waiting at the end without ``idle_after``.

    .venv/bin/python -m benchmarks.idle [--idle-after SECONDS] [--trigger SECONDS]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from benchmarks.report import write_json
from pipelines.bronze.ingest import ingest_files
from pipelines.commands.demo import DemoOptions, generate_stream, write_chunks
from pipelines.commands.status import warehouse_status
from pipelines.silver import run
from pipelines.spark import get_spark
from state.config import Config
from state.engines import make_engine
from state.engines.table import Tables
from state.join.relations import relation
from state.layout import Warehouse
from state.log.progress import last_arrivals


def replay(engine, config: Config, chunks: list[list[tuple[str, str]]], trigger: float, patience: float) -> dict:  # noqa: ANN001 - an engine
    """Land ``chunks`` with a run after each, then keep running every ``trigger`` seconds until a batch has taken
    payments as idle (or ``patience`` seconds pass)."""
    warehouse = Warehouse(os.path.join(tempfile.mkdtemp(prefix="lakejoin-bench-idle-"), "warehouse"))
    for files in chunks:
        for name, path in files:
            ingest_files(engine, warehouse, relation(name, warehouse.relations), [path], config.relations)
        run(engine, warehouse, config)
        time.sleep(trigger)
    waited = 0.0
    while waited < patience and not _idle_batches(engine, warehouse):
        time.sleep(trigger)
        waited += trigger
        run(engine, warehouse, config)
    released = _idle_batches(engine, warehouse)
    tables = Tables.of(engine, warehouse)
    stopped = last_arrivals(tables.ingest_log, tables.batches)["s"] / 1e6
    result = {"waiting_at_end": warehouse_status(engine, warehouse, config).waiting[0]["records"]}
    if released:
        batch_id, committed = released[0]
        gold = engine.read(warehouse.gold, where=f"batch_id = {batch_id} AND _s_id IS NULL")
        result |= {"release_batch": batch_id, "delay_s": committed - stopped, "rows_released": gold.count()}
    return result


def _idle_batches(engine, warehouse: Warehouse) -> list[tuple[int, float]]:  # noqa: ANN001 - an engine
    """The committed batches whose plan took a relation as idle: (batch id, commit time in seconds since the epoch)."""
    log = engine.read(warehouse.batches)
    if log is None or "idle" not in log.columns:
        return []
    idle = log.where("size(idle) > 0").orderBy("batch_id")
    return [
        (row["batch_id"], row["recorded_at"].timestamp()) for row in idle.select("batch_id", "recorded_at").collect()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000, help="orders, and payments before they stop (default 4000)")
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--chunk-rows", type=int, default=1_000)
    parser.add_argument(
        "--idle-after", type=int, default=10, help="seconds without a payment before payments are idle (default 10)"
    )
    parser.add_argument("--trigger", type=float, default=2.0, help="seconds between runs (default 2)")
    parser.add_argument("--out", default="benchmarks/results/idle.json")
    args = parser.parse_args()

    options = DemoOptions(rows=args.rows, keys=args.keys, disorder=200, chunk_rows=args.chunk_rows)
    stream = generate_stream(options)
    half = len(stream) // 2
    stopped = stream[(stream.index < half) | (stream["relation"] == "r")]  # payments stop halfway through
    workdir = tempfile.mkdtemp(prefix="lakejoin-bench-idle-")
    chunks = write_chunks(stopped.reset_index(drop=True), workdir, args.chunk_rows)
    bounds = {"join": "left", "window": 100, "allowed_lateness": 200, "engine": "delta-rs"}
    spark = get_spark()
    engine = make_engine(spark, "delta-rs")
    results = {}
    for name, idle in (("idle_after", {"idle_after": f"{args.idle_after} seconds"}), ("without", {})):
        config = Config.of(relations={"r": {"required": ["key"]}, "s": {"required": ["key"], **idle}}, **bounds)
        results[name] = replay(
            engine, config, chunks, args.trigger, patience=args.idle_after * 4 if idle else args.idle_after * 2
        )
        print(f"{name}: {results[name]}", flush=True)
    write_json(args.out, {"config": vars(args), "results": results})
    spark.stop()


if __name__ == "__main__":
    main()
