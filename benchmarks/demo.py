"""What `make demo` costs: `lakejoin demo` run as a newcomer runs it, in a process of its own, ``--runs`` times.

Records each run's pipeline time (the demo's own ``seconds:`` line: the chunks' ingests and batches, without Spark's
start-up and the final check) and its wall time, and the medians.

    .venv/bin/python -m benchmarks.demo [--engine delta-rs|spark] [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

from benchmarks.report import write_json
from pipelines.spark import DELTA_JARS


def run_demo(engine: str) -> tuple[float, float]:
    """One ``lakejoin demo``: its pipeline seconds and its wall seconds (delta-rs without Delta's jars in the session)."""
    env = {**os.environ}
    if engine == "delta-rs":
        env.pop(DELTA_JARS, None)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "demo", "--engine", engine],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    wall = time.perf_counter() - started
    found = re.search(r"^seconds: ([0-9.]+)", done.stdout, re.M)
    if found is None or "PASS" not in done.stdout:
        raise SystemExit(f"the demo did not pass:\n{done.stdout[-2000:]}")
    return float(found.group(1)), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["delta-rs", "spark"], default="delta-rs")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", help="default benchmarks/results/demo[_spark].json")
    args = parser.parse_args()
    args.out = args.out or f"benchmarks/results/demo{'' if args.engine == 'delta-rs' else '_spark'}.json"
    runs = []
    for number in range(args.runs):
        runs.append(run_demo(args.engine))
        print(f"run {number + 1}: {runs[-1][0]:.1f} s of pipeline time, {runs[-1][1]:.1f} s wall", flush=True)
    medians = {
        "pipeline_s": statistics.median(pipeline for pipeline, _ in runs),
        "wall_s": statistics.median(wall for _, wall in runs),
    }
    print(
        f"lakejoin demo on {args.engine}, median of {args.runs}: {medians['pipeline_s']:.1f} s of pipeline time, {medians['wall_s']:.1f} s wall"
    )
    write_json(
        args.out,
        {
            "config": vars(args),
            "runs": [{"pipeline_s": pipeline, "wall_s": wall} for pipeline, wall in runs],
            "medians": medians,
        },
    )
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
