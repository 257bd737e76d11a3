"""lakejoin where its users run Spark: as a client of a Spark Connect server (Databricks serverless and Connect are
ones), and as the driver of a standalone cluster whose executors are other JVMs. Both are started here from
pyspark's own launcher and jars, with Delta's jars; the scenarios run in a process of their own
(tests/where_spark_runs.py) and gold is checked here against the batch SQL join of the files they landed. They take
tens of minutes, so they run on demand (LAKEJOIN_WHERE_IT_RUNS=1). And a guard: no module but state/engines/jvm.py
reaches into the JVM, which a Connect client does not have."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from expectations.reconcile import comparable
from pipelines.bronze.ingest import ingest_files
from pipelines.spark import DELTA_CONF, DELTA_JARS, delta_jars
from state.engines import make_engine
from state.join.relations import relation
from state.layout import Warehouse
from tests.databricks_runtime import ON_DEMAND
from tests.helpers import REPO, lakejoin
from tests.test_join_pipeline import ORDERS
from tests.where_spark_runs import TYPED_CONFIG, TYPES, WORKED_BATCH_ROWS, WORKED_ORDER

SPARK_HOME = os.path.dirname(pyspark.__file__)
JVM_SIDE = re.compile(r"\b(_jvm|_jsc|_jsparkSession|_jdf|_jdt|sparkContext|SparkContext|rdd)\b")
THE_JVM_MODULE = Path(REPO, "state", "engines", "jvm.py")
SERVERLESS_VENV = ".venv-serverless"  # the Makefile's: serverless environment 5's client

pytestmark = pytest.mark.spark_delta


def test_no_module_but_one_reaches_into_the_jvm():
    reaching = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for folder in ("pipelines", "state", "expectations")
        for path in sorted(Path(REPO, folder).rglob("*.py"))
        if path != THE_JVM_MODULE
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if JVM_SIDE.search(line.split("#")[0])
    ]
    assert reaching == [], "only state/engines/jvm.py may reach into Spark's JVM:\n" + "\n".join(reaching)


@ON_DEMAND
def test_on_a_session_that_refuses_what_serverless_refuses_every_join_is_exact_through_crashes_and_the_cli_starts_no_jvm(
    connect_server, spark, tmp_path
):
    """On a Spark Connect session that refuses settings, caching and clones: the typed join through crashes (a folder
    warehouse), and change feeds on a catalog warehouse whose tables the client reaches by name only (a path read of
    their storage is refused), twice: the second time with an OPTIMIZE committed inside each write of one batch. Then
    the CLI as a new user tries it, SPARK_REMOTE naming the server: its run is one more batch, probing the state the
    others left."""
    found = _scenarios(tmp_path, "--remote", connect_server)
    typed = _assert_serverless_scenarios(found, spark)
    records = tmp_path / "more.jsonl"
    records.write_text(json.dumps({"id": "r99", "customer": "c1", "at": "2026-01-01T11:00:00Z"}) + "\n")
    warehouse, env = os.path.join(str(tmp_path), "serverless"), {"SPARK_REMOTE": connect_server}
    ingested = lakejoin("ingest", "--warehouse", warehouse, "--relation", "r", str(records), cwd=str(tmp_path), env=env)
    assert ingested.returncode == 0 and "1 rows to bronze/r" in ingested.stdout, ingested.stderr
    ran = lakejoin("run", "--warehouse", warehouse, cwd=str(tmp_path), env=env)
    assert ran.returncode == 0 and "1 arrivals, 2 pairs" in ran.stdout, (
        ran.stdout + ran.stderr[-2000:]
    )  # s7 and s13 of c1
    status = lakejoin("status", "--warehouse", warehouse, "--json", cwd=str(tmp_path), env=env)
    assert status.returncode == 0 and json.loads(status.stdout)["last_committed_batch"] == typed["committed"] + 1, (
        status.stderr
    )


@ON_DEMAND
def test_with_the_client_serverless_environment_5_ships_every_join_is_exact_through_crashes_and_races(
    serverless_server, serverless_client, spark, tmp_path
):
    """The same scenarios run by the client of the bundle's serverless environment (5: Databricks Connect 18, Python
    3.12, from PyPI), refusing what serverless refuses, against the local Spark Connect server (its Python workers on
    3.12 too, as serverless runs the client's Python)."""
    found = _scenarios(tmp_path, "--remote", serverless_server, python=serverless_client)
    assert found["client"].startswith("databricks-connect 18."), found["client"]
    _assert_serverless_scenarios(found, spark)


@ON_DEMAND
def test_on_a_session_that_refuses_what_serverless_refuses_every_kind_of_join_is_exact_and_the_acceptance_checks_pass(
    connect_server, spark, tmp_path
):
    """Every other kind of join on catalog warehouses, each exact against its reference, a source table and an idle
    relation among them; and the checks of the acceptance job (pipelines/commands/acceptance.py), the path read refused."""
    found = _scenarios(tmp_path, "--remote", connect_server, "--every-kind", timeout=3600)
    for kind, joined in found["kinds"].items():
        assert joined["gold"] == joined["expected"] and joined["gold"], kind
    assert set(found["kinds"]) == {"inner", "left", "full", "asof", "three-way", "synchronized", "idle", "table"}
    assert found["acceptance"] == [], "every check of a workspace passes here, the path read of managed storage refused"


def test_a_databricks_task_gets_the_runtime_s_session_and_never_starts_a_local_one(spark, monkeypatch):
    """A wheel task on a job cluster or serverless may have no active session on its thread; Java need not be there."""
    import pipelines.spark as spark_module

    monkeypatch.setenv(spark_module.DATABRICKS, "client.4.0")
    monkeypatch.delenv(spark_module.REMOTE, raising=False)
    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(spark_module, "check_java", lambda: pytest.fail("a local session was started"))
    assert spark_module.get_spark() is spark


@ON_DEMAND
def test_on_a_standalone_cluster_joins_are_exact_and_the_cli_runs_there(standalone_cluster, spark, tmp_path):
    found = _scenarios(tmp_path, "--master", standalone_cluster)
    assert (found["session"], found["engine"]) == ("pyspark.sql.session", "spark")
    assert found["executors"] == 2, "the cluster's two workers ran the job"
    _assert_worked_example(found)
    # the command line on the cluster: one more payment of the worked example's key, landed here, joins its three orders
    (tmp_path / "s9.jsonl").write_text(json.dumps({"id": "s9", "ts": 9, "key": "k", "payload": "payload s9"}) + "\n")
    worked = os.path.join(str(tmp_path), "worked")
    ingest_files(make_engine(spark, "spark"), Warehouse(worked), relation("s"), [str(tmp_path / "s9.jsonl")])
    ran = lakejoin("run", "--warehouse", worked, "--master", standalone_cluster, cwd=str(tmp_path), engine="spark")
    assert ran.returncode == 0 and "1 arrivals, 3 pairs" in ran.stdout, ran.stdout + ran.stderr[-2000:]


def _scenarios(tmp_path: Path, *where: str, timeout: int = 1800, python: str = sys.executable) -> dict:
    ran = subprocess.run(
        [python, "-m", "tests.where_spark_runs", str(tmp_path), *where],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, timeout=timeout,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    return json.loads(ran.stdout.strip().splitlines()[-1])


def _assert_serverless_scenarios(found: dict, spark: SparkSession) -> dict:
    """The scenarios a client refusing what serverless refuses ran, each exact; returns the typed join's."""
    assert (found["session"], found["engine"]) == ("pyspark.sql.connect.session", "spark")
    assert found["refused"] == ["cloneSession"], "only the engine's one question to the session was refused"
    typed = found["typed"]
    assert len(typed["crashed"]) == 2 and typed["valid"] and typed["committed"] == 3
    # r's state: made by batch 1's append, then per batch a commit of no rows carrying the marker and the MERGE; the
    # MERGE cut short by the first crash ran when resumed, the one before the second was not run again
    assert typed["operations"] == ["WRITE", "WRITE", "MERGE", "WRITE", "MERGE"], typed["operations"]
    assert found["r_state_merges"] == 2, "a MERGE run again would commit nothing, so the statements are counted too"
    assert "columns 'Note' and 'note' differ only in case" in typed["refusal"], (
        "inferred without telling case apart, still refused"
    )
    _assert_join_exact(typed, spark)
    changes = found["changes"]  # change feeds: gold after each run, beside the reference's
    assert [[tuple(row) for row in run] for run in changes["gold"]] == [
        [tuple(row) for row in run] for run in changes["expected"]
    ]
    assert changes["gold"][-1], "the last run holds pairs"
    raced = found["raced"]  # change feeds on a catalog warehouse, an OPTIMIZE committed inside each write of a batch
    assert raced["won"] == raced["writes"] and raced["lost"] == raced["merges"], raced
    assert raced["races"] > 0 and raced["gold"] == raced["expected"], raced
    return typed


def _assert_worked_example(found: dict) -> None:
    """The worked example's gold row by row: a pair made in batch b of one-record batches is made in the batch holding
    its b-th record."""
    _, one_by_one = ORDERS[WORKED_ORDER]
    expected = {(r_id, s_id, owner, (batch - 1) // WORKED_BATCH_ROWS + 1) for r_id, s_id, owner, batch in one_by_one}
    assert {tuple(row) for row in found["worked"]} == expected and len(found["worked"]) == len(expected)


def _assert_join_exact(typed: dict, spark: SparkSession) -> None:
    """Gold equal to the batch SQL join of the two files."""
    for name, path in typed["files"].items():
        spark.read.parquet(path).createOrReplaceTempView(f"typed_{name}")
    names = TYPES.names
    batch_join = spark.sql(
        f"SELECT {', '.join(f'r.`{n}` AS `r_{n}`' for n in names)}, {', '.join(f's.`{n}` AS `s_{n}`' for n in names)}, "
        f"CASE WHEN r.at <= s.at THEN 'R' ELSE 'S' END AS owner FROM typed_r r JOIN typed_s s ON {TYPED_CONFIG['predicate']}"
    )
    gold = spark.read.format("delta").load(typed["gold"]).select(*batch_join.columns)
    assert gold.count() > 0
    assert_df_equality(comparable(gold), comparable(batch_join), ignore_row_order=True, ignore_nullable=True)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _connect_server(tmp_path_factory, sys.executable)


@pytest.fixture(scope="module")
def serverless_client() -> str:
    """The Python of the client serverless environment 5 ships (Databricks Connect 18 on Python 3.12), in a
    virtualenv the Makefile makes once."""
    made = subprocess.run(["make", "-s", f"{SERVERLESS_VENV}/.installed"], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    return str(Path(REPO, SERVERLESS_VENV, "bin", "python"))


@pytest.fixture(scope="module")
def serverless_server(tmp_path_factory: pytest.TempPathFactory, serverless_client: str) -> Iterator[str]:
    yield from _connect_server(tmp_path_factory, serverless_client)


def _connect_server(tmp_path_factory: pytest.TempPathFactory, workers: str) -> Iterator[str]:
    """A Spark Connect server from pyspark's own jars (spark-connect ships in pyspark), with Delta's jars and its two
    settings, as a user starts one; lakejoin's local tuning (few shuffle partitions, one task per snapshot) too; its Python workers run ``workers``
    (a Python UDF needs the client's Python version)."""
    jars = _jars()
    port = _free_port()
    conf = {
        **DELTA_CONF, "spark.connect.grpc.binding.port": str(port), "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
        "spark.sql.session.timeZone": "UTC",
        # its default, as a number: Spark 4.1.4 shows it as "3221225472b", which Databricks Connect 18.3's client (its
        # pyspark 4.1.0) cannot parse, so no DataFrame of local rows could be made through it
        "spark.sql.session.localRelationSizeLimit": "3221225472",
    }  # fmt: skip
    command = [
        f"{SPARK_HOME}/bin/spark-submit", "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master", "local[2]", "--jars", ",".join(jars), *[arg for item in conf.items() for arg in ("--conf", "=".join(item))], "spark-internal",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("connect") / "server.log"
    with _started(command, log, "Spark Connect server started", 1, {"PYSPARK_PYTHON": workers}):
        yield f"sc://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone master and two workers of one core each on 127.0.0.1, from pyspark's ``spark-class``."""
    _jars()
    folder = tmp_path_factory.mktemp("cluster")
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    spark_class = f"{SPARK_HOME}/bin/spark-class"
    master_command = [
        spark_class,
        "org.apache.spark.deploy.master.Master",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--webui-port",
        "0",
    ]
    with _started(master_command, folder / "master.log", "Starting Spark master", 1) as master_log:
        workers = [
            [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1", "--cores", "1", "--memory", "2g",
             "--webui-port", "0", "--work-dir", str(folder / f"work-{number}")]
            for number in (1, 2)
        ]  # fmt: skip
        with (
            _started(workers[0], folder / "worker-1.log", "Successfully registered", 1),
            _started(workers[1], folder / "worker-2.log", "Successfully registered", 1),
        ):
            _wait_for(master_log, "Registering worker", 2)
            yield master


def _jars() -> list[str]:
    jars = delta_jars(os.environ.get(DELTA_JARS))
    if not jars:
        pytest.skip(f"needs Delta Lake's JVM jars ({DELTA_JARS}) for the server's and the executors' Delta")
    return jars


class _started:
    """A JVM process in a group of its own, ready once its log says ``ready`` (``times`` times); stopped on exit."""

    def __init__(self, command: list[str], log: Path, ready: str, times: int, env: dict | None = None) -> None:
        self.command, self.log, self.ready, self.times, self.env = command, log, ready, times, env or {}

    def __enter__(self) -> Path:
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "SPARK_HOME": SPARK_HOME, **self.env},
            )
        try:
            _wait_for(self.log, self.ready, self.times, self.process)
        except BaseException:
            self.__exit__()
            raise
        return self.log

    def __exit__(self, *_: object) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)


def _wait_for(
    log: Path, text: str, times: int, process: subprocess.Popen | None = None, timeout: float = 120.0
) -> None:
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count(text) < times:
        if process is not None and process.poll() is not None:
            raise AssertionError(
                f"{process.args[0]} ended ({process.returncode}): {log.read_text(errors='replace')[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"no '{text}' in {log} after {timeout} s: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.5)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
