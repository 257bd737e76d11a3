"""What one Delta-on-Spark commit costs, with and without an application transaction (``txnAppId``/``txnVersion``).

lakejoin gives every write of a batch an application transaction (its exactly-once protocol). Delta 4.4 checks
one by reading the snapshot's transactions, which it takes from a full state reconstruction (Spark jobs over the
log) rather than from the checksum file that already lists them. This measures that cost alone: one-row appends
to a fresh table, alternating tables with and without a transaction, and reports the median seconds of each
(commits that write a checkpoint, every tenth, reported apart). Needs Delta's JVM jars (``LAKEJOIN_DELTA_JARS``).

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
from state.engines import session_has_delta
from state.errors import LakejoinError

CHECKPOINT_INTERVAL = 10  # Delta's default: commit 10, 20, ... also writes a checkpoint


def appends(spark, commits: int, with_txn: bool) -> list[float]:  # noqa: ANN001
    """Seconds of each one-row append to a new table (the first, which creates it, left out)."""
    path = tempfile.mkdtemp(prefix="lakejoin-commit-") + "/t"
    seconds = []
    for version in range(commits + 1):
        started = time.perf_counter()
        writer = spark.createDataFrame(pa.table({"id": [version], "note": ["x"]})).write.format("delta").mode("append")
        if with_txn:
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
    appends(spark, CHECKPOINT_INTERVAL, True)  # warm-up
    kinds = {"with_txn": True, "without_txn": False}
    measured: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind, with_txn in kinds.items():
            measured[kind] += appends(spark, args.commits, with_txn)

    def split(seconds: list[float]) -> tuple[list[float], list[float]]:
        """(plain commits, checkpointing commits): versions 1.. in order, each round's table the same way."""
        versions = [1 + i % args.commits for i in range(len(seconds))]
        plain = [s for s, v in zip(seconds, versions) if v % CHECKPOINT_INTERVAL]
        return plain, [s for s, v in zip(seconds, versions) if not v % CHECKPOINT_INTERVAL]

    figures = {}
    for kind, seconds in measured.items():
        plain, checkpointing = split(seconds)
        figures[kind] = {"commit_p50_s": statistics.median(plain), "checkpoint_commit_p50_s": statistics.median(checkpointing), "commits": len(seconds)}
        print(f"{kind:<12} {figures[kind]['commit_p50_s']:.3f} s per commit, {figures[kind]['checkpoint_commit_p50_s']:.3f} s with a checkpoint")
    write_json(args.out, {"config": vars(args), "appends": figures})
    print(f"written: {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()
