"""What the data-quality rules add to a batch, at the demo's batch size.

A batch checks its rules inside the jobs it runs anyway (the measuring job and its writes), so their cost is what a
batch takes with them beside the same batch without them. This benchmark streams the demo's data (20,000 records
per relation, chunks of 4,000, batches of at most 2,000) through ingest + run twice in one Spark session: with every
rule at its default policy, and with no rules at all (a benchmark-only switch: ``bound_rules`` patched to bind
none; the product always checks its rules). Rounds alternate after a warm-up; the median batch of each and the
difference are written to JSON.

    .venv/bin/python -m benchmarks.expectations_cost [--rows N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from unittest import mock

from benchmarks.report import write_json
from benchmarks.stream import replay
from pipelines.commands.demo import DemoOptions, generate_stream, write_chunks
from pipelines.spark import get_spark
from state.config import Config
from state.engines import make_engine
from state.layout import Warehouse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="records per relation (default 20000, the demo's)")
    parser.add_argument("--max-batch-rows", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine", choices=("delta-rs", "spark"), default="delta-rs")
    parser.add_argument("--out", default="benchmarks/results/expectations_cost.json")
    args = parser.parse_args()

    options = DemoOptions(rows=args.rows, max_batch_rows=args.max_batch_rows)
    workdir = tempfile.mkdtemp(prefix="lakejoin-bench-dq-")
    chunks = write_chunks(generate_stream(options), workdir, options.chunk_rows)
    spark = get_spark()
    engine = make_engine(spark, args.engine)
    config = Config.of(max_batch_rows=args.max_batch_rows, engine=args.engine)

    def batches(name: str, number: int) -> list[float]:
        warehouse = Warehouse(os.path.join(workdir, f"warehouse-{name}-{number}"))
        if name == "rules":
            return [report.seconds for report in replay(engine, warehouse, config, chunks)]
        with mock.patch("expectations.batch.bound_rules", return_value=[]):
            return [report.seconds for report in replay(engine, warehouse, config, chunks)]

    batches("rules", 0)  # warm-up
    seconds: dict[str, list[float]] = {"rules": [], "none": []}
    for number in range(1, args.rounds + 1):
        for name in seconds:
            seconds[name] += batches(name, number)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    added = medians["rules"] - medians["none"]
    print(
        f"median batch: with the rules {medians['rules']:.3f} s, without {medians['none']:.3f} s; the rules add {added:.3f} s "
        f"({added / medians['rules']:.0%} of a batch), {args.engine}",
        flush=True,
    )
    write_json(
        args.out, {"config": vars(args), "median_batch_s": medians, "rules_s": added, "share": added / medians["rules"]}
    )
    spark.stop()


if __name__ == "__main__":
    main()
