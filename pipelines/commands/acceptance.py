"""What lakejoin takes on trust from a Databricks workspace, checked on one.

lakejoin's tests emulate what Databricks refuses (a Spark Connect client that refuses what serverless refuses, a
classic session that refuses Delta's internals as a runtime's would); an emulation agrees with our reading of
Databricks, not with Databricks. The bundle's ``lakejoin-acceptance`` job, which a team runs once on its workspace
(classic compute and serverless), runs these checks there and reports each guarantee as passed or failed
(``lakejoin acceptance``); the tests run the same checks against a local catalog under each emulation.

Each check is independent: one that fails says why in one line and the others still run. The job also seeds a
warehouse (``seed``) for the real join jobs to join, kills a join of more records mid-batch and has Databricks retry it
(``killed_join``), and checks gold against what it seeded (``joined_as_seeded``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

from pyspark.sql import SparkSession

from state.config import Config
from state.errors import LakejoinError, WarehouseBusy, first_line
from state.layout import Warehouse, is_catalog_schema

CHANGES = {"op": "op", "sequence_by": "seq"}
CONFIG = {"relations": {"r": {"changes": CHANGES}, "s": {"changes": CHANGES}}}
SCHEMA = "op STRING, seq LONG, id STRING, ts LONG, key STRING, amount DOUBLE"
# Two ingests, each joined in a batch: r1 moves from key a to key c (an update), r2 is deleted
FIRST = (
    [("c", 1, "r1", 10, "a", 1.0), ("c", 1, "r2", 11, "b", 2.0)],
    [("c", 1, "s1", 12, "a", 3.0), ("c", 1, "s2", 13, "c", 4.0)],
)
SECOND = [("u", 2, "r1", 14, "c", 5.0), ("d", 2, "r2", 15, "b", 2.0)], [("c", 2, "s3", 16, "a", 6.0)]
# Gold after each ingest's batches: the current version of every record, joined on key
GOLD = ([("r1", "s1", 1.0, 3.0)], [("r1", "s2", 5.0, 4.0)])
# The warehouse the real join jobs share in an acceptance run (resources/acceptance.yml): r's records land as a file in
# a landing folder, s's are a source table read by name; gold must then hold their join on key (the default predicate)
SEEDED_R = [("r1", 1, "a"), ("r2", 3, "b"), ("r3", 5, "a")]
SEEDED_S = [("s1", 2, "a"), ("s2", 4, "b"), ("s3", 6, "c")]
# What the killed join adds before it dies (another landing file, rows appended to the source table); gold then holds
# the join of both rounds
KILLED_R = [("r4", 7, "c")]
KILLED_S = [("s4", 8, "b")]
SEEDED_GOLD = [("r1", "s1"), ("r2", "s2"), ("r2", "s4"), ("r3", "s1"), ("r4", "s3")]
KILLED_AT = "before:gold"  # the batch is planned, nothing of it written to gold or state: a retry must resume it
KILLED_EXIT = 137  # a process killed by SIGKILL exits with 128 + 9
SEEDED_SCHEMA = "id STRING, ts LONG, key STRING"
SOURCE_TABLE = "acceptance_source_s"  # in the seeded warehouse's schema, beside lakejoin's tables
FORCED = (
    "a failure forced by 'lakejoin acceptance --fail': this run must end FAILED and send the job's on_failure "
    "notifications"
)


@dataclass(frozen=True)
class Outcome:
    """One guarantee, whether it held on this compute, and what was seen."""

    guarantee: str
    passed: bool
    seen: str

    def line(self) -> str:
        return f"{'passed' if self.passed else 'FAILED'}: {self.guarantee}: {self.seen}"


def accept(spark: SparkSession, schema: str) -> list[Outcome]:
    """Each guarantee checked in ``schema`` (``catalog.schema``, made for the purpose: its tables are dropped first)."""
    _require_catalog_schema(schema)
    checks: list[tuple[str, Callable[[SparkSession, str], str]]] = [
        ("Delta on Spark is chosen without a probe, with the public log reader", _engine),
        ("a change-feed join on managed tables is exact over two ingests and their batches", _joins_exactly),
        ("of two runs racing for the warehouse lock, one holds it and the other is told it is busy", _lock_excludes),
        ("a path read of a managed table's storage is refused (lakejoin reads by name only)", _path_read_refused),
    ]
    return [_checked(guarantee, check, spark, schema) for guarantee, check in checks]


def report(outcomes: list[Outcome]) -> str:
    """The outcomes as JSON lines: what the job's output and the report file hold."""
    return "".join(json.dumps(asdict(outcome)) + "\n" for outcome in outcomes)


