"""Where a step's time goes, named: each step of a cycle (``benchmarks/costs.py`` ``Cycles``) of 2 records per relation
and of 10,000, its wall time, each Spark job it ran named by where it started (its first stage's name: the Python line
that asked for it, past the engine), its Delta commits and each result it brought to the driver (a collect, an Arrow
or pandas conversion) named the same way. Every change to a batch's fixed cost is measured against it, step by step.
A job Delta starts on a thread of its own carries the name its thread inherited (Spark's call site is a thread's
inheritable property), or a JVM frame's.

    .venv/bin/python -m benchmarks.profile [--engine delta-rs|spark] [--log-reader auto|public|jvm] [--out FILE]

A classic session only: over Spark Connect the jobs are the server's to name.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import pyspark.traceback_utils as spark_traceback
from pyspark.sql import SparkSession
from pyspark.traceback_utils import CallSite, first_spark_call

from benchmarks.costs import Cycles, commit_files, jobs_submitted, watching_commands

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
ENGINE = os.path.join("state", "engines", "")  # the engine's modules, which only carry a call to Spark
# Records per relation and keys: a few-row cycle (on 2 keys, as bench-costs), then a micro-batch's worth (a key per
# record: each pairs with the other relation's record at its place)
SIZES: dict[int, int | None] = {2: 2, 10_000: None}
# The JVM's methods that hand a result to Python (a DataFrame's ``collect``, ``first``, ``toArrow``, ``toPandas``,
# ``toLocalIterator``, ``tail``).
COLLECTING = frozenset({"collectToPython", "collectAsArrowToPython", "toPythonIterator", "tailToPython"})


@dataclass
class Profile:
    """What a step did; filled in when it ends."""

    seconds: float = 0.0
    jobs: list[str] = field(default_factory=list)
    commits: int = 0
    collects: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.seconds:6.2f} s {len(self.jobs):4d} jobs {self.commits:3d} commits {len(self.collects):4d} collects"
        )


@contextlib.contextmanager
def profiled(spark: SparkSession, root: str) -> Iterator[Profile]:
    """Profile the block on the classic session ``spark``, commits under the folder ``root``."""
    profile = Profile()
    commits_before, first_job = commit_files(root), jobs_submitted(spark)
    started = time.perf_counter()
    with _named_past_the_engine(), _collects(spark, profile.collects):
        yield profile
    profile.seconds = time.perf_counter() - started
    profile.commits = len(commit_files(root) - commits_before)
    profile.jobs = _job_names(spark, first_job, jobs_submitted(spark))


def _job_names(spark: SparkSession, first: int, last: int) -> list[str]:
    """Jobs ``first`` to ``last`` (excluded), each by its first stage's name, once the scheduler's events are in."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    tracker, names = spark.sparkContext.statusTracker(), []
    for job in range(first, last):
        info = tracker.getJobInfo(job)
        stage = None if info is None or not list(info.stageIds) else tracker.getStageInfo(min(info.stageIds))
        names.append(_short("unknown" if stage is None else stage.name))
    return names


@contextlib.contextmanager
def _collects(spark: SparkSession, sites: list[str]) -> Iterator[None]:
    """Each result the driver hands to Python while the block runs, by the line that asked for it: the calls to the
    JVM that send one (``COLLECTING``), watched where they are sent, so that no frame of the profile's own comes between
    that line and PySpark (which names a job by that line too)."""

    def collecting(command: str) -> None:
        parts = command.split("\n", 3)
        if parts[0] == "c" and len(parts) > 2 and parts[2] in COLLECTING:
            site = _first_call_past_the_engine()
            sites.append(_short(f"{site.function} at {site.file}:{site.linenum}" if site else "unknown"))

    with watching_commands(spark, collecting):
        yield


@contextlib.contextmanager
def _named_past_the_engine() -> Iterator[None]:
    """PySpark names a job by the line that called into it, which is nearly always one of the engine's few (a read, a
    write): the line that called the engine names it instead (``collect at pipelines/batch/measure.py:118``)."""
    spark_traceback.first_spark_call = _first_call_past_the_engine
    try:
        yield
    finally:
        spark_traceback.first_spark_call = first_spark_call


def _first_call_past_the_engine() -> CallSite | None:
    """PySpark's ``first_spark_call``, with the engine's frames skipped on the way out; no source line is read, which
    PySpark's does for every frame at every call (in a step of Delta on Spark, seconds)."""
    stack = traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)
    stack.reverse()
    spark_dir = os.path.dirname(spark_traceback.__file__)
    entered = next((index for index, frame in enumerate(stack) if frame.filename.startswith(spark_dir)), None)
    if not entered:
        return first_spark_call()
    caller = entered - 1
    while caller > 0 and ENGINE in stack[caller].filename:
        caller -= 1
    return CallSite(function=stack[entered].name, file=stack[caller].filename, linenum=stack[caller].lineno)


def _short(site: str) -> str:
    """A call site with the repository's path taken off: ``collect at pipelines/batch/measure.py:118``."""
    return site.replace(REPO, "")


def main() -> None:
    from benchmarks.report import LOG_READERS, require_engine, use_log_reader, write_json
    from pipelines.spark import get_spark
    from state.engines.delta_log import is_connect

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["delta-rs", "spark"], default="delta-rs", help="lakejoin's Delta engine")
    parser.add_argument("--log-reader", choices=LOG_READERS, default="auto", help="Delta on Spark's log reader")
    parser.add_argument("--out", help="default benchmarks/results/profile[_spark].json")
    args = parser.parse_args()
    use_log_reader(args.log_reader)
    spark = get_spark()
    if is_connect(spark):
        raise SystemExit("benchmarks.profile needs a classic session: unset SPARK_REMOTE")
    require_engine(spark, args.engine)
    measured = {}
    for rows, keys in SIZES.items():
        with tempfile.TemporaryDirectory(prefix="lakejoin-profile-") as root:
            cycles = Cycles(spark, args.engine, root, rows=rows, keys=keys, measure=profiled)
            cycles.next()
            measured[str(rows)] = cycles.next()
    for rows, steps in measured.items():
        print(f"-- {rows} records per relation")
        for step, profile in steps.items():
            print(f"{step:<12} {profile.summary()}")
            for name, count in Counter(profile.jobs).most_common():
                print(f"    {count:3d} x {name}")
    write_json(
        args.out or f"benchmarks/results/profile{'' if args.engine == 'delta-rs' else '_spark'}.json",
        {
            "config": {**vars(args), "records_per_relation_and_keys": SIZES},
            "cycles": {
                rows: {step: asdict(profile) for step, profile in steps.items()} for rows, steps in measured.items()
            },
        },
    )


if __name__ == "__main__":
    main()
