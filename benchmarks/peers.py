"""lakejoin against what a user would otherwise run, on the same stream, in one Spark session.

1. lakejoin: each micro-batch lands as one Parquet file per relation, is ingested, then ``run`` joins it
   (``--engine``: delta-rs by default, or Delta on Spark; data-quality rules on), as a scheduled job would;
2. Spark Structured Streaming: the same files read by two file streams (one file per trigger, so the
   same micro-batches), a stream-stream inner join on the same predicate, RocksDB state store,
   ``Trigger.AvailableNow``; and, when the session has Delta Lake (``LAKEJOIN_DELTA_JARS``), what a Databricks user
   would build: the two bronze Delta tables (one version per micro-batch) read as Delta streams, joined the same way.
   Both write what lakejoin's gold holds (both records' columns and the owner) to a Delta table written as lakejoin's
   engine writes (Delta on Spark's sink, or each micro-batch committed by delta-rs from ``foreachBatch``); lakejoin
   writes bronze and its state tables besides;
3. batch recompute: the one-shot Spark SQL join of all files (the lower bound on total work), and once,
   the cost of recomputing it after every micro-batch (what a naive scheduled job does);
4. Apache Flink, when ``.venv-flink`` exists (``make .venv-flink/.installed``: PyFlink 2.3 from PyPI, in a virtualenv
   of its own): benchmarks/flink_join.py, a streaming regular inner join on the same predicate, RocksDB state,
   exactly-once checkpoints, parallelism 2, in one JVM kept for the whole run (started once, warmed up like the
   Spark session), writing the same rows as JSON Lines. What differs from the Spark streams: the wheel bundles no
   Parquet format nor Delta connector, so Flink reads JSON Lines copies of the same micro-batch files, written
   beforehand, untimed, and writes JSON Lines; its filesystem source reads each
   relation's files as one bounded stream, neither one file per trigger nor in arrival order (both relations read
   concurrently), which changes neither the pairs nor the state a join that bounds no time keeps; it reports no
   per-batch times nor state size. Its total is the wall time from submitting the job to its end (planning, the
   mini-cluster Flink's local mode starts for every job, the run, the checkpoints, the last of which commits the
   output), as a Structured Streaming query's is from its start; the JobManager's own measure of the run is
   recorded beside it, and the JVM's start, once, in no total.

``--bounded``: bounded state, as streaming users run it. Every system gets the same band window W (``--window``)
and watermark delay, the stream's ``--disorder``: lakejoin ``window`` W and ``allowed_lateness`` the disorder; the
streams an event time ``ts_t`` (ts as seconds), watermarked the disorder behind on both sides, and the band as a
time-range condition on it, ``s.ts_t BETWEEN r.ts_t - W AND r.ts_t + W`` (Structured Streaming evicts its state by
it; Flink plans an interval join, which needs each relation read in arrival order: see ``run_flink``); the one-shot
join the band on ts. No record of the stream is late for any of them: one arrives at most the disorder after its ts,
when no record arrived before it has a ts beyond its arrival, so every watermark (the newest ts seen less the
disorder) is still at or below its ts; this holds as each reads the micro-batches in arrival order (a file stream in
files' modification order, set so; Flink one file per relation). The table's "late" counts what lakejoin quarantined
and what Structured Streaming's watermark dropped: both 0, and every system's pairs equal the one-shot join's. Also
reported: the median seconds of the first and of the last tenth of micro-batches, flat when state is bounded.

Rounds are interleaved after a warm-up; totals are medians over rounds. Every system must produce the same
multiset of (r_id, s_id). Prints one table; writes a JSON with every figure and a PNG of per-batch seconds.

    .venv/bin/python -m benchmarks.peers [--rows 200000] [--keys 50000] [--batch 10000] [--rounds 3] [--bounded [--window 1000]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.by_hand import append_delta, gold_columns, read_delta
from benchmarks.flink_join import interval
from benchmarks.report import tenths, write_json
from pipelines.bronze.ingest import ingest_files
from pipelines.commands.demo import DEMO_START, DemoOptions, generate_stream
from pipelines.silver import run
from pipelines.spark import get_spark
from state.config import Config
from state.engines import make_engine, session_has_delta
from state.join.relations import RELATIONS, relation
from state.layout import Warehouse

SCHEMA = "id string, ts bigint, key string, payload string"
PAIRS = "r_id string, s_id string"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HERE = os.path.dirname(os.path.abspath(__file__))
FLINK_PYTHON = os.path.join(os.path.dirname(HERE), ".venv-flink", "bin", "python")
FLINK_JOB = os.path.join(HERE, "flink_join.py")
EVENT_TIME = "ts_t"  # with --bounded, the streams' event time: ts as seconds, watermarked
# Structured Streaming's event time: ts seconds after the demo's start, as the demo's timestamps are. Its first batch
# has the epoch for watermark and drops a record at it as late (event time <= watermark): ts 0 as the epoch would be.
SPARK_START = int(DEMO_START.timestamp())


@dataclass
class Measured:
    total_s: float
    batch_s: list[float] = field(default_factory=list)
    peak_state_rows: int | None = None
    pairs: DataFrame | None = None
    phases: list[dict[str, float]] = field(default_factory=list)  # per micro-batch: seconds per phase, ingest included
    net_s: float | None = (
        None  # Flink: the job's run as its JobManager measures it (no planning, no mini-cluster start)
    )
    late_rows: int | None = (
        None  # records left unjoined as late: lakejoin's quarantined, Structured Streaming's dropped
    )


def landed_batches(options: DemoOptions, batch: int, folder: str) -> list[dict[str, str]]:
    """The stream cut into micro-batches of ``batch`` arrivals per relation: one Parquet file per relation each, the
    files of a batch modified a second after the previous batch's: a file stream takes files in modification order
    (ties in listing order), and a watermark needs the batches in arrival order."""
    stream = generate_stream(options)
    first = time.time()
    files = []
    for number, start in enumerate(range(0, len(stream), 2 * batch)):
        chunk = stream.iloc[start : start + 2 * batch]
        paths = {}
        for rel in RELATIONS:
            part = chunk[chunk["relation"] == rel.name].drop(columns="relation")
            path = os.path.join(folder, rel.name, f"batch-{number:05d}.parquet")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pq.write_table(pa.Table.from_pandas(part, preserve_index=False), path)
            os.utime(path, (first + number, first + number))
            paths[rel.name] = path
        files.append(paths)
    return files


def copied(batches: list[dict[str, str]], folder: str) -> list[dict[str, str]]:
    """The same micro-batch files under ``folder`` (a stream source reads a whole folder), modification times kept."""
    result = []
    for files in batches:
        paths = {}
        for name, path in files.items():
            paths[name] = os.path.join(folder, name, os.path.basename(path))
            os.makedirs(os.path.dirname(paths[name]), exist_ok=True)
            shutil.copy2(path, paths[name])
        result.append(paths)
    return result


def run_lakejoin(
    spark: SparkSession,
    batches: list[dict[str, str]],
    workdir: str,
    batch: int,
    engine_name: str,
    window: int | None = None,
    lateness: int | None = None,
) -> Measured:
    """With a band ``window`` and an allowed ``lateness``, bounded state: lakejoin evicts what they leave behind."""
    engine = make_engine(spark, engine_name)
    warehouse = Warehouse(os.path.join(workdir, "lakejoin"))
    config = Config.of(engine=engine_name, max_batch_rows=2 * batch, window=window, allowed_lateness=lateness)
    measured = Measured(0.0, late_rows=0)
    for files in batches:
        started = time.perf_counter()
        for name, path in files.items():
            ingest_files(engine, warehouse, relation(name), [path])
        ingested = time.perf_counter()
        (report,) = run(engine, warehouse, config)
        measured.batch_s.append(time.perf_counter() - started)
        measured.phases.append({"ingest": ingested - started, **report.phases})
        measured.late_rows += sum(report.late.values())  # type: ignore[operator] - set above
        state = sum(engine.read(path).count() for path in warehouse.buffers().values())  # untimed
        measured.peak_state_rows = max(measured.peak_state_rows or 0, state)
    measured.total_s = sum(measured.batch_s)
    measured.pairs = engine.read(warehouse.gold).select("r_id", "s_id")
    return measured


def run_structured_streaming(
    spark: SparkSession, batches: list[dict[str, str]], workdir: str, predicate: str, delay: int | None, engine: str
) -> Measured:
    """File streams over the landed Parquet files, one file per trigger, into a Delta table as ``engine`` writes it."""
    streams = {
        rel: spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(os.path.dirname(batches[0][rel.name]))
        for rel in RELATIONS
    }
    return _stream_join(spark, streams, workdir, predicate, delay, engine)


def run_structured_streaming_delta(
    spark: SparkSession, batches: list[dict[str, str]], workdir: str, predicate: str, delay: int | None, engine: str
) -> Measured:
    """Delta streams over two bronze tables holding one version (one file) per micro-batch, into a Delta table. The
    bronze tables are written beforehand, untimed, as an ingest job would have."""
    streams = {}
    for rel in RELATIONS:
        bronze = os.path.join(workdir, "bronze", rel.name)
        for files in batches:
            write_deltalake(bronze, pq.read_table(files[rel.name]), mode="append")
        streams[rel] = spark.readStream.format("delta").option("maxFilesPerTrigger", 1).load(bronze)
    return _stream_join(spark, streams, workdir, predicate, delay, engine, "delta-source")


def _stream_join(
    spark: SparkSession,
    streams: dict,
    workdir: str,
    predicate: str,
    delay: int | None,
    engine: str,
    name: str = "files",
) -> Measured:
    """The stream-stream inner join of ``streams`` (RocksDB state), run to the end of its input, one trigger per
    micro-batch, writing what lakejoin's gold holds (both records' columns and the owner) to a Delta table as lakejoin
    on ``engine`` writes it: Delta on Spark's streaming sink, or (delta-rs) each micro-batch's Arrow committed by
    delta-rs from ``foreachBatch``. With a watermark ``delay`` (seconds), each side's event time ``ts_t`` watermarked
    that far behind."""
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    if delay is not None:
        event_time = F.timestamp_seconds(F.col("ts") + SPARK_START)
        streams = {
            rel: stream.withColumn(EVENT_TIME, event_time).withWatermark(EVENT_TIME, f"{delay} seconds")
            for rel, stream in streams.items()
        }
    r, s = RELATIONS
    columns = [column.split()[0] for column in SCHEMA.split(",")]
    joined = (
        streams[r]
        .alias(r.name)
        .join(streams[s].alias(s.name), F.expr(predicate))
        .select(*gold_columns({rel.name: columns for rel in RELATIONS}))
    )
    output = os.path.join(workdir, f"sss-{name}-output")
    writer = joined.writeStream.option("checkpointLocation", os.path.join(workdir, f"sss-{name}-checkpoint")).trigger(
        availableNow=True
    )
    if engine == "spark":
        writer = writer.format("delta").option("path", output)
    else:
        writer = writer.foreachBatch(lambda frame, _: append_delta(engine, output, frame))
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    total = time.perf_counter() - started
    progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
    peak = max((sum(op["numRowsTotal"] for op in p["stateOperators"]) for p in progress), default=0)
    dropped = sum(op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"])
    measured = Measured(total, [p["durationMs"]["triggerExecution"] / 1000 for p in progress], peak, late_rows=dropped)
    measured.pairs = pairs_of(spark, read_delta(spark, engine, output))
    return measured


def pairs_of(spark: SparkSession, rows: DataFrame | None) -> DataFrame:
    """The (r_id, s_id) of a system's written rows; none when it wrote no table."""
    return spark.createDataFrame([], PAIRS) if rows is None else rows.select("r_id", "s_id")


