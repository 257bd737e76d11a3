"""The Python API: what each command does, as methods on a caller's session; a DataFrame or a stream as the input."""

from __future__ import annotations

import json
import os
import random
import runpy
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from unittest import mock

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines import LakejoinError, Pipeline
from pipelines.cli import main
from state.config import Config
from state.layout import Warehouse
from tests import helpers
from tests.reference import Pair, Record, batch_join

SCHEMA = "id STRING, ts BIGINT, key STRING, payload STRING"


def out_of_order(count: int, seed: int) -> list[Record]:
    """``count`` records per relation over 4 keys, their event times in no order."""
    rng = random.Random(seed)
    return [
        Record(side, f"{side}{i}", rng.randrange(60), f"k{rng.randrange(4)}") for side in "rs" for i in range(count)
    ]


def rows(records: list[Record], side: str) -> list[dict]:
    return [
        {"id": rec.id, "ts": rec.ts, "key": rec.key, "payload": f"of {rec.id}"}
        for rec in records
        if rec.relation == side
    ]


def gold_pairs(pipeline: Pipeline) -> Counter[Pair]:
    return Counter(
        Pair(row.r_id, row.s_id, row.owner) for row in pipeline.table("gold").select("r_id", "s_id", "owner").collect()
    )


def test_the_api_and_the_cli_give_the_same_gold_state_and_batch_log(spark, deltars, tmp_path, capsys):
    """On delta-rs: the API on Delta on Spark runs in the notebook test here, and on a cluster and a Spark Connect
    server in tests/test_where_spark_runs.py."""
    engine = deltars
    records = out_of_order(15, seed=5)
    settings = {"engine": engine.name, "max_batch_rows": 7}
    (tmp_path / "pipeline.yml").write_text(json.dumps(settings))  # JSON is YAML
    by_cli, by_api = (helpers.Pipeline(engine, str(tmp_path / name), Config.of(**settings)) for name in ("cli", "api"))
    for pipeline in (by_cli, by_api):
        os.makedirs(pipeline.root)
    files = {
        side: [by_cli.write_file(rows(records, side)[:8]), by_cli.write_file(rows(records, side)[8:])] for side in "rs"
    }

    config = ["--config", str(tmp_path / "pipeline.yml")]
    for side in "rs":
        assert main(["ingest", "--warehouse", by_cli.warehouse.root, "--relation", side, *files[side], *config]) == 0
    assert main(["run", "--warehouse", by_cli.warehouse.root, *config]) == 0
    assert "5 batches: 30 arrivals" in capsys.readouterr().out

    api = Pipeline(by_api.warehouse.root, str(tmp_path / "pipeline.yml"), spark=spark)
    for side in "rs":
        assert [result.landed for result in api.ingest(side, files[side])] == [8, 7]
    report = api.run()

    assert (len(report.batches), report.arrivals, report.pairs) == (5, 30, len(batch_join(records)))
    assert by_api.snapshot() == by_cli.snapshot()
    assert gold_pairs(api) == Counter(batch_join(records))


# What Delta Lake sets in any session that reads or writes a Delta table (the caller's own reads of ``table()`` too).
DELTAS_OWN = (
    "spark.sql.parquet.fieldId.read.enabled",
    "spark.sql.parquet.fieldId.write.enabled",
    "spark.databricks.delta.lastCommitVersionInSession",
)


def caller_settings(spark: SparkSession, settings: dict[str, str] | None = None) -> dict[str, str]:
    return {name: value for name, value in (settings or dict(spark.conf.getAll)).items() if name not in DELTAS_OWN}


def test_a_callers_session_is_used_as_it_is_and_left_as_it_was_with_no_error_in_its_log(spark, engine, tmp_path):
    """At Spark's default log level, as in a notebook or a Databricks job: no query that lakejoin (or Great
    Expectations, in ``validate``) runs fails as a matter of course, so the driver's log holds no ERROR line."""
    records = out_of_order(8, seed=8)
    settings = dict(spark.conf.getAll)
    pipeline = Pipeline(tmp_path / "wh", {"max_batch_rows": 5, "engine": engine.name}, spark=spark)

    with helpers.driver_log(spark) as logged:
        for side in "rs":
            (result,) = pipeline.ingest(side, spark.createDataFrame(rows(records, side), SCHEMA))
            assert (result.landed, result.quarantined) == (8, 0)
        report = pipeline.run()
        status = pipeline.status()
        audit = pipeline.validate(str(tmp_path / "docs"))
        pipeline.close()
        errors = [line for line in logged() if line.startswith("ERROR")]

    assert report.pairs == len(batch_join(records)) and gold_pairs(pipeline) == Counter(batch_join(records))
    assert status["pending"] == {"r": 0, "s": 0} and status["last_committed_batch"] == report.batches[-1].batch_id
    assert audit.success and audit.failures == []
    assert pipeline.spark is spark and SparkSession.getActiveSession() is spark and spark.range(3).count() == 3
    assert caller_settings(spark) == caller_settings(spark, settings)
    assert errors == []


