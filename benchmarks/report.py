"""What every benchmark does with its figures at the end."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def write_json(path: str, figures: dict) -> None:
    """``figures`` as indented JSON at ``path``, creating its folder (``benchmarks/results`` by default), with the commit
    of the code that measured them, the day and the machine: the generated benchmarks page (``make bench-report``)
    names all three beside each table."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    measured = {"commit": MEASURED_ON, "day": datetime.date.today().isoformat(), "machine": machine()}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({**measured, **figures}, handle, indent=2)


def machine() -> str:
    """Where a figure was measured: timings only compare within one machine (and one sitting)."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {platform.system()}, Python {platform.python_version()}"


def measured_on() -> str:
    """The checkout's commit, with ``+changes`` when its tracked files other than results files differ from it
    (``unknown`` outside git): read when a benchmark starts (``MEASURED_ON``), since the code it measures is what it
    imported then. Results files are left out: a make target running several benchmarks rewrites them as it goes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__))
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ":(top)", ":(top,exclude)benchmarks/results")
    return commit + ("+changes" if changed else "")


def tenths(seconds: list[float]) -> tuple[float, float]:
    """The median seconds of the first and of the last tenth of the micro-batches (one batch at least): equal when a
    batch costs the same late in the stream as early, as bounded state should make it."""
    tenth = max(1, len(seconds) // 10)
    return statistics.median(seconds[:tenth]), statistics.median(seconds[-tenth:])


MEASURED_ON = measured_on()


LOG_READERS = ("auto", "public", "jvm")


def require_engine(spark: SparkSession, engine: str) -> None:
    """Refuse ``--engine spark`` on a session without Delta's jars, before anything is measured."""
    from state.engines import session_has_delta

    if engine == "spark" and not session_has_delta(spark):
        raise SystemExit("--engine spark needs Delta on Spark: set LAKEJOIN_DELTA_JARS to Delta's jars")


def use_log_reader(name: str) -> None:
    """Make Delta on Spark read table logs with the reader ``name`` (``auto``: the one lakejoin picks), so a benchmark
    measures the public reader Databricks runtimes use beside the JVM reader the pinned Delta allows
    (state/engines/spark_delta.py ``log_reader``)."""
    if name == "auto":
        return
    from state.engines import spark_delta
    from state.engines.jvm import JvmLog
    from state.engines.public_log import PublicLog

    spark_delta.log_reader = PublicLog if name == "public" else JvmLog  # type: ignore[assignment]