class Flink:
    """benchmarks/flink_join.py in .venv-flink: one process and JVM serving every Flink job of the run, as the Spark
    systems share one session; a job per request line on its stdin, its timings a JSON line on its stdout."""

    def __init__(self, predicate: str, logs: str, delay: int | None) -> None:
        """With a watermark ``delay`` (seconds), each relation's event time ``ts_t`` watermarked that far behind."""
        started = time.perf_counter()
        self.watermarked = delay is not None
        command = [
            FLINK_PYTHON,
            FLINK_JOB,
            "--predicate",
            predicate,
            "--schema",
            SCHEMA,
            "--relations",
            *(rel.name for rel in RELATIONS),
        ]
        command += [] if delay is None else ["--watermark", EVENT_TIME, "ts", str(delay)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "FLINK_LOG_DIR": logs}
        )
        self._reply()
        self.start_s = time.perf_counter() - started

    def _reply(self) -> dict[str, float]:
        line = self.process.stdout.readline()  # type: ignore[union-attr] - a pipe
        if not line:
            raise RuntimeError(f"{FLINK_JOB} exited with code {self.process.wait()}: its error is above")
        return json.loads(line)

    def join(self, inputs: str, output: str, workdir: str) -> dict[str, float]:
        """Runs the join of ``inputs`` (a folder per relation) into ``output``; its timings in seconds."""
        self.process.stdin.write(json.dumps({"inputs": inputs, "output": output, "workdir": workdir}) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self._reply()

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr] - the end of requests ends the process
        self.process.wait()


