"""What one Delta-on-Spark commit costs, with and without an application transaction (``txnAppId``/``txnVersion``),
and as lakejoin's Spark engine makes it (a marker in ``userMetadata``, found again in the newest commits).

lakejoin records every write of a batch (its exactly-once protocol). Delta 4.4 checks an application transaction
by reading the snapshot's transactions, which it takes from a full state reconstruction (Spark jobs over the log)
rather than from the checksum file that already lists them; so the engine writes a marker instead (docs/design.md
section 3.4). This measures each alone: one-row appends to a fresh table, the three kinds in turn, and reports the
median seconds of each (commits that write a checkpoint, every tenth, reported apart). Needs Delta's JVM jars
(``LAKEJOIN_DELTA_JARS``).

    .venv/bin/python -m benchmarks.delta_commit [--commits 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import pyarrow as pa

from benchmarks.report import write_json
from pipelines.spark import DELTA_JARS, get_spark
from state.engines import Commit, session_has_delta
from state.engines.spark_delta import SparkDeltaEngine
from state.errors import LakejoinError

CHECKPOINT_INTERVAL = 10  # Delta's default: commit 10, 20, ... also writes a checkpoint
KINDS = ("with_txn", "without_txn", "lakejoin")  # Delta's app transaction, nothing, lakejoin's marker


def appends(engine: SparkDeltaEngine, commits: int, kind: str) -> list[float]:
    """Seconds of each one-row append to a new table (the first, which creates it, left out)."""
    path = tempfile.mkdtemp(prefix="lakejoin-commit-") + "/t"
    seconds = []
    for version in range(commits + 1):
        started = time.perf_counter()
        rows = pa.table({"id": [version], "note": ["x"]})
        if kind == "lakejoin":
            engine.append(path, rows, commit=Commit("benchmark", version))
        else:
            writer = engine.spark.createDataFrame(rows).write.format("delta").mode("append")
            if kind == "with_txn":
                writer = writer.option("txnAppId", "benchmark").option("txnVersion", version)
            writer.save(path)
        seconds.append(time.perf_counter() - started)
    return seconds[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/delta_commit.json")
    args = parser.parse_args()

    spark = get_spark()
    if not session_has_delta(spark):
        raise LakejoinError(f"this benchmark needs Delta Lake's JVM jars: set {DELTA_JARS} to their folder")
    engine = SparkDeltaEngine(spark)
    appends(engine, CHECKPOINT_INTERVAL, "with_txn")  # warm-up
    measured: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(args.rounds):
        for kind in KINDS:
            measured[kind] += appends(engine, args.commits, kind)

    def split(seconds: list[float]) -> tuple[list[float], list[float]]:
        """(plain commits, checkpointing commits): versions 1.. in order, each round's table the same way."""
        versions = [1 + i % args.commits for i in range(len(seconds))]
        plain = [s for s, v in zip(seconds, versions) if v % CHECKPOINT_INTERVAL]
        return plain, [s for s, v in zip(seconds, versions) if not v % CHECKPOINT_INTERVAL]

    figures = {}
    for kind, seconds in measured.items():
        plain, checkpointing = split(seconds)
        figures[kind] = {
            "commit_p50_s": statistics.median(plain),
            "checkpoint_commit_p50_s": statistics.median(checkpointing),
            "commits": len(seconds),
        }
        print(
            f"{kind:<12} {figures[kind]['commit_p50_s']:.3f} s per commit, {figures[kind]['checkpoint_commit_p50_s']:.3f} s with a checkpoint"
        )
    write_json(args.out, {"config": vars(args), "appends": figures})
    print(f"written: {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()