def _checked(guarantee: str, check: Callable[[SparkSession, str], str], spark: SparkSession, schema: str) -> Outcome:
    try:
        return Outcome(guarantee, True, check(spark, schema))
    except Exception as exc:  # noqa: BLE001 - a check's failure of any kind is its outcome, and the next check runs
        return Outcome(guarantee, False, (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300])


def _engine(spark: SparkSession, schema: str) -> str:
    """The engine as a run chooses it (``Pipeline``: the config's engine, and whether the warehouse holds catalog
    tables), on a process the runtime marks as Databricks': Delta on Spark without a probe, with the public reader."""
    from state.engines import make_engine, on_databricks
    from state.engines.public_log import PublicLog

    if not on_databricks():
        raise AssertionError("DATABRICKS_RUNTIME_VERSION is not set: lakejoin would not know it runs on Databricks")
    config = Config.of(**CONFIG)
    engine = make_engine(spark, config.engine, catalog=config.placed(Warehouse(schema)).holds_catalog_tables)
    reader = type(getattr(engine, "_log", None)).__name__
    if engine.name != "spark" or not isinstance(engine._log, PublicLog):
        raise AssertionError(f"engine {engine.name} with the {reader} reader")
    return f"engine {engine.name}, {reader}"


def _joins_exactly(spark: SparkSession, schema: str) -> str:
    from pipelines.api import Pipeline

    for table in Config.of(**CONFIG).placed(Warehouse(schema)).tables():  # a run before this one left them
        spark.sql(f"DROP TABLE IF EXISTS {table}")
    with Pipeline(schema, CONFIG, spark=spark) as pipeline:
        batches = 0
        for arrivals, expected in zip((FIRST, SECOND), GOLD):
            for relation, rows in zip("rs", arrivals):
                pipeline.ingest(relation, spark.createDataFrame(rows, SCHEMA))
            batches += len(pipeline.run().batches)
            gold = sorted(
                tuple(row) for row in pipeline.table("gold").select("_r_id", "_s_id", "r_amount", "s_amount").collect()
            )
            if gold != expected:
                raise AssertionError(f"gold is {gold} after batch {batches}, expected {expected}")
        return f"{batches} batches, gold exact after each ingest"