def run_flink(spark: SparkSession, flink: Flink, batches: list[dict[str, str]], workdir: str) -> Measured:
    """The Flink job over JSON Lines copies of the micro-batch files (its wheel has no Parquet format), written
    beforehand, untimed, as the bronze tables of the Delta streams are; its pairs read back with Spark. A watermarked
    job reads each relation as one file holding its micro-batches in arrival order, as from one partition of a log:
    its source hands a folder's files to two readers in no arrival order, and a watermark drawn from a later file
    leaves the records of an earlier one behind it (with a file per micro-batch, 20000 records per relation lost 344
    and 463 of 820 pairs in two runs)."""
    inputs = os.path.join(workdir, "flink-input")
    for files in batches:
        for name, path in files.items():
            stem = name if flink.watermarked else os.path.splitext(os.path.basename(path))[0]
            copy = os.path.join(inputs, name, f"{stem}.json")
            os.makedirs(os.path.dirname(copy), exist_ok=True)
            with open(copy, "a", encoding="utf-8") as lines:
                pq.read_table(path).to_pandas().to_json(lines, orient="records", lines=True)
    output = os.path.join(workdir, "flink-output")
    os.makedirs(output)  # read back as no pairs when the join writes none
    timings = flink.join(inputs, output, workdir)
    measured = Measured(timings["total_s"], net_s=timings["net_s"])
    measured.pairs = spark.read.schema(PAIRS).json(output)
    return measured


