"""What a day of scheduled runs costs, estimated from two measurements rather than measured: the sizing page's worked day.

A run's cost is taken as a scheduled run that finds a few records (``bench-small`` (a): the fixed cost of a run,
everything but its rows) plus its arrivals at the backlog's cost per arrival (``bench-backlog``: one run landing
1,000,000 arrivals in 50 files, less that fixed cost). Both are medians of their results files; a day is
``runs_a_day`` such runs sharing ``records_a_day`` evenly. Nothing here runs Spark: it reads the two benchmarks'
results (run them first) and writes the estimate beside them.

    .venv/bin/python -m benchmarks.day [--records-a-day 10000000] [--runs-a-day 96] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.report import write_json

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ENGINES = {"delta-rs": "", "spark": "_spark"}


def measured(name: str) -> dict:
    with open(os.path.join(RESULTS, name), encoding="utf-8") as handle:
        return json.load(handle)


def estimate(engine: str, records_a_day: int, runs_a_day: int) -> dict:
    """One engine's run and day, with the two measurements they come from."""
    suffix = ENGINES[engine]
    fixed = measured(f"small{suffix}.json")["medians"]["scheduled run"]["lakejoin"]
    backlog = measured(f"backlog{suffix}.json")
    arrivals = 2 * backlog["config"]["files"] * backlog["config"]["file_rows"]
    backlog_s = backlog["systems"]["lakejoin"]["total_s"]
    per_million = (backlog_s - fixed) / arrivals * 1e6
    run_arrivals = records_a_day / runs_a_day
    run_s = fixed + run_arrivals / 1e6 * per_million
    return {
        "scheduled_run_s": fixed, "backlog_s": backlog_s, "backlog_arrivals": arrivals, "per_million_arrivals_s": per_million,
        "run_arrivals": run_arrivals, "run_s": run_s, "day_s": run_s * runs_a_day, "day_min": run_s * runs_a_day / 60,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records-a-day", type=int, default=10_000_000, help="every relation's records together")
    parser.add_argument("--runs-a-day", type=int, default=96, help="96: every 15 minutes, the bundle's default")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "day.json"))
    args = parser.parse_args()
    engines = {engine: estimate(engine, args.records_a_day, args.runs_a_day) for engine in ENGINES}
    for engine, figures in engines.items():
        print(
            f"{engine}: a run of {figures['run_arrivals']:,.0f} arrivals {figures['run_s']:.1f} s "
            f"({figures['scheduled_run_s']:.2f} s + {figures['per_million_arrivals_s']:.1f} s a million), a day {figures['day_min']:.1f} min"
        )
    write_json(args.out, {"config": vars(args), "engines": engines})
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
