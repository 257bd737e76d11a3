"""The main job: an out-of-order stream ingested in chunks interleaved with silver runs, then checked.

This is what a scheduled deployment does — land files, run the joiner, repeat — compressed into one
process, followed by the check every user should be able to run: gold equals the batch SQL join.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from expectations.reconcile import expected_gold, reconcile
from pipelines.config import Config
from pipelines.ingest import ingest_file
from pipelines.silver import run
from pipelines.spark import get_spark
from state.engines import make_engine
from state.layout import Warehouse
from state.relations import RELATIONS


@dataclass(frozen=True)
class DemoOptions:
    rows: int = 20_000  # records per relation
    keys: int = 5_000
    skew: float = 0.5  # Zipf exponent of key popularity
    disorder: int = 2_000  # a record arrives up to this many ts units late
    chunk_rows: int = 4_000  # arrivals per landed chunk
    max_batch_rows: int = 2_000
    seed: int = 7


def generate_stream(options: DemoOptions) -> pd.DataFrame:
    """Both relations' records in arrival order: ``relation, id, ts, key, payload``.

    Event times are shared by the two relations two at a time (so cross-relation ties occur), keys
    follow a Zipf law, and each record arrives up to ``disorder`` ts units after its event time.
    """
    rng = np.random.default_rng(options.seed)
    total = options.rows * len(RELATIONS)
    names = np.repeat([rel.name for rel in RELATIONS], options.rows)
    rng.shuffle(names)
    ts = np.arange(total) // len(RELATIONS)
    popularity = 1.0 / np.arange(1, options.keys + 1) ** options.skew
    keys = rng.choice(options.keys, size=total, p=popularity / popularity.sum())
    arrival = ts + rng.integers(0, options.disorder + 1, size=total)
    order = np.argsort(arrival, kind="stable")
    index = np.arange(total).astype(str)
    stream = pd.DataFrame(
        {
            "relation": names,
            "id": np.char.add(names, index),
            "ts": ts,
            "key": np.char.add("k", keys.astype(str)),
            "payload": np.char.add("payload-", index),
        }
    )
    return stream.iloc[order].reset_index(drop=True)


def write_chunks(stream: pd.DataFrame, folder: str, chunk_rows: int) -> list[list[tuple[str, str]]]:
    """JSON Lines files, one per relation per chunk of consecutive arrivals: ``[[(relation, path), ...], ...]``."""
    chunks = []
    for number, start in enumerate(range(0, len(stream), chunk_rows)):
        chunk = stream.iloc[start : start + chunk_rows]
        files = []
        for rel in RELATIONS:
            part = chunk[chunk["relation"] == rel.name].drop(columns="relation")
            if len(part):
                path = os.path.join(folder, f"chunk-{number:05d}-{rel.name}.jsonl")
                part.to_json(path, orient="records", lines=True)
                files.append((rel.name, path))
        chunks.append(files)
    return chunks


def run_demo(options: DemoOptions, config: Config, warehouse_root: str | None = None) -> bool:
    """Run the demo job, print its summary and the gold check; True when gold passes."""
    config = config.with_overrides(max_batch_rows=options.max_batch_rows)
    workdir = tempfile.mkdtemp(prefix="lakejoin-demo-")
    warehouse = Warehouse(warehouse_root or os.path.join(workdir, "warehouse"))
    print(f"lakejoin demo: {options.rows} records per relation, {options.keys} keys (skew {options.skew}), "
          f"disorder {options.disorder}, chunks of {options.chunk_rows}, batches of at most {options.max_batch_rows}")
    print(f"warehouse: {warehouse.root}")
    chunks = write_chunks(generate_stream(options), workdir, options.chunk_rows)

    spark = get_spark()
    try:
        engine = make_engine(spark, config.engine)
        print(f"engine: {engine.name}")
        started = time.perf_counter()
        batches = quarantined = late = 0
        batch_seconds = check_seconds = 0.0
        failures: Counter[str] = Counter()
        by_name = {rel.name: rel for rel in RELATIONS}
        for number, files in enumerate(chunks, start=1):
            landed = 0
            for name, path in files:
                result = ingest_file(spark, engine, warehouse, by_name[name], path)
                landed, quarantined = landed + result.landed, quarantined + result.quarantined
            reports = run(engine, warehouse, config)
            batches += len(reports)
            late += sum(sum(report.late.values()) for report in reports)
            batch_seconds += sum(report.seconds for report in reports)
            check_seconds += sum(report.check_seconds for report in reports)
            failures.update(Counter({rule: rows for report in reports for rule, rows in report.rule_failures.items()}))
            pairs = sum(report.pairs for report in reports)
            print(f"[chunk {number}/{len(chunks)}] {landed} arrivals landed, {len(reports)} batches, {pairs} pairs "
                  f"({time.perf_counter() - started:.1f} s)", flush=True)
        seconds = time.perf_counter() - started

        arrivals = options.rows * len(RELATIONS)
        check = reconcile(expected_gold(engine, warehouse, config.join_condition), engine.read(warehouse.gold))
        print(f"arrivals: {arrivals}  batches: {batches}  results: {check.actual}  quarantined: {quarantined}  late: {late}")
        print(f"seconds: {seconds:.1f}  rows per second: {arrivals / seconds:,.0f}")
        broken = ", ".join(f"{rule}: {rows} rows" for rule, rows in sorted(failures.items())) or "every rule passed on every batch"
        print(f"expectations ({config.quality.engine}): {check_seconds:.1f} s of {batch_seconds:.1f} s batch time "
              f"({check_seconds / max(batch_seconds, 1e-9):.0%}); {broken}")
        print(check.describe())
        return check.passed
    finally:
        spark.stop()
