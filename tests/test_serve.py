"""``lakejoin serve``: commands connect to one local Spark that outlives them, and exactly-once holds through kills."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import yaml

from benchmarks.costs import Cost
from pipelines.commands import server
from pipelines.spark import DELTA_JARS, REMOTE
from tests.conftest import SECOND_VIEW
from tests.helpers import LAKEJOIN, REPO, Pipeline, lakejoin, lakejoin_here
from tests.reference import Record, batch_join
from tests.test_changes import CONFIG as CHANGE_CONFIG
from tests.test_changes import change

# The server has Delta's jars when the tests do, and a command's must match its server's: both engines are chosen
# by each warehouse's config (engine: delta-rs or spark), the session being the same.
SESSION_ENGINE = "spark" if os.environ.get(DELTA_JARS) else "delta-rs"
ENGINES = ["delta-rs", pytest.param("spark", marks=pytest.mark.spark_delta)]


def start_server(home: str) -> dict[str, str]:
    os.makedirs(home, exist_ok=True)
    env = {server.HOME: home}
    started = lakejoin("serve", "--idle-minutes", "20", cwd=home, engine=SESSION_ENGINE, env=env)
    assert started.returncode == 0 and "lakejoin server: up" in started.stdout, started.stdout + started.stderr
    return env


@contextlib.contextmanager
def serving(home: str) -> Iterator[dict[str, str]]:
    """A server up while the block runs: the environment that finds it."""
    env = start_server(home)
    try:
        yield env
    finally:
        lakejoin("serve", "--stop", cwd=home, engine=SESSION_ENGINE, env=env)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A server for the module's commands."""
    with serving(str(tmp_path_factory.mktemp("home"))) as env:
        yield env


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A server of the test's own, whose log no other test's commands (nor their kills) write to."""
    with serving(str(tmp_path_factory.mktemp("own-home"))) as env:
        yield env


def no_java(env: dict[str, str]) -> dict[str, str]:
    """``env`` where no JVM can start (no java on the PATH, no JAVA_HOME): a command that works in it started none."""
    return {**env, "PATH": os.path.dirname(sys.executable), "JAVA_HOME": ""}


def records(count: int, seed: int, prefix: str = "") -> list[Record]:
    rng = random.Random(seed)
    return [
        Record(side, f"{prefix}{side}{i}", rng.randrange(100), f"k{rng.randrange(5)}")
        for side in "rs"
        for i in range(count)
    ]


def row(record: Record) -> dict:
    return {"id": record.id, "ts": record.ts, "key": record.key, "payload": record.payload}


def server_pid(env: dict[str, str]) -> int:
    with open(os.path.join(env[server.HOME], "server", "server.json")) as record:
        return json.load(record)["pid"]


def configured(pipeline: Pipeline, engine: str) -> str:
    """A config choosing ``engine`` for the warehouse (Delta on Spark skips where the server has no Delta)."""
    if engine == "spark" and SESSION_ENGINE != "spark":
        pytest.skip(f"Delta on Spark needs {DELTA_JARS}")
    os.makedirs(pipeline.root, exist_ok=True)
    path = os.path.join(pipeline.root, "config.yaml")
    with open(path, "w") as config:
        config.write(f"engine: {engine}\n")
    return path


@pytest.mark.parametrize("engine", ENGINES)
def test_with_a_server_up_commands_start_no_jvm_and_join_exactly_with_no_error_in_its_log(
    own_server, deltars, tmp_path, engine
):
    """No query the commands run fails as a matter of course: the server's log, where its Spark logs, gains no ERROR
    line through ingest, run and validate."""
    pipeline = Pipeline(deltars, str(tmp_path))
    arrivals = records(6, seed=1)
    config = configured(pipeline, engine)
    env = no_java(own_server)
    for side in "rs":
        path = pipeline.write_file([row(record) for record in arrivals if record.relation == side])
        ingested = lakejoin(
            "ingest",
            "--warehouse",
            pipeline.warehouse.root,
            "--config",
            config,
            "--side",
            side,
            path,
            cwd=pipeline.root,
            engine=SESSION_ENGINE,
            env=env,
        )
        assert ingested.returncode == 0, ingested.stderr[-2000:]
    ran = lakejoin("run", "--warehouse", pipeline.warehouse.root, cwd=pipeline.root, engine=SESSION_ENGINE, env=env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert pipeline.gold_pairs() == Counter(batch_join(arrivals))
    status = lakejoin(
        "status", "--warehouse", pipeline.warehouse.root, "--json", cwd=pipeline.root, engine=SESSION_ENGINE, env=env
    )
    assert json.loads(status.stdout)["server"]["pid"] == server_pid(own_server)
    validated = lakejoin(
        "validate", "--warehouse", pipeline.warehouse.root, cwd=pipeline.root, engine=SESSION_ENGINE, env=env
    )
    assert validated.returncode == 0, validated.stdout[-2000:] + validated.stderr[-2000:]
    with open(os.path.join(own_server[server.HOME], "server", "server.log")) as server_log:
        assert [line for line in server_log if " ERROR " in line] == []


def test_through_the_server_a_change_feed_join_runs_on_after_a_batch_that_changes_nothing_in_gold(
    served, deltars, tmp_path
):
    """Commands on the server are Spark Connect clients: a change feed's gold MERGE reaches the rules' observation once,
    and its batch leaves its mark in gold though it changes nothing there (an update of a record with no partner). On
    delta-rs: Delta on Spark over Connect runs change feeds in the serverless scenario (tests/test_where_spark_runs.py)."""
    pipeline = Pipeline(deltars, str(tmp_path))
    config = configured(pipeline, "delta-rs")
    with open(config, "a") as more:
        more.write(yaml.safe_dump(CHANGE_CONFIG))
    schedule = [
        ("r", change("c", 1, "o1", 1, "k1")),
        ("r", change("u", 2, "o1", 2, "k2")),
        ("s", change("c", 1, "p1", 3, "k2")),
    ]
    for relation, record in schedule:
        path = pipeline.write_file([record])
        ingested = lakejoin(
            "ingest",
            "--warehouse",
            pipeline.warehouse.root,
            "--config",
            config,
            "--relation",
            relation,
            path,
            cwd=pipeline.root,
            engine=SESSION_ENGINE,
            env=served,
        )
        ran = lakejoin(
            "run", "--warehouse", pipeline.warehouse.root, cwd=pipeline.root, engine=SESSION_ENGINE, env=served
        )
        assert ingested.returncode == ran.returncode == 0, ingested.stderr[-2000:] + ran.stderr[-2000:]
    assert [(row["_r_id"], row["_s_id"]) for row in pipeline.gold_rows()] == [("o1", "p1")]


def test_a_server_of_another_lakejoin_or_delta_set_up_is_refused_in_one_line_and_nothing_changes(
    served, deltars, tmp_path
):
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land(records(2, seed=2))
    before = pipeline.versions()
    record = os.path.join(served[server.HOME], "server", "server.json")
    kept = open(record).read()
    try:
        with open(record, "w") as other:
            other.write(json.dumps({**json.loads(kept), "version": "0.0.1"}))
        refused = lakejoin(
            "run", "--warehouse", pipeline.warehouse.root, cwd=pipeline.root, engine=SESSION_ENGINE, env=served
        )
    finally:
        with open(record, "w") as restored:
            restored.write(kept)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"lakejoin: error: the lakejoin server runs lakejoin 0.0.1 and this is {server.VERSION}: "
        "restart it ('lakejoin serve --stop', then 'lakejoin serve')"
    ]
    other_jars = lakejoin(
        "run",
        "--warehouse",
        pipeline.warehouse.root,
        cwd=pipeline.root,
        engine=SESSION_ENGINE,
        env={**served, DELTA_JARS: "" if os.environ.get(DELTA_JARS) else REPO},
    )
    assert other_jars.returncode == 2 and "the lakejoin server was started with" in other_jars.stderr, other_jars.stderr
    # the server itself answers with its version: a client of another one stops there
    script = (
        "import sys; from pipelines.commands import server; server.VERSION = '0.0.2'; running = server.running(); "
        "from dataclasses import replace\nwith server.attached(replace(running, version='0.0.2')): pass"
    )
    checked = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **no_java(served), "PYTHONPATH": REPO},
        timeout=300,
    )
    assert checked.returncode != 0 and f"runs lakejoin {server.VERSION} and this is 0.0.2" in checked.stderr, (
        checked.stderr[-2000:]
    )
    assert pipeline.versions() == before


# A Spark Connect client's requests (analyze, execute, config) per step of benchmarks/costs.py's few-row cycle, on
# delta-rs; tests/test_costs.py holds a classic session's jobs and calls to the JVM.
CONNECT_BUDGET = {
    "ingest": Cost(round_trips=28, commits=4),
    "run": Cost(round_trips=31, commits=4),
    "micro-batch": Cost(round_trips=61, commits=8),
    "landing run": Cost(round_trips=54, commits=6),
}


def test_each_step_of_a_few_row_cycle_over_spark_connect_stays_within_its_budget_of_requests(
    served, tmp_path, monkeypatch
):
    monkeypatch.setenv(server.HOME, served[server.HOME])
    out = tmp_path / "costs.json"
    counted = subprocess.run(
        [sys.executable, "-m", "benchmarks.costs", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, REMOTE: server.running().url},
        timeout=900,
    )
    assert counted.returncode == 0, counted.stderr[-2000:]
    costs = {step: Cost(**counts) for step, counts in json.loads(out.read_text())["steps"].items()}
    assert {step: found for step, cost in costs.items() if (found := cost.over(CONNECT_BUDGET[step]))} == {}


def test_status_says_when_no_server_is_up(deltars, tmp_path, monkeypatch):
    monkeypatch.setenv(server.HOME, str(tmp_path / "home"))
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land(records(1, seed=3))
    status = lakejoin_here("status", "--warehouse", pipeline.warehouse.root, cwd=pipeline.root)
    assert status.stdout.strip().splitlines()[-1].startswith("lakejoin server: none")


def run_args(pipeline: Pipeline, *extra: str) -> list[str]:
    return ["run", "--warehouse", pipeline.warehouse.root, "--max-batch-rows", "4", *extra]


@SECOND_VIEW  # kill -9 of a command: tests/test_concurrency.py (a run), tests/test_api.py (streams)
@pytest.mark.parametrize("engine", ENGINES)
def test_commands_killed_at_random_moments_through_the_server_then_rerun_give_the_uninterrupted_result(
    served, deltars, tmp_path, engine
):
    """kill -9 of ingests and runs while the server lives: what they left running there is stopped before the next
    command starts, and the rerun's warehouse is the uninterrupted one's."""
    pipeline = Pipeline(deltars, str(tmp_path / "killed"))
    uninterrupted = Pipeline(deltars, str(tmp_path / "uninterrupted"))
    first, more = records(20, seed=4), records(4, seed=5, prefix="more-")
    for each in (pipeline, uninterrupted):
        os.makedirs(each.root)
        each.land(first)
    config = configured(pipeline, engine)
    files = {side: pipeline.write_file([row(record) for record in more if record.relation == side]) for side in "rs"}
    rng = random.Random(11)
    for side, path in files.items():  # an ingest killed at once, mid-way or near its end, then given again
        victim = start(
            pipeline, served, "ingest", "--warehouse", pipeline.warehouse.root, "--config", config, "--side", side, path
        )
        time.sleep(rng.uniform(0.2, 2.0))
        os.killpg(victim.pid, signal.SIGKILL)
        victim.communicate()
        again = lakejoin(
            "ingest",
            "--warehouse",
            pipeline.warehouse.root,
            "--side",
            side,
            path,
            cwd=pipeline.root,
            engine=SESSION_ENGINE,
            env=served,
        )
        assert again.returncode == 0, again.stderr[-2000:]
        uninterrupted.ingest(side, files[side])
    for _ in range(2):
        victim = start(pipeline, served, *run_args(pipeline))
        time.sleep(rng.uniform(0.5, 6.0))  # within the run: no JVM to start, ten batches of a second or so
        os.killpg(victim.pid, signal.SIGKILL)
        victim.communicate()
    rerun = lakejoin(*run_args(pipeline), cwd=pipeline.root, engine=SESSION_ENGINE, env=served)
    uninterrupted.run(max_batch_rows=4)

    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert pipeline.snapshot() == uninterrupted.snapshot()
    assert pipeline.gold_pairs() == Counter(batch_join(first + more))
    assert os.listdir(os.path.join(served[server.HOME], "server", "clients")) == []


@SECOND_VIEW  # a run dying at each write resumes: tests/test_recovery.py; the server's own death: on demand
def test_the_server_killed_during_a_run_fails_the_command_and_a_rerun_without_it_is_exact(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path / "warehouse"))
    os.makedirs(pipeline.root)
    arrivals = records(20, seed=6)
    pipeline.land(arrivals)
    env = start_server(str(tmp_path / "home"))
    victim = start(pipeline, env, *run_args(pipeline))
    time.sleep(random.Random(12).uniform(1.0, 4.0))
    os.killpg(server_pid(env), signal.SIGKILL)  # the server's process group: its JVM too
    _, err = victim.communicate(timeout=300)
    assert victim.returncode != 0 and err.strip().splitlines()[-1].startswith("lakejoin: error:"), err[-2000:]
    rerun = lakejoin(
        *run_args(pipeline), cwd=pipeline.root, engine=SESSION_ENGINE, env=env
    )  # no server: a Spark of its own

    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert pipeline.gold_pairs() == Counter(batch_join(arrivals))


def start(pipeline: Pipeline, env: dict[str, str], *args: str) -> subprocess.Popen:
    """``lakejoin ARGS`` on the server of ``env``, in a process group of its own, so a test can kill it."""
    environment = {**os.environ, "PYTHONPATH": REPO, **env}
    if SESSION_ENGINE == "delta-rs":
        environment.pop(DELTA_JARS, None)
    return subprocess.Popen(
        [*LAKEJOIN, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=pipeline.root,
        env=environment,
        start_new_session=True,
    )


def test_the_mark_of_a_command_is_told_dead_when_its_process_is_gone_or_its_id_was_given_to_another(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(server.HOME, str(tmp_path))
    clients = tmp_path / "server" / "clients"
    clients.mkdir(parents=True)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    with stranger() as other:
        gone = server.Process(ended.pid, "0123456789abcdef")
        reused = server.Process(other.pid, "0123456789abcdef")  # a command's id, now a stranger's
        for mark in (gone, reused, server.Process.this()):
            (clients / mark.mark).touch()
        assert sorted(server._dead_clients()) == sorted([gone, reused])


def test_a_record_naming_a_process_that_is_not_the_server_is_removed_in_one_line_and_stop_spares_that_process(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(server.HOME, str(tmp_path))
    record = tmp_path / "server" / "server.json"
    record.parent.mkdir(parents=True)
    with stranger() as other:
        stale = {
            "pid": other.pid,
            "started": "0123456789abcdef",
            "port": 1,
            "token": "t",
            "version": server.VERSION,
            "delta_jars": None,
            "idle_minutes": 1,
        }
        for ask in (server.running, server.stop):
            record.write_text(json.dumps(stale))
            assert ask() is None
            assert not record.exists() and other.poll() is None, "the stranger was left running"
            told = capsys.readouterr().err.strip().splitlines()
            assert told == [
                f"lakejoin: removed the record of a lakejoin server that is gone (pid {other.pid} is not that server): {record}"
            ]
        record.write_text(json.dumps({"pid": other.pid}))  # an older lakejoin's record: not trusted either
        assert server.running() is None and not record.exists() and other.poll() is None


@contextlib.contextmanager
def stranger() -> Iterator[subprocess.Popen]:
    """A live process that is no lakejoin's."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(not os.path.isdir("/proc/net"), reason="lists sockets from /proc (Linux)")