def one_shot(
    spark: SparkSession, batches: list[dict[str, str]], workdir: str, predicate: str, upto: int | None = None
) -> Measured:
    """The batch join of the first ``upto`` micro-batches (all by default), written as Parquet."""
    chosen = batches[:upto]
    r, s = RELATIONS
    sides = {
        rel: spark.read.schema(SCHEMA).parquet(*[files[rel.name] for files in chosen]).alias(rel.name)
        for rel in RELATIONS
    }
    output = os.path.join(workdir, f"one-shot-{upto or len(batches)}")
    started = time.perf_counter()
    sides[r].join(sides[s], F.expr(predicate)).select(
        F.col("r.id").alias("r_id"), F.col("s.id").alias("s_id")
    ).write.parquet(output)
    measured = Measured(time.perf_counter() - started)
    measured.pairs = spark.read.parquet(output)
    return measured


def band(column: str, span: str) -> str:
    """s within ``span`` of r on ``column``: lakejoin's band window (``|r._ts - s._ts| <= W``) as the others are given it."""
    r, s = (rel.name for rel in RELATIONS)
    return f"{s}.{column} BETWEEN {r}.{column} - {span} AND {r}.{column} + {span}"


def predicates(on: str, window: int | None) -> tuple[str, str]:
    """The batch join's and the streams' predicates: ``on``, and with a band ``window``, the band on ts for the batch
    join and on the watermarked event time for the streams (a stream-stream join bounds its state by that alone)."""
    if window is None:
        return on, on
    return f"{on} AND {band('ts', str(window))}", f"{on} AND {band(EVENT_TIME, interval(window))}"


def same_pairs(a: DataFrame, b: DataFrame) -> bool:
    return a.exceptAll(b).isEmpty() and b.exceptAll(a).isEmpty()


