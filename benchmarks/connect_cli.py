"""The command line as a Spark Connect client against a warm server, next to the command line starting its own Spark.

Each round lands one small JSON Lines file per relation (``--rows`` records each) and times three commands on each
system's own warehouse: ``lakejoin ingest`` of the first file, ``lakejoin run`` of the batch (after the second file's
ingest, untimed), and ``lakejoin status``. Systems: ``connect`` (``--remote URL``: a server already started, with
Delta; the engine is Delta on Spark), ``local-spark`` (a local session with Delta's jars from ``LAKEJOIN_DELTA_JARS``)
and ``local-delta-rs`` (a local session without them). Rounds interleave the systems after a warm-up round; the
medians go to ``--out``.

    .venv/bin/python -m benchmarks.connect_cli --remote sc://127.0.0.1:15002 [--rows N] [--rounds K]
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
from pipelines.spark import DELTA_JARS, REMOTE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("ingest", "run", "status")


def landed(folder: str, round_number: int, rows: int) -> dict[str, str]:
    rng = random.Random(round_number)
    files = {}
    for side in "rs":
        files[side] = os.path.join(folder, f"{side}-{round_number}.jsonl")
        with open(files[side], "w", encoding="utf-8") as handle:
            for i in range(rows):
                record = {"id": f"{side}{round_number}-{i}", "ts": round_number * 1000 + rng.randrange(1000), "key": f"k{rng.randrange(50)}"}
                handle.write(json.dumps(record) + "\n")
    return files


def one_round(env: dict[str, str], warehouse: str, files: dict[str, str]) -> dict[str, float]:
    seconds = {"ingest": _timed(env, "ingest", "--warehouse", warehouse, "--relation", "r", files["r"])}
    _timed(env, "ingest", "--warehouse", warehouse, "--relation", "s", files["s"])
    seconds["run"] = _timed(env, "run", "--warehouse", warehouse)
    seconds["status"] = _timed(env, "status", "--warehouse", warehouse)
    return seconds


def _timed(env: dict[str, str], *args: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipelines.cli", *args], check=True, capture_output=True, cwd=REPO, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", required=True, help="the Spark Connect server (with Delta), e.g. sc://127.0.0.1:15002")
    parser.add_argument("--rows", type=int, default=200, help="records per relation and round (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (default 3), after one warm-up")
    parser.add_argument("--out", default="benchmarks/results/connect_cli.json")
    args = parser.parse_args()

    base = {key: value for key, value in {**os.environ, "PYTHONPATH": REPO}.items() if key not in (REMOTE, DELTA_JARS)}
    systems = {"connect": {**base, REMOTE: args.remote}, "local-delta-rs": base}
    if os.environ.get(DELTA_JARS):
        systems["local-spark"] = {**base, DELTA_JARS: os.environ[DELTA_JARS]}
    root = tempfile.mkdtemp(prefix="lakejoin-connect-")
    timings: dict[str, dict[str, list[float]]] = {name: {command: [] for command in COMMANDS} for name in systems}
    for round_number in range(args.rounds + 1):
        files = landed(root, round_number, args.rows)
        for name, env in systems.items():
            seconds = one_round(env, os.path.join(root, name), files)
            if round_number:  # the first round warms the server and creates the warehouses
                for command, value in seconds.items():
                    timings[name][command].append(value)
            print(f"round {round_number} {name}: " + ", ".join(f"{command} {value:.1f} s" for command, value in seconds.items()), flush=True)
    medians = {name: {command: statistics.median(values) for command, values in commands.items()} for name, commands in timings.items()}
    print("\nmedian seconds per command")
    print(f"{'system':<16}" + "".join(f"{command:>10}" for command in COMMANDS))
    for name, commands in medians.items():
        print(f"{name:<16}" + "".join(f"{commands[command]:>10.2f}" for command in COMMANDS))
    write_json(args.out, {"rows": args.rows, "rounds": args.rounds, "medians_s": medians, "seconds": timings})


if __name__ == "__main__":
    main()
