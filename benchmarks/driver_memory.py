"""The driver's peak memory on Delta on Spark: ingesting a large file, and one batch of millions of pairs.

Each phase runs in a fresh process (its own Spark driver, ``spark.driver.memory`` small) on a fresh warehouse,
and reports its seconds and the peak resident memory of the Python driver and of the JVM (``VmHWM``): whatever
a phase brings to the driver shows in the first; in local mode the JVM also hosts the executors, so the
second bounds the whole job. ``--checkout`` runs the same phases on another checkout of lakejoin (e.g. a
``git worktree`` of an older commit), to compare designs on the same files. Needs Delta's JVM jars
(``LAKEJOIN_DELTA_JARS``). Run it alone.

    .venv/bin/python -m benchmarks.driver_memory [--rows 2000000] [--pair-rows 20000] [--pair-keys 100]
        [--driver-memory 1g] [--checkout PATH] [--out benchmarks/results/driver_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.report import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAYLOAD = "x" * 100  # a realistic record size for the large file: ~150 bytes a line


def peak_mib(pid: int | str = "self") -> float:
    """Peak resident memory of a process so far (Linux ``VmHWM``), in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    return kib / 1024


def write_jsonl(path: str, relation: str, rows: int, keys: int, payload: str) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for n in range(rows):
            handle.write(
                json.dumps({"id": f"{relation}{n}", "ts": n, "key": f"k{n % keys}", "payload": payload}) + "\n"
            )
    return path


def phase(name: str, files: dict[str, str], driver_memory: str, max_batch_rows: int) -> dict:
    """Run in the child: ingest ``files`` (relation -> path), then for ``pairs`` one silver batch."""
    from pyspark import SparkContext

    from pipelines import silver
    from pipelines.bronze.ingest import ingest_files
    from pipelines.spark import get_spark
    from state.config import Config
    from state.engines import make_engine
    from state.join.relations import RELATIONS
    from state.layout import Warehouse

    spark = get_spark(conf={"spark.driver.memory": driver_memory})
    jvm_pid = SparkContext._gateway.proc.pid  # type: ignore[union-attr]
    engine, warehouse = make_engine(spark, "spark"), Warehouse(tempfile.mkdtemp(prefix=f"lakejoin-memory-{name}-"))
    relations = {rel.name: rel for rel in RELATIONS}
    started, error, pairs = time.perf_counter(), None, 0
    try:
        for rel_name, path in files.items():
            ingest_files(engine, warehouse, relations[rel_name], [path])
        if name == "pairs":
            reports = silver.run(engine, warehouse, Config.of(engine="spark", max_batch_rows=max_batch_rows))
            pairs = sum(report.pairs for report in reports)
    except Exception as exc:  # noqa: BLE001 - an out-of-memory driver is a result to report, not a crash
        cause = str(getattr(exc, "java_exception", exc)).strip()  # a Py4JJavaError's own first line names no cause
        error = f"{type(exc).__name__}: {(cause.splitlines() or [''])[0][:300]}"
    result = {
        "seconds": round(time.perf_counter() - started, 1),
        "python_peak_mib": round(peak_mib(), 1),
        "jvm_peak_mib": round(peak_mib(jvm_pid), 1),
        "pairs": pairs,
        "error": error,
        "code": os.path.dirname(os.path.dirname(os.path.abspath(silver.__file__))),
    }
    spark.stop()
    return result


def run_phase(checkout: str, name: str, files: dict[str, str], driver_memory: str, max_batch_rows: int) -> dict:
    """``phase`` in a fresh process whose imports come from ``checkout``."""
    arguments = json.dumps(
        {"name": name, "files": files, "driver_memory": driver_memory, "max_batch_rows": max_batch_rows}
    )
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {ROOT!r}); from benchmarks.driver_memory import child; child()",
            arguments,
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if not lines:  # the process died: name the JVM's error if it logged one
        logged = child.stderr.strip().splitlines() or [""]
        cause = next((line for line in logged if "OutOfMemoryError" in line), logged[-1])
        return {"error": f"exit {child.returncode}: {cause.strip()[:300]}"}
    return json.loads(lines[-1])


def child() -> None:
    given = json.loads(sys.argv[-1])
    sys.path.insert(0, os.getcwd())  # the checkout's code before this one's
    print(json.dumps(phase(given["name"], given["files"], given["driver_memory"], given["max_batch_rows"])), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, default=2_000_000, help="rows of the large file (default 2,000,000, ~300 MB)"
    )
    parser.add_argument("--pair-rows", type=int, default=20_000, help="records per relation for the pairs batch")
    parser.add_argument("--pair-keys", type=int, default=100, help="keys they share: pairs = pair-rows^2 / pair-keys")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--checkout", default=ROOT, help="the lakejoin checkout to measure (default: this one)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    folder = tempfile.mkdtemp(prefix="lakejoin-memory-files-")
    large = write_jsonl(os.path.join(folder, "large.jsonl"), "r", args.rows, args.rows, PAYLOAD)
    pair_files = {
        rel: write_jsonl(os.path.join(folder, f"{rel}.jsonl"), rel, args.pair_rows, args.pair_keys, "p")
        for rel in ("r", "s")
    }
    checkout = os.path.abspath(args.checkout)
    print(
        f"{checkout}: spark.driver.memory={args.driver_memory}; large file {os.path.getsize(large) / 2**20:.0f} MiB "
        f"({args.rows} rows); pairs batch of {args.pair_rows**2 // args.pair_keys} pairs",
        flush=True,
    )
    figures = {
        "ingest": run_phase(checkout, "ingest", {"r": large}, args.driver_memory, 2 * args.pair_rows),
        "pairs": run_phase(checkout, "pairs", pair_files, args.driver_memory, 2 * args.pair_rows),
    }
    for name, row in figures.items():
        print(f"{name:<7} {json.dumps(row)}", flush=True)
    if args.out:
        write_json(
            args.out, {"config": vars(args), "file_mib": round(os.path.getsize(large) / 2**20), "phases": figures}
        )


if __name__ == "__main__":
    main()