def test_every_socket_the_server_and_a_local_session_listen_on_is_loopback(served, spark):
    pid = server_pid(served)
    server_group = [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _group_of(int(entry)) == pid]
    this_session = _children(os.getpid())  # the test's own Spark: the JVM this worker started, with lakejoin's settings
    for processes in (server_group, this_session):
        addresses = listening(processes)
        assert addresses and {address for address, _ in addresses} <= {"127.0.0.1", "::1"}, addresses


def listening(pids: list[int]) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket ``pids`` listen on, from /proc: IPv4 as mapped into IPv6 shown as IPv4."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == "0A" and inode in inodes:  # 0A: LISTEN
                    packed, port = local.split(":")
                    raw = b"".join(
                        bytes.fromhex(packed[i : i + 8])[::-1] for i in range(0, len(packed), 8)
                    )  # words in host order
                    address = ipaddress.ip_address(raw)
                    shown = (
                        address.ipv4_mapped
                        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped
                        else address
                    )
                    found.append((str(shown), int(port, 16)))
    return found


def _group_of(pid: int) -> int | None:
    with contextlib.suppress(OSError, IndexError):
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rpartition(")")[2].split()[2])  # the stat's 5th field: the process group
    return None


def _children(parent: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rpartition(")")[2].split()[1]) == parent:  # the 4th field: the parent
                    found.append(int(entry))
    return found
