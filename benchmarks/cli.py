"""A command's cost: ``lakejoin ingest`` and ``lakejoin run`` with and without ``lakejoin serve``, beside the Python API.

Each round lands one JSON Lines file of ``--rows`` records per relation (2 by default) in a new warehouse per system,
and times, per system, the ingest of the first file and the run that joins both (the second file's ingest untimed):

- ``cli``: each command a process starting its own Spark, as without a server;
- ``cli-served``: each command a process connecting to the ``lakejoin serve`` this benchmark started (in a
  ``LAKEJOIN_HOME`` of its own, stopped at the end);
- ``api``: ``Pipeline.ingest`` and ``Pipeline.run`` in this process's session, warm.

The engine follows from the session as a user's does: Delta on Spark when ``LAKEJOIN_DELTA_JARS`` names Delta's jars
(for this process, the commands and the server alike), delta-rs otherwise; ``make bench-cli`` runs both. Rounds
interleave the systems after a warm-up round left out; the medians go to ``--out``.

    .venv/bin/python -m benchmarks.cli [--rows 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from benchmarks.report import write_json
from pipelines import Pipeline
from pipelines.commands.server import HOME
from pipelines.spark import get_spark
from state.engines import make_engine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ("ingest", "run")
Timed = dict[str, float]


def landed_files(folder: str, rows: int, seed: int) -> dict[str, str]:
    rng = random.Random(seed)
    os.makedirs(folder)
    files = {}
    for side in "rs":
        files[side] = os.path.join(folder, f"{side}.jsonl")
        with open(files[side], "w", encoding="utf-8") as handle:
            for i in range(rows):
                handle.write(
                    json.dumps({"id": f"{side}{seed}-{i}", "ts": rng.randrange(1000), "key": f"k{rng.randrange(3)}"})
                    + "\n"
                )
    return files


def by_cli(files: dict[str, str], warehouse: str, env: dict[str, str]) -> Timed:
    def lakejoin(*args: str) -> float:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "pipelines.cli", *args, "--warehouse", warehouse],
            check=True,
            capture_output=True,
            cwd=REPO,
            env=env,
        )
        return time.perf_counter() - started

    (first, path), (second, other) = files.items()
    timed = {"ingest": lakejoin("ingest", "--relation", first, path)}
    lakejoin("ingest", "--relation", second, other)
    timed["run"] = lakejoin("run")
    return timed


def by_api(spark: object, files: dict[str, str], warehouse: str) -> Timed:
    pipeline = Pipeline(warehouse, spark=spark)  # type: ignore[arg-type]
    (first, path), (second, other) = files.items()
    started = time.perf_counter()
    pipeline.ingest(first, path)
    timed = {"ingest": time.perf_counter() - started}
    pipeline.ingest(second, other)
    started = time.perf_counter()
    pipeline.run()
    timed["run"] = time.perf_counter() - started
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2, help="records per relation per round (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of each system (default 5)")
    parser.add_argument("--out", help="default benchmarks/results/cli_<engine>.json")
    args = parser.parse_args()

    spark = get_spark()
    engine = make_engine(spark).name
    workdir = tempfile.mkdtemp(prefix="lakejoin-bench-cli-")
    own = {**os.environ, "PYTHONPATH": REPO, HOME: os.path.join(workdir, "no-server")}
    served = {**own, HOME: os.path.join(workdir, "home")}
    subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "serve"], check=True, capture_output=True, cwd=REPO, env=served
    )
    systems: dict[str, Callable[[dict[str, str], str], Timed]] = {
        "cli": lambda files, warehouse: by_cli(files, warehouse, own),
        "cli-served": lambda files, warehouse: by_cli(files, warehouse, served),
        "api": lambda files, warehouse: by_api(spark, files, warehouse),
    }
    timings: dict[str, list[Timed]] = {name: [] for name in systems}
    try:
        for round_ in range(args.rounds + 1):  # the first warms every system: left out
            files = landed_files(os.path.join(workdir, f"files-{round_}"), args.rows, round_)
            for name, system in systems.items():
                timed = system(files, os.path.join(workdir, f"{name}-{round_}"))
                if round_:
                    timings[name].append(timed)
            if round_:
                print(
                    f"round {round_}: "
                    + "; ".join(
                        f"{name} ingest {t[-1]['ingest']:.2f} s, run {t[-1]['run']:.2f} s"
                        for name, t in timings.items()
                    ),
                    flush=True,
                )
    finally:
        subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "serve", "--stop"], capture_output=True, cwd=REPO, env=served
        )
    medians = {
        name: {step: statistics.median(t[step] for t in timed) for step in STEPS} for name, timed in timings.items()
    }
    ratios = {
        f"{step}_{over}": medians[a][step] / medians[b][step]
        for step in STEPS
        for over, a, b in (("served_over_api", "cli-served", "api"), ("cli_over_served", "cli", "cli-served"))
    }
    for step in STEPS:
        print(
            f"{engine} {step}: "
            + ", ".join(f"{name} {medians[name][step]:.2f} s" for name in systems)
            + f"; served / API {ratios[f'{step}_served_over_api']:.2f} (target <= 2), CLI / served {ratios[f'{step}_cli_over_served']:.1f} (target >= 5)"
        )
    write_json(
        args.out or f"benchmarks/results/cli_{engine.replace('-', '')}.json",
        {
            "engine": engine,
            "rows_per_relation": args.rows,
            "rounds": args.rounds,
            "seconds": timings,
            "median_s": medians,
            "ratios": ratios,
        },
    )


if __name__ == "__main__":
    main()