def _lock_excludes(spark: SparkSession, schema: str) -> str:
    from state.log.lock import JOIN, hold

    start, outcomes = threading.Barrier(2, timeout=600), []

    def race() -> None:
        start.wait()
        try:
            with hold(schema, JOIN, 0.0, spark):
                outcomes.append("held")
                start.wait()  # held until the other has tried
        except WarehouseBusy:
            outcomes.append("busy")
            start.wait()

    racers = [threading.Thread(target=race) for _ in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    if sorted(outcomes) != ["busy", "held"]:
        raise AssertionError(f"the two runs ended {sorted(outcomes)}")
    return "one held, one busy"


# How Unity Catalog refuses a path in managed storage (Databricks' knowledge base: "INVALID_PARAMETER_VALUE.
# LOCATION_OVERLAP ... overlaps with managed storage"): any other error is no proof that it refuses path reads.
MANAGED_STORAGE_REFUSAL = ("LOCATION_OVERLAP", "overlaps with managed storage")


def _path_read_refused(spark: SparkSession, schema: str) -> str:
    gold = Config.of(**CONFIG).placed(Warehouse(schema)).gold
    location = spark.sql(f"DESCRIBE DETAIL {gold}").first()["location"]
    try:
        spark.read.format("delta").load(location).limit(1).collect()
    except Exception as exc:  # noqa: BLE001 - told apart below by Unity Catalog's own words
        said = first_line(exc)
        if not any(words in str(exc) for words in MANAGED_STORAGE_REFUSAL):
            raise AssertionError(f"the path read failed, but not as Unity Catalog refuses it: {said[:200]}") from None
        return f"refused: {said[:200]}"
    raise AssertionError(f"{location} was read by path")


def _require_catalog_schema(schema: str) -> None:
    if not is_catalog_schema(schema):
        raise LakejoinError(f"acceptance runs in a catalog schema (catalog.schema), got {schema!r}")


def seed(spark: SparkSession, schema: str, folder: str) -> str:
    """Make the seeded warehouse anew (the tables a previous run left dropped, the landing file replaced): r's records
    in ``folder``/r, s's in the source table, the config in ``folder``/config.yml, whose path is returned."""
    import yaml

    _require_catalog_schema(schema)
    config = {"relations": {"r": {"landing": f"{folder}/r"}, "s": {"table": f"{schema}.{SOURCE_TABLE}"}}}
    for table in [*Config.of(**config).placed(Warehouse(schema)).tables(), f"{schema}.{SOURCE_TABLE}"]:
        spark.sql(f"DROP TABLE IF EXISTS {table}")
    spark.createDataFrame(SEEDED_S, SEEDED_SCHEMA).write.format("delta").saveAsTable(f"{schema}.{SOURCE_TABLE}")
    os.makedirs(f"{folder}/r", exist_ok=True)
    for name in os.listdir(f"{folder}/r"):
        os.remove(f"{folder}/r/{name}")
    if os.path.exists(_killed_mark(folder)):
        os.remove(_killed_mark(folder))
    _land(f"{folder}/r/records.jsonl", SEEDED_R)
    with open(f"{folder}/config.yml", "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)
    return f"{folder}/config.yml"


def killed_join(spark: SparkSession, schema: str, folder: str) -> Outcome:
    """A join killed mid-batch, then retried by Databricks (the task's ``max_retries``), on the seeded warehouse.

    The first try (no mark in ``folder``) marks itself, adds a second round of records (a landing file, rows appended
    to the source table) and joins them until right before gold's write, where the process exits as a killed one does:
    no ``finally`` runs, so the lease stays held. The retry finds the mark, waits out the lease and must resume the
    batch its try cut short; a retry with nothing to resume fails, so a kill that never happened cannot pass.
    """
    from pipelines.api import Pipeline
    from state.faults import racing
    from state.log.lease import LEASE_SECONDS

    def check(spark: SparkSession, schema: str) -> str:
        with Pipeline(schema, f"{folder}/config.yml", spark=spark) as pipeline:
            if not os.path.exists(_killed_mark(folder)):
                open(_killed_mark(folder), "w", encoding="utf-8").close()
                spark.createDataFrame(KILLED_S, SEEDED_SCHEMA).write.format("delta").mode("append").saveAsTable(
                    f"{schema}.{SOURCE_TABLE}"
                )
                _land(f"{folder}/r/killed.jsonl", KILLED_R)
                with racing({KILLED_AT: _die}):
                    pipeline.run()
                raise AssertionError(f"the join ended without reaching {KILLED_AT}, where it was to be killed")
            batches = pipeline.run(wait=LEASE_SECONDS + 60).batches
        if not batches or not batches[0].resumed:
            raise AssertionError("the retry found no batch cut short: its try was not killed mid-batch")
        return f"killed at {KILLED_AT}; the retry resumed batch {batches[0].batch_id}, {len(batches)} batches"

    return _checked("a join killed mid-batch and retried resumes the batch it cut short", check, spark, schema)


def _die() -> None:
    """Exit the way a killed process does: at once, no cleanup, the warehouse's lease still held."""
    print(f"killed at {KILLED_AT} on purpose: the task's retry must resume this batch", flush=True)
    sys.stderr.flush()
    os._exit(KILLED_EXIT)


def _killed_mark(folder: str) -> str:
    return f"{folder}/killed"


def _land(path: str, rows: list[tuple]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(dict(zip(("id", "ts", "key"), row))) + "\n" for row in rows))


def joined_as_seeded(spark: SparkSession, schema: str) -> Outcome:
    """After the join jobs: gold holds the join of what was seeded, each pair once (validate reconciles gold with the
    batch join of bronze, which an ingest that took nothing would pass too)."""

    def check(spark: SparkSession, schema: str) -> str:
        gold = Warehouse(schema).gold  # the seeded config places no layer
        pairs = sorted(tuple(row) for row in spark.table(gold).select("_r_id", "_s_id").collect())
        if pairs != SEEDED_GOLD:
            raise AssertionError(f"gold holds {pairs}, expected {SEEDED_GOLD}")
        return f"{len(pairs)} pairs, each once"

    return _checked(
        "the join jobs joined what was seeded, landing files and a source table, exactly", check, spark, schema
    )
