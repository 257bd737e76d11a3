"""Ingesting a small file per relation and joining it: the Python API in a warm session against the command line.

Each round lands the same two small JSON Lines files (``--rows`` records per relation) in a new warehouse, once with
``lakejoin ingest`` (one process per relation) and ``lakejoin run``, each process starting its own Spark, and once
with ``Pipeline.ingest`` and ``Pipeline.run`` in this process's session, warmed by a first round left out. Rounds
alternate between the two; the medians go to ``--out``. The command line's engine follows from its session as a
user's would (Delta's jars named: Delta on Spark), and the API is given the same one.

    .venv/bin/python -m benchmarks.api_vs_cli [--rows N] [--rounds K]
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

from benchmarks.report import write_json
from pipelines import Pipeline
from pipelines.spark import DELTA_JARS, get_spark
from state.engines import make_engine

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def landed_files(folder: str, rows: int) -> dict[str, str]:
    rng = random.Random(3)
    files = {}
    for side in "rs":
        files[side] = os.path.join(folder, f"{side}.jsonl")
        with open(files[side], "w", encoding="utf-8") as handle:
            for i in range(rows):
                handle.write(json.dumps({"id": f"{side}{i}", "ts": rng.randrange(1000), "key": f"k{rng.randrange(50)}"}) + "\n")
    return files


def by_cli(files: dict[str, str], warehouse: str, config: str) -> float:
    started = time.perf_counter()
    for side, path in files.items():
        _lakejoin("ingest", "--warehouse", warehouse, "--relation", side, path, "--config", config)
    _lakejoin("run", "--warehouse", warehouse, "--config", config)
    return time.perf_counter() - started


def by_api(spark: object, files: dict[str, str], warehouse: str, config: str) -> float:
    started = time.perf_counter()
    pipeline = Pipeline(warehouse, config, spark=spark)  # type: ignore[arg-type]
    for side, path in files.items():
        pipeline.ingest(side, path)
    pipeline.run()
    return time.perf_counter() - started


def _lakejoin(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pipelines.cli", *args], check=True, capture_output=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200, help="records per relation (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each (default 3)")
    parser.add_argument("--out", help="default benchmarks/results/api_vs_cli_<engine>.json")
    args = parser.parse_args()

    spark = get_spark()
    engine = make_engine(spark).name
    workdir = tempfile.mkdtemp(prefix="lakejoin-bench-api-")
    files = landed_files(workdir, args.rows)
    config = os.path.join(workdir, "pipeline.yml")
    with open(config, "w", encoding="utf-8") as handle:
        json.dump({"engine": engine}, handle)
    by_api(spark, files, os.path.join(workdir, "warm"), config)  # warms the session: left out
    cli, api = [], []
    for round_ in range(args.rounds):
        cli.append(by_cli(files, os.path.join(workdir, f"cli-{round_}"), config))
        api.append(by_api(spark, files, os.path.join(workdir, f"api-{round_}"), config))
        print(f"round {round_ + 1}: CLI {cli[-1]:.2f} s, API {api[-1]:.2f} s", flush=True)
    result = {
        "engine": engine,
        "delta_jars": bool(os.environ.get(DELTA_JARS)),
        "rows_per_relation": args.rows,
        "cli_s": cli,
        "api_s": api,
        "cli_median_s": statistics.median(cli),
        "api_median_s": statistics.median(api),
        "cli_over_api": statistics.median(cli) / statistics.median(api),
    }
    print(f"{engine}: ingest of two files + run, CLI {result['cli_median_s']:.2f} s, API {result['api_median_s']:.2f} s (x{result['cli_over_api']:.1f})")
    write_json(args.out or f"benchmarks/results/api_vs_cli_{engine.replace('-', '')}.json", result)


if __name__ == "__main__":
    main()
