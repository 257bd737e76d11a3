"""What ``make test`` costs: the suite as CI runs it, its wall time, its tests' count and its ten slowest tests.

Runs ``pytest -n 2 --dist worksteal --durations=10`` (the Makefile's test target) and reads pytest's own summary, or
reads that summary from the output of a run already made (``--log``, e.g. what ``.ci/run`` printed). Delta's jars
are used when ``LAKEJOIN_DELTA_JARS`` names them, as in CI; the results file says which.

    .venv/bin/python -m benchmarks.suite [--log FILE --commit SHA] [--out benchmarks/results/suite.json]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

from benchmarks.report import write_json
from pipelines.spark import DELTA_JARS

SUMMARY = re.compile(r"=+ (?:(\d+) failed, )?(\d+) passed(?:, (\d+) skipped)?.* in ([0-9.]+)s")
DURATION = re.compile(r"^([0-9.]+)s (call|setup|teardown) +(\S+)$", re.M)


def summary(output: str) -> dict:
    """pytest's counts, wall seconds and slowest tests from its output."""
    found = list(SUMMARY.finditer(output))
    if not found:
        raise SystemExit("no pytest summary line (N passed in S s) in the output")
    failed, passed, skipped, seconds = found[-1].groups()
    slowest = [
        {"seconds": float(seconds), "when": when, "test": test} for seconds, when, test in DURATION.findall(output)
    ]
    return {
        "passed": int(passed), "failed": int(failed or 0), "skipped": int(skipped or 0), "wall_s": float(seconds),
        "wall_min": float(seconds) / 60, "slowest": sorted(slowest, key=lambda each: -each["seconds"])[:10],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", help="read a finished run's output instead of running the suite")
    parser.add_argument("--commit", help="with --log: the commit that run tested (default: this checkout's)")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "suite.json"))
    args = parser.parse_args()
    if args.log:
        with open(args.log, encoding="utf-8") as handle:
            output = handle.read()
    else:
        ran = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", "2", "--dist", "worksteal", "--durations=10"],
            capture_output=True,
            text=True,
        )
        output = ran.stdout
    figures = summary(output)
    print(
        f"{figures['passed']} passed, {figures['failed']} failed, {figures['skipped']} skipped in {figures['wall_s']:.0f} s ({figures['wall_min']:.1f} min)"
    )
    tested = {"commit": args.commit} if args.commit else {}
    write_json(
        args.out, {"config": {**vars(args), "delta_jars": bool(os.environ.get(DELTA_JARS))}, **figures, **tested}
    )
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
