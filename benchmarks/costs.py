"""What a block of work costs in what can be counted, not timed: Spark jobs, JVM round trips, Delta commits, and as a
Spark Connect client the requests it sends. Counts are deterministic, so a test holds a step to a budget (as Django's
``assertNumQueries`` does) where timings on a noisy two-core machine cannot (tests/test_costs.py).

    with counted(spark, root) as cost:
        pipeline.ingest("r", [path])
    cost.jobs, cost.round_trips, cost.commits

- **jobs**: every job the driver's scheduler was given while the block ran, on any thread, in a job group or not (the
  scheduler's own count of jobs submitted); None over Spark Connect, where the scheduler is the server's.
- **round trips**: py4j commands sent from Python to the driver's JVM, from any thread, but the finalizer's releases
  of Python's references (sent whenever the garbage collector runs, so not the block's own). Over Spark Connect: the
  client's requests (analyze, execute, config).
- **commits**: Delta commit files (``_delta_log/NNN.json``) that appeared under ``root``.

As a script: the steps of a cycle of two records per relation (``Cycles``), counted on the second cycle (the first
creates the tables and warms the session), beside the same work by hand in plain Spark (benchmarks/by_hand.py), the
floor.

    .venv/bin/python -m benchmarks.costs [--engine delta-rs|spark] [--log-reader auto|public|jvm] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Generic, TypeVar

from pyspark.sql import SparkSession

from benchmarks.small import SCHEMA, records, write_jsonl
from state.engines.delta_log import is_connect

# Spark Connect client methods that each send one request to the server.
CONNECT_REQUESTS = ("_analyze", "_execute", "_execute_and_fetch_as_iterator", "config")
RELEASE = "m\n"  # py4j's memory command: the finalizer releasing a reference, whenever the garbage collector runs
COUNTS = ("jobs", "round_trips", "commits")
# Measured: a step's calls to the JVM differ by up to ~1% with what the session did before (on Delta on Spark, an
# ingest's 3,522 in the tests' session and 3,558 in a session of its own); its jobs and commits do not.
CALLS_SLACK = 0.05  # so a budget holds in any order of the suite's tests, and a change of a few calls more still fails
Measure = TypeVar("Measure")  # what ``Cycles`` measures a step by: a ``Cost`` (``counted``), or a profile


@dataclass
class Cost:
    """What a block cost; filled in when it ends."""

    jobs: int | None = None
    round_trips: int = 0
    commits: int = 0

    def over(self, budget: Cost) -> list[str]:
        """Each count above ``budget``'s, saying by how much (empty when within it); calls to the JVM within
        ``CALLS_SLACK`` of it are within it."""
        slack = {"round_trips": 1 + CALLS_SLACK}
        return [
            f"{name} {mine} > {theirs} (+{mine - theirs})"
            for name in COUNTS
            if (mine := getattr(self, name)) is not None
            and (theirs := getattr(budget, name)) is not None
            and mine > theirs * slack.get(name, 1)
        ]


@contextlib.contextmanager
def counted(spark: SparkSession, root: str) -> Iterator[Cost]:
    """Count what the block costs on ``spark``, commits under the folder ``root``."""
    cost = Cost()
    commits_before = commit_files(root)
    if is_connect(spark):
        with _connect_requests(spark, cost):
            yield cost
    else:
        jobs_before = jobs_submitted(spark)
        with _round_trips(spark, cost):
            yield cost
        cost.jobs = jobs_submitted(spark) - jobs_before
    cost.commits = len(commit_files(root) - commits_before)


def commit_files(root: str) -> set[str]:
    return set(glob.glob(os.path.join(glob.escape(root), "**", "_delta_log", "*.json"), recursive=True))


def jobs_submitted(spark: SparkSession) -> int:
    """The driver's count of jobs submitted so far (the next job's id): jobs of every thread, unlike a job group."""
    return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())


@contextlib.contextmanager
def _round_trips(spark: SparkSession, cost: Cost) -> Iterator[None]:
    guard = threading.Lock()

    def count(command: str) -> None:
        if not command.startswith(RELEASE):
            with guard:
                cost.round_trips += 1

    with watching_commands(spark, count):
        yield


@contextlib.contextmanager
def watching_commands(spark: SparkSession, seen: Callable[[str], None]) -> Iterator[None]:
    """Each py4j command the classic session ``spark`` sends to its JVM while the block runs, from any thread, shown
    to ``seen`` before it is sent."""
    client = spark.sparkContext._gateway._gateway_client
    send = client.send_command

    def watching(command: str, *args: object, **kwargs: object) -> object:
        seen(command)
        return send(command, *args, **kwargs)

    client.send_command = watching
    try:
        yield
    finally:
        del client.send_command  # the class's own again


@contextlib.contextmanager
def _connect_requests(spark: SparkSession, cost: Cost) -> Iterator[None]:
    client = spark.client
    guard = threading.Lock()

    def counting(method: Callable) -> Callable:
        def request(*args: object, **kwargs: object) -> object:
            with guard:
                cost.round_trips += 1
            return method(*args, **kwargs)

        return request

    for name in CONNECT_REQUESTS:
        setattr(client, name, counting(getattr(client, name)))
    try:
        yield
    finally:
        for name in CONNECT_REQUESTS:
            delattr(client, name)


class Cycles(Generic[Measure]):
    """A few-row cycle's steps, each measured (``counted`` by default), on warehouses under ``root``: ``ingest`` (a file
    of ``rows`` records per relation), ``run`` (the batch that joins them), ``micro-batch`` (a DataFrame per relation
    through ``foreach_batch``, then the run that joins them), ``landing run`` (a run that lands a file per relation
    from its landing folders, then joins them); with ``floor``, ``by hand``: the ingest and run's work in plain Spark.
    Records on ``keys`` keys (``benchmarks/small.py`` ``records``). The first cycle creates the tables; the next ones
    are what a step costs."""

    def __init__(
        self,
        spark: SparkSession,
        engine: str,
        root: str,
        floor: bool = True,
        rows: int = 2,
        keys: int | None = 2,
        measure: Callable[[SparkSession, str], AbstractContextManager[Measure]] = counted,
    ) -> None:
        from benchmarks.by_hand import RELATIONS, ByHand
        from pipelines.api import Pipeline

        self.spark, self.root, self.done, self.measure = spark, root, 0, measure
        self.records = partial(records, count=rows, keys=keys)
        self.rows = rows
        relations = {name: {"required": ["key"]} for name in RELATIONS}
        self.landing = {name: os.path.join(root, "landing", name) for name in RELATIONS}
        self.given = Pipeline(
            os.path.join(root, "given"), config={"relations": relations, "engine": engine}, spark=spark
        )
        landed = {name: {**spec, "landing": self.landing[name]} for name, spec in relations.items()}
        self.landed = Pipeline(
            os.path.join(root, "landed"), config={"relations": landed, "engine": engine}, spark=spark
        )
        self.by_hand = ByHand(spark, engine, os.path.join(root, "by-hand")) if floor else None

    def next(self) -> dict[str, Measure]:
        number, rows, spark, measure, measured = self.done, self.rows, self.spark, self.measure, {}
        given, landed = (os.path.join(self.root, name) for name in ("given", "landed"))
        files = {
            name: write_jsonl(
                os.path.join(self.root, "files", f"{name}-{number}.jsonl"), self.records(name, rows * number)
            )
            for name in self.landing
        }
        with measure(spark, given) as measured["ingest"]:
            for name, path in files.items():
                self.given.ingest(name, path)
        with measure(spark, given) as measured["run"]:
            self.given.run()
        frames = {  # places of their own, after every file's
            name: spark.createDataFrame(self.records(name, rows * (50 + number)), SCHEMA) for name in self.landing
        }
        with measure(spark, given) as measured["micro-batch"]:
            for name, frame in frames.items():
                self.given.foreach_batch(name)(frame, number)
            self.given.run()
        for name, folder in self.landing.items():
            write_jsonl(os.path.join(folder, f"{number}.jsonl"), self.records(name, rows * number))
        with measure(spark, landed) as measured["landing run"]:
            self.landed.run()
        if self.by_hand is not None:
            with measure(spark, self.by_hand.root) as measured["by hand"]:
                arrivals = {name: spark.read.schema(SCHEMA).json(path) for name, path in files.items()}
                self.by_hand.land(arrivals)
                self.by_hand.join(arrivals, number + 1)
        self.done += 1
        return measured


def main() -> None:
    from benchmarks.report import LOG_READERS, require_engine, use_log_reader, write_json
    from pipelines.spark import get_spark

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        choices=["delta-rs", "spark"],
        default="delta-rs",
        help="lakejoin's Delta engine (spark needs LAKEJOIN_DELTA_JARS)",
    )
    parser.add_argument(
        "--log-reader",
        choices=LOG_READERS,
        default="auto",
        help="Delta on Spark's log reader (default: the one lakejoin picks)",
    )
    parser.add_argument("--out", help="default benchmarks/results/costs[_spark].json")
    args = parser.parse_args()
    use_log_reader(args.log_reader)
    spark = get_spark()  # SPARK_REMOTE names a Spark Connect server: its client's requests are counted, without a floor
    require_engine(spark, args.engine)
    with tempfile.TemporaryDirectory(prefix="lakejoin-costs-") as root:
        cycles = Cycles(spark, args.engine, root, floor=not is_connect(spark))
        cycles.next()
        costs = cycles.next()
    print(f"{'step':<14} {'jobs':>5} {'round trips':>12} {'commits':>8}")
    for step, cost in costs.items():
        print(f"{step:<14} {cost.jobs!s:>5} {cost.round_trips:>12} {cost.commits:>8}")
    write_json(
        args.out or f"benchmarks/results/costs{'' if args.engine == 'delta-rs' else '_spark'}.json",
        {"config": vars(args), "steps": {step: asdict(cost) for step, cost in costs.items()}},
    )


if __name__ == "__main__":
    main()
