"""The two Delta engines on the same stream: seconds per ingested file and per micro-batch, in one Spark session.

Replays the demo's stream (chunks of files, a ``run`` after each) into a fresh warehouse per engine and round,
rounds interleaved after a warm-up, and reports each engine's median seconds per ingest and per batch, the
Spark engine's ratio to delta-rs's, and whether both produced the same gold. Needs Delta's JVM jars
(``LAKEJOIN_DELTA_JARS``) for the Spark engine. Run it alone: timings on a shared machine are noisy.

    .venv/bin/python -m benchmarks.engines [--rows 3000] [--keys 500] [--chunk-rows 1500] [--max-batch-rows 1000]
"""

from __future__ import annotations

import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass, field

from benchmarks.peers import phase_medians
from benchmarks.report import write_json
from benchmarks.stream import replay, small_stream_arguments
from pipelines.commands.demo import DemoOptions, generate_stream, write_chunks
from pipelines.spark import DELTA_JARS, get_spark
from state.config import Config
from state.engines import make_engine, session_has_delta
from state.errors import LakejoinError
from state.layout import Warehouse

ENGINES = ("delta-rs", "spark")


@dataclass
class Measured:
    ingest_s: list[float] = field(default_factory=list)
    batch_s: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)  # each batch's seconds per phase
    gold: Counter = field(default_factory=Counter)

    @property
    def total_s(self) -> float:
        return sum(self.ingest_s) + sum(self.batch_s)


def measure(spark, name: str, chunks: list[list[tuple[str, str]]], max_batch_rows: int) -> Measured:  # noqa: ANN001
    engine = make_engine(spark, name)
    warehouse = Warehouse(tempfile.mkdtemp(prefix=f"lakejoin-engines-{name}-"))
    measured = Measured()
    reports = replay(
        engine,
        warehouse,
        Config.of(engine=name, max_batch_rows=max_batch_rows),
        chunks,
        after_ingest=measured.ingest_s.append,
    )
    measured.batch_s = [report.seconds for report in reports]
    measured.phases = [report.phases for report in reports]
    measured.gold = Counter(tuple(row) for row in engine.read(warehouse.gold).select("r_id", "s_id", "owner").collect())
    return measured


def main() -> None:
    args = small_stream_arguments(__doc__.splitlines()[0], "benchmarks/results/engines.json")

    spark = get_spark()
    if not session_has_delta(spark):
        raise LakejoinError(f"the Spark engine needs Delta Lake's JVM jars: set {DELTA_JARS} to their folder")
    options = DemoOptions(
        rows=args.rows, keys=args.keys, chunk_rows=args.chunk_rows, max_batch_rows=args.max_batch_rows
    )
    landing = tempfile.mkdtemp(prefix="lakejoin-engines-landing-")
    chunks = write_chunks(generate_stream(options), landing, args.chunk_rows)
    for name in ENGINES:  # warm-up: JIT, class loading, Python imports
        measure(spark, name, chunks[:1], args.max_batch_rows)
    rounds: dict[str, list[Measured]] = {name: [] for name in ENGINES}
    for number in range(args.rounds):
        for name in ENGINES:
            rounds[name].append(measure(spark, name, chunks, args.max_batch_rows))
            print(f"round {number + 1}: {name} {rounds[name][-1].total_s:.1f} s", flush=True)

    figures = {
        name: {
            "total_s_rounds": [m.total_s for m in measured],
            "total_s": statistics.median(m.total_s for m in measured),
            "ingest_p50_s": statistics.median(s for m in measured for s in m.ingest_s),
            "batch_p50_s": statistics.median(s for m in measured for s in m.batch_s),
            "ingests": len(measured[0].ingest_s),
            "batches": len(measured[0].batch_s),
            "batch_phase_p50_s": phase_medians([phases for m in measured for phases in m.phases]),
        }
        for name, measured in rounds.items()
    }
    same_gold = all(m.gold == rounds[ENGINES[0]][0].gold for measured in rounds.values() for m in measured)
    ratios = {
        kind: figures["spark"][kind] / figures["delta-rs"][kind] for kind in ("total_s", "ingest_p50_s", "batch_p50_s")
    }
    print(
        f"\n{args.rows} records per relation, {args.keys} keys, chunks of {args.chunk_rows}, batches of at most "
        f"{args.max_batch_rows}, {args.rounds} rounds (medians)"
    )
    print(f"{'engine':<10} {'total s':>8} {'s / ingest':>11} {'s / batch':>10}")
    for name, row in figures.items():
        print(f"{name:<10} {row['total_s']:>8.1f} {row['ingest_p50_s']:>11.2f} {row['batch_p50_s']:>10.2f}")
    for name, row in figures.items():
        print(
            f"{name} batch phases (median s): "
            + ", ".join(f"{phase} {s:.2f}" for phase, s in row["batch_phase_p50_s"].items())
        )
    print(
        f"spark / delta-rs: total {ratios['total_s']:.2f}, per ingest {ratios['ingest_p50_s']:.2f}, "
        f"per batch {ratios['batch_p50_s']:.2f} (target <= 3); same gold: {'yes' if same_gold else 'NO'}"
    )
    write_json(args.out, {"config": vars(args), "engines": figures, "ratios": ratios, "same_gold": same_gold})
    print(f"written: {args.out}")
    spark.stop()


if __name__ == "__main__":
    main()