def test_a_dataframe_lands_as_a_file_would_its_bad_rows_quarantined_and_its_errors_one_line(spark, tmp_path):
    pipeline = Pipeline(tmp_path / "wh", spark=spark)
    frame = spark.createDataFrame(
        [("r1", "5", "k"), ("r2", "soon", "k"), ("r1", "5", "k")], "id STRING, ts STRING, key STRING"
    )
    (result,) = pipeline.ingest("r", frame)
    assert (result.landed, result.quarantined, result.duplicates) == (1, 1, 1)
    quarantined = pipeline.table("quarantine/ingest").select("reason", "source_line").collect()
    assert [tuple(row) for row in quarantined] == [("ts is not an integer: soon", 2)]

    with pytest.raises(LakejoinError) as unknown:
        pipeline.ingest("x", frame)
    with pytest.raises(LakejoinError) as reserved:
        pipeline.ingest("r", frame.withColumnRenamed("key", "_key"))
    with pytest.raises(LakejoinError) as nowhere:
        Pipeline(tmp_path / "nowhere", spark=spark).status()

    assert str(unknown.value) == "unknown relation 'x': the config's relations are r, s"
    assert "column '_key' starts with '_', which lakejoin reserves for bookkeeping: rename it" in str(reserved.value)
    assert (
        str(nowhere.value) == f"no warehouse at {tmp_path / 'nowhere'}: land files there first with 'lakejoin ingest'"
    )
    for caught in (unknown, reserved, nowhere):
        assert "\n" not in str(caught.value) and caught.value.__cause__ is None
    assert pipeline.table("bronze/r").count() == 1  # nothing of a refused frame landed
    (again,) = pipeline.ingest("r", frame.orderBy(F.desc("id")))  # the same records, in another order
    assert again.already_ingested and pipeline.table("quarantine/ingest").count() == 1


# When to kill the feeder: after its Spark has started, while its streams land files and its run joins them.
KILL_AFTER_SECONDS = (8.0, 22.0)


def test_two_streams_land_through_foreach_batch_exactly_once_across_kill_9(deltars, tmp_path):
    """Two file streams, one per relation, feed one warehouse; their process is killed at a random moment and started
    again from its checkpoints. Runs on delta-rs: the stream and its replays are the engine's, the ingest protocol's
    crashes are covered on both engines by the crash matrix."""
    records = out_of_order(24, seed=13)
    for side in "rs":
        folder = tmp_path / "landing" / side
        folder.mkdir(parents=True)
        mine = rows(records, side)
        for part in range(6):
            (folder / f"{part:02d}.json").write_text(
                "\n".join(json.dumps(row) for row in mine[part * 4 : part * 4 + 4])
            )
    (tmp_path / "checkpoints" / "r" / "offsets").mkdir(parents=True)
    (tmp_path / "checkpoints" / "r" / "offsets" / ".0.killed.tmp").write_text(
        "{"
    )  # killed while writing its first offset
    command = [
        sys.executable,
        "-m",
        "tests.stream_feeder",
        str(tmp_path / "wh"),
        str(tmp_path / "landing"),
        str(tmp_path / "checkpoints"),
    ]
    env = helpers._env("delta-rs")

    victim = subprocess.Popen(
        command, cwd=helpers.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    time.sleep(random.Random(17).uniform(*KILL_AFTER_SECONDS))
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate()
    final = subprocess.run(command, cwd=helpers.REPO, env=env, capture_output=True, text=True, timeout=600)

    assert final.returncode == 0, final.stderr[-3000:]
    warehouse = Warehouse(str(tmp_path / "wh"))
    for rel in warehouse.relations:
        landed = Counter(row.id for row in deltars.read(warehouse.bronze(rel)).select("id").collect())
        assert landed == Counter(rec.id for rec in records if rec.relation == rel.name)
    gold = deltars.read(warehouse.gold).select("r_id", "s_id", "owner").collect()
    assert Counter(Pair(*row) for row in gold) == Counter(batch_join(records))
    logged = Counter(row.source_file for row in deltars.read(warehouse.ingest_log).select("source_file").collect())
    assert all(source.startswith("foreachBatch:") for source in logged) and set(logged.values()) == {
        1
    }  # a replay logs nothing


def test_the_example_notebook_runs_as_a_script_and_its_gold_is_the_join_of_what_it_landed(
    deltars, tmp_path, monkeypatch, capsys
):
    """Run here, on this process's session as a notebook's cell would find one, with delta-rs as without Delta's jars."""
    monkeypatch.setenv("LAKEJOIN_EXAMPLE_ROOT", str(tmp_path))
    with mock.patch("state.engines.session_has_delta", lambda spark: False):
        runpy.run_path(os.path.join(helpers.REPO, "examples", "notebook.py"), run_name="__main__")
    printed = capsys.readouterr().out

    landed = {
        name: [
            json.loads(line)
            for path in sorted((tmp_path / "landing" / name).iterdir())
            for line in path.read_text().splitlines()
        ]
        for name in ("orders", "payments")
    }
    hour = 3600
    expected = Counter(
        (order["order_id"], payment["payment_id"])
        for order in landed["orders"]
        for payment in landed["payments"]
        if order["customer"] == payment["customer"]
        and 0 <= seconds(payment["paid_at"]) - seconds(order["order_time"]) <= hour
    )
    gold = (
        deltars.read(str(tmp_path / "warehouse" / "gold" / "join_results"))
        .select("orders_order_id", "payments_payment_id")
        .collect()
    )
    assert expected and Counter(tuple(row) for row in gold) == expected
    assert "PASS" in printed and "reconciliation" in printed


def seconds(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