def phase_medians(phases: list[dict[str, float]]) -> dict[str, float]:
    """Each phase's median seconds per micro-batch, largest first (a phase a batch skipped counts 0)."""
    names = {name for batch in phases for name in batch}
    medians = {name: statistics.median(batch.get(name, 0.0) for batch in phases) for name in names}
    return dict(sorted(medians.items(), key=lambda item: -item[1]))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def plot(per_batch: dict[str, list[float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for name, seconds in per_batch.items():
        axes.plot(range(1, len(seconds) + 1), seconds, marker="o", label=name)
    axes.set_xlabel("micro-batch")
    axes.set_ylabel("seconds")
    axes.set_title(title)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="records per relation (default 200000)")
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--skew", type=float, default=0.0, help="Zipf exponent of key popularity (default 0: uniform)")
    parser.add_argument("--disorder", type=int, default=2_000)
    parser.add_argument(
        "--batch", type=int, default=10_000, help="arrivals per relation per micro-batch (default 10000)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--recompute", action="store_true", help="also measure recomputing the join after every micro-batch"
    )
    parser.add_argument(
        "--engine",
        choices=["delta-rs", "spark"],
        default="delta-rs",
        help="lakejoin's Delta engine (spark needs LAKEJOIN_DELTA_JARS)",
    )
    parser.add_argument(
        "--bounded",
        action="store_true",
        help="bounded state: a band window and a watermark delay (the disorder) for every system",
    )
    parser.add_argument(
        "--window", type=int, default=1_000, help="with --bounded, the band window in ts units (default 1000)"
    )
    parser.add_argument("--out", help="default benchmarks/results/peers.json, with --bounded peers_bounded.json")
    args = parser.parse_args()
    args.out = args.out or f"benchmarks/results/{'peers_bounded' if args.bounded else 'peers'}.json"

    options = DemoOptions(rows=args.rows, keys=args.keys, skew=args.skew, disorder=args.disorder, seed=7)
    root = tempfile.mkdtemp(prefix="lakejoin-peers-")
    batches = landed_batches(options, args.batch, os.path.join(root, "landing"))
    spark = get_spark()
    window, delay = (args.window, args.disorder) if args.bounded else (None, None)
    predicate, stream_predicate = predicates(Config.of().predicate, window)  # type: ignore[arg-type] - normalised to a str
    systems: dict[str, Callable[[list[dict[str, str]], str], Measured]] = {
        "lakejoin": lambda chosen, workdir: run_lakejoin(
            spark, chosen, workdir, args.batch, args.engine, window, delay
        ),
        "structured-streaming": lambda chosen, workdir: run_structured_streaming(
            spark, chosen, workdir, stream_predicate, delay, args.engine
        ),
        "one-shot": lambda chosen, workdir: one_shot(spark, chosen, workdir, predicate),
    }
    if session_has_delta(spark):
        systems["structured-streaming-delta"] = lambda chosen, workdir: run_structured_streaming_delta(
            spark, chosen, workdir, stream_predicate, delay, args.engine
        )
    flink = Flink(stream_predicate, os.path.join(root, "flink-logs"), delay) if os.path.exists(FLINK_PYTHON) else None
    if flink:
        systems["flink"] = lambda chosen, workdir: run_flink(spark, flink, chosen, workdir)
    else:
        print(f"flink: skipped, {FLINK_PYTHON} does not exist (make .venv-flink/.installed creates it)")
    warm = tempfile.mkdtemp(dir=root)
    first = copied(batches[:2], os.path.join(warm, "landing"))
    for name, system in systems.items():
        system(first, os.path.join(warm, name))
    shutil.rmtree(warm)

    rounds: dict[str, list[Measured]] = {name: [] for name in systems}
    for number in range(args.rounds):
        for name, system in systems.items():
            workdir = tempfile.mkdtemp(dir=root)
            rounds[name].append(system(batches, workdir))
            print(f"round {number + 1}: {name} {rounds[name][-1].total_s:.1f} s", flush=True)
    reference = rounds["one-shot"][-1].pairs
    identical = {name: same_pairs(measured[-1].pairs, reference) for name, measured in rounds.items()}
    expected_pairs = reference.count()
    recompute = None
    if args.recompute:
        workdir = tempfile.mkdtemp(dir=root)
        recompute = [one_shot(spark, batches, workdir, predicate, upto).total_s for upto in range(1, len(batches) + 1)]

    arrivals = 2 * args.rows
    figures = {}
    for name, measured in rounds.items():
        totals = [m.total_s for m in measured]
        median_round = sorted(measured, key=lambda m: m.total_s)[len(measured) // 2]
        figures[name] = {
            "total_s_rounds": totals,
            "total_s": statistics.median(totals),
            "records_per_s": arrivals / statistics.median(totals),
            "batch_p50_s": percentile(median_round.batch_s, 0.5) if median_round.batch_s else None,
            "batch_p95_s": percentile(median_round.batch_s, 0.95) if median_round.batch_s else None,
            "batch_s": median_round.batch_s,
            "peak_state_rows": median_round.peak_state_rows,
            "late_rows": median_round.late_rows,
            **(
                dict(zip(("first_tenth_batch_s", "last_tenth_batch_s"), tenths(median_round.batch_s)))
                if median_round.batch_s
                else {}
            ),
            "same_pairs_as_one_shot": identical[name],
            **({"phase_s_per_batch": phase_medians(median_round.phases)} if median_round.phases else {}),
            **({"net_s_rounds": [m.net_s for m in measured]} if median_round.net_s is not None else {}),
        }
    if flink:
        figures["flink"]["jvm_start_s"] = flink.start_s
        flink.close()
    lakejoin = figures["lakejoin"]["total_s"]
    ratios = {
        "lakejoin_over_structured_streaming": lakejoin / figures["structured-streaming"]["total_s"],
        "lakejoin_over_one_shot": lakejoin / figures["one-shot"]["total_s"],
        "lakejoin_last_over_first_tenth": figures["lakejoin"]["last_tenth_batch_s"]
        / figures["lakejoin"]["first_tenth_batch_s"],
    }
    if "structured-streaming-delta" in figures:
        ratios["lakejoin_over_structured_streaming_delta"] = lakejoin / figures["structured-streaming-delta"]["total_s"]
    if flink:
        ratios["lakejoin_over_flink"] = lakejoin / figures["flink"]["total_s"]
    if recompute:
        figures["recompute-every-batch"] = {
            "total_s": sum(recompute),
            "batch_s": recompute,
            "records_per_s": arrivals / sum(recompute),
        }
    bounded = f"; bounded: band window {window}, watermark delay {delay}" if args.bounded else ""
    print(
        f"\nlakejoin on {args.engine}; {args.rows} records per relation, {args.keys} keys, skew {args.skew}, disorder {args.disorder}, "
        f"{len(batches)} micro-batches of {args.batch} per relation, {expected_pairs} pairs, {args.rounds} rounds{bounded}"
    )
    print(
        f"{'system':<24} {'total s':>8} {'records/s':>10} {'p50 s':>7} {'p95 s':>7} {'peak state':>11} {'late':>6}  same pairs"
    )
    for name, row in figures.items():
        p50 = f"{row['batch_p50_s']:.2f}" if row.get("batch_p50_s") is not None else "-"
        p95 = f"{row['batch_p95_s']:.2f}" if row.get("batch_p95_s") is not None else "-"
        state = f"{row['peak_state_rows']:,}" if row.get("peak_state_rows") is not None else "-"
        late = f"{row['late_rows']:,}" if row.get("late_rows") is not None else "-"
        same = {True: "yes", False: "NO", None: "-"}[row.get("same_pairs_as_one_shot")]
        print(
            f"{name:<24} {row['total_s']:>8.1f} {row['records_per_s']:>10,.0f} {p50:>7} {p95:>7} {state:>11} {late:>6}  {same}"
        )
    phases = figures["lakejoin"]["phase_s_per_batch"]
    print(
        "lakejoin seconds per micro-batch by phase (medians; writes overlap): "
        + ", ".join(f"{name} {seconds:.2f}" for name, seconds in phases.items())
    )
    flat = {
        name: (row["first_tenth_batch_s"], row["last_tenth_batch_s"])
        for name, row in figures.items()
        if "first_tenth_batch_s" in row
    }
    print(
        "seconds per micro-batch, median of the first tenth -> the last: "
        + "; ".join(f"{name} {first:.2f} -> {last:.2f} ({last / first:.2f})" for name, (first, last) in flat.items())
        + (" (lakejoin's target <= 1.3 at N x 4)" if args.bounded else "")
    )
    print(
        f"lakejoin / structured streaming: {ratios['lakejoin_over_structured_streaming']:.2f} (target on delta-rs <= 1.0); "
        f"lakejoin / one-shot: {ratios['lakejoin_over_one_shot']:.2f}"
        + (
            f"; lakejoin / structured streaming on Delta: {ratios['lakejoin_over_structured_streaming_delta']:.2f} (target on Spark <= 1.5)"
            if "structured-streaming-delta" in figures
            else ""
        )
        + (f"; lakejoin / Flink: {ratios['lakejoin_over_flink']:.2f}" if flink else "")
    )
    if flink:
        net = statistics.median(figures["flink"]["net_s_rounds"])
        print(
            f"flink: total from submission to end (planning and the per-job mini-cluster's start included); the run alone, "
            f"as its JobManager measures it, {net:.1f} s (median); its JVM started once in {flink.start_s:.1f} s, in no total"
        )

    write_json(args.out, {"config": vars(args), "pairs": expected_pairs, "systems": figures, "ratios": ratios})
    png = os.path.splitext(args.out)[0] + ".png"
    plot(
        {name: row["batch_s"] for name, row in figures.items() if row.get("batch_s")},
        png,
        f"{args.rows:,} records per relation, micro-batches of {args.batch:,} per relation{bounded}",
    )
    print(f"written: {args.out}, {png}")
    spark.stop()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
