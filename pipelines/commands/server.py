"""``lakejoin serve``: a local Spark that outlives the commands, so a command costs its work, not a JVM's start.

``lakejoin serve`` starts a process that hosts a local Spark session with lakejoin's settings (Delta from
``LAKEJOIN_DELTA_JARS`` when set) and a Spark Connect server on it, bound to the loopback interface and answering only
calls that carry its token. Its address, token and lakejoin version are in ``server.json`` under ``LAKEJOIN_HOME``
(``~/.lakejoin`` by default), in a folder only the user who started it can read. While it is up, every computing
command (``ingest``, ``run``, ``validate``, ``maintain``, ``advance``) connects to it instead of starting a JVM;
``--remote``, ``--master`` or ``SPARK_REMOTE`` still choose their own Spark. It stops on ``lakejoin serve --stop``
or after ``--idle-minutes`` with no command connected and nothing running.

Exactly-once needs one more thing from a server: a command killed mid-batch (``kill -9``) may leave an operation
running in the server after the warehouse lock its process held is gone. So each command tags its operations with
its process and leaves a mark (``clients/<pid>-<start>``) while it runs; the host interrupts the operations of a
command whose process is gone and removes its mark once none is left, and a command waits for the marks of dead
commands to go before it starts. A server killed while a command runs is a crash of that command: the rerun finishes
its batch.

A process id alone names no process for long: after a crash or a reboot another process may have it. So the record
and the marks name a process by its id and its start (``Process``): one whose id now belongs to another is gone. A
record whose server is gone is removed, with one line saying so, and never trusted or signalled.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import NamedTuple

from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from pipelines.spark import DELTA_JARS, REMOTE, get_spark, hurried_retries, stop_session
from state.errors import LakejoinError

HOME = "LAKEJOIN_HOME"
TOKEN = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # where Spark Connect's server reads its token: never on a command line
VERSION = version("lakejoin")
VERSION_CONF = "spark.lakejoin.version"  # set on the server, read by each client: a server of another version refuses
CLIENT_TAG = "lakejoin-client-"
DEFAULT_IDLE_MINUTES = 60.0
POLL_SECONDS = 0.5
START_SECONDS = 120.0  # a server's start-up (its JVM, Delta's classes) on a loaded machine
REAP_SECONDS = 120.0  # how long a command waits for the operations a killed one left to be interrupted


class Process(NamedTuple):
    """A process named so that a later one given the same id is not taken for it: its id and its start."""

    pid: int
    started: str

    @classmethod
    def this(cls) -> Process:
        return cls(os.getpid(), _start_of(os.getpid()) or "")

    @classmethod
    def of_mark(cls, name: str) -> Process | None:
        pid, _, started = name.partition("-")
        return cls(int(pid), started) if pid.isdigit() and started else None

    @property
    def mark(self) -> str:
        """Its name as a command's mark, and in the tag of the command's operations."""
        return f"{self.pid}-{self.started}"

    def running(self) -> bool:
        """This very process runs: its id is taken by a process of the same start (a zombie has ended)."""
        return _start_of(self.pid) == self.started


@dataclass(frozen=True)
class Server:
    """A running ``lakejoin serve``, as ``server.json`` records it."""

    pid: int
    started: str  # the process's start (Process): with the id, what tells the server from a later process of its id
    port: int
    token: str
    version: str
    delta_jars: str | None
    idle_minutes: float

    @property
    def process(self) -> Process:
        return Process(self.pid, self.started)

    @property
    def url(self) -> str:
        """Spark Connect's URL with the token; ``localhost`` keeps the channel plain, the token still required."""
        return f"sc://localhost:{self.port}/;token={self.token}"

    def describe(self) -> str:
        delta = f"Delta on Spark from {self.delta_jars}" if self.delta_jars else "no Delta jars (delta-rs)"
        return (
            f"lakejoin server: up on 127.0.0.1:{self.port} (pid {self.pid}, lakejoin {self.version}, {delta}); "
            f"stops after {self.idle_minutes:g} idle minutes or on 'lakejoin serve --stop'"
        )


def folder() -> Path:
    return Path(os.environ.get(HOME) or Path.home() / ".lakejoin") / "server"


def running() -> Server | None:
    """The server this user started, if its process is the one recorded. A record whose server is gone (it died, or
    the machine restarted, and its id may now be another process's) is removed, with one line on stderr."""
    record = folder() / "server.json"
    try:
        text = record.read_text()
    except OSError:
        return None
    try:
        server = Server(**json.loads(text))
    except (ValueError, TypeError):
        server = None  # a record of another lakejoin version, or cut short
    if server is not None and server.process.running():
        return server
    with contextlib.suppress(OSError):
        if record.read_text() == text:  # not a new server's, written meanwhile
            record.unlink()
            gone = f"pid {server.pid} is not that server" if server else "it is not a record this lakejoin reads"
            print(f"lakejoin: removed the record of a lakejoin server that is gone ({gone}): {record}", file=sys.stderr)
    return None


def describe_running(server: Server | None) -> str:
    """What ``lakejoin status`` says of the server (``server``: the one running, if any)."""
    return (
        server.describe()
        if server
        else "lakejoin server: none ('lakejoin serve' starts one; commands then start no JVM)"
    )


def start(idle_minutes: float = DEFAULT_IDLE_MINUTES, port: int | None = None, verbose: bool = False) -> Server:
    """Start the server in a process of its own and return once it answers; its output goes to ``server.log``."""
    if (server := running()) is not None:
        raise LakejoinError(
            f"a lakejoin server is already up (pid {server.pid}, port {server.port}): 'lakejoin serve --stop' stops it"
        )
    home = _private_folder()
    for stale in [home / "server.json", *(home / "clients").glob("*")]:
        stale.unlink(missing_ok=True)  # a server that died left them; its commands died with it
    command = [
        sys.executable,
        "-m",
        "pipelines.commands.server",
        "--idle-minutes",
        str(idle_minutes),
        "--port",
        str(port or _free_port()),
    ]
    environment = {name: value for name, value in os.environ.items() if name != REMOTE} | {
        TOKEN: secrets.token_urlsafe(32)
    }
    with open(home / "server.log", "w") as log:
        process = subprocess.Popen(
            command + (["--verbose"] if verbose else []),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )  # outlives this command and its terminal
    deadline = time.monotonic() + START_SECONDS
    while (server := running()) is None or server.pid != process.pid:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            tail = (home / "server.log").read_text().strip().splitlines()[-1:] or ["no output"]
            raise LakejoinError(f"the lakejoin server did not start ({tail[0]}): its log is {home / 'server.log'}")
        time.sleep(0.2)
    return server


def stop() -> Server | None:
    """Stop the running server (the commands connected to it fail, as if killed) and wait for it to end."""
    server = running()
    if server is None:
        return None
    os.kill(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while server.process.running() and time.monotonic() < deadline:
        time.sleep(0.1)
    if server.process.running():
        os.kill(server.pid, signal.SIGKILL)
    return server


@contextlib.contextmanager
def attached(server: Server, verbose: bool = False) -> Iterator[SparkSession]:
    """A session on ``server`` for one command: refused when the server runs another lakejoin or another Delta set-up;
    once the operations of killed commands are interrupted; its own operations tagged with this process."""
    if server.version != VERSION:
        raise LakejoinError(
            f"the lakejoin server runs lakejoin {server.version} and this is {VERSION}: restart it ('lakejoin serve "
            "--stop', then 'lakejoin serve')"
        )
    if (os.environ.get(DELTA_JARS) or None) != server.delta_jars:
        raise LakejoinError(
            f"the lakejoin server was started with {DELTA_JARS}={server.delta_jars or ''} and this command has "
            f"{os.environ.get(DELTA_JARS, '')}: restart it ('lakejoin serve --stop', then 'lakejoin serve') or run "
            "with the same"
        )
    _wait_for_killed_commands()
    this = Process.this()
    mark = folder() / "clients" / this.mark
    mark.touch()
    spark = None
    try:
        spark = get_spark(remote=server.url, verbose=verbose)
        spark.client.set_retry_policies(
            hurried_retries()
        )  # a server killed mid-command fails it in seconds, not minutes
        # Reattachable execution guards a stream across a network's drops, which a local server has none of; its
        # asynchronous release can reach the server before the stream's last send, which then logs an ERROR.
        spark.client.disable_reattachable_execute()
        served = spark.conf.get(VERSION_CONF, None)
        if served != VERSION:
            raise LakejoinError(
                f"the Spark Connect server on port {server.port} runs lakejoin {served or 'unknown'} and this is "
                f"{VERSION}: restart it"
            )
        spark.addTag(f"{CLIENT_TAG}{this.mark}")
        yield spark
    except PySparkException as exc:
        if server.process.running():
            raise
        raise LakejoinError(
            "the lakejoin server stopped while this command ran: rerun it (a batch it left unfinished "
            "resumes), after 'lakejoin serve' or with a Spark of its own"
        ) from exc
    finally:
        if spark is not None and server.process.running():
            stop_session(spark)
        mark.unlink(missing_ok=True)


def _wait_for_killed_commands() -> None:
    deadline = time.monotonic() + REAP_SECONDS
    while dead := _dead_clients():
        if time.monotonic() > deadline:
            raise LakejoinError(
                "the lakejoin server is still stopping what killed commands (pid "
                f"{', '.join(str(gone.pid) for gone in dead)}) left running: try again, or restart it ('lakejoin serve "
                "--stop')"
            )
        time.sleep(0.1)


def _dead_clients() -> list[Process]:
    return [client for client in _clients() if not client.running()]


def _clients() -> list[Process]:
    return [client for mark in (folder() / "clients").glob("*") if (client := Process.of_mark(mark.name))]


def _start_of(pid: int) -> str | None:
    """A digest of when process ``pid`` started (on Linux its start in clock ticks and the boot's id; elsewhere its
    start time as ``ps`` gives it); None when no process has that id, or it ended and awaits its parent (a zombie)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
            with open("/proc/sys/kernel/random/boot_id") as boot:
                started = f"{boot.read().strip()}:{fields[19]}"  # the stat's 22nd field, counted after the name's ')'
        except (OSError, IndexError):
            return None
        zombie = fields[0] == "Z"
    else:
        shown = subprocess.run(
            ["ps", "-o", "stat=,lstart=", "-p", str(pid)], capture_output=True, text=True
        ).stdout.split(maxsplit=1)
        if len(shown) < 2:
            return None
        zombie, started = shown[0].startswith("Z"), shown[1].strip()
    return None if zombie else hashlib.sha256(started.encode()).hexdigest()[:16]


def _private_folder() -> Path:
    """The server's folder, readable by its user alone (the token is in it)."""
    home = folder()
    (home / "clients").mkdir(parents=True, exist_ok=True)
    for path in (home.parent, home, home / "clients"):
        path.chmod(0o700)
    return home


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _host(idle_minutes: float, port: int, verbose: bool) -> None:
    """The server's process: Spark with Spark Connect on it, the record once it listens, then watching for killed
    commands and for idleness until stopped."""
    settings = {
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        VERSION_CONF: VERSION,
    }
    spark = get_spark(conf=settings, app_name="lakejoin-serve", verbose=verbose)
    stopping: list[int] = []
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda signum, _: stopping.append(signum))
    this = Process.this()
    server = Server(
        this.pid, this.started, port, os.environ[TOKEN], VERSION, os.environ.get(DELTA_JARS) or None, idle_minutes
    )
    record = folder() / "server.json"
    written = record.with_suffix(".tmp")
    written.touch(mode=0o600)
    written.write_text(json.dumps(asdict(server)))
    written.replace(record)
    print(server.describe(), flush=True)
    try:
        _watch(spark, idle_minutes * 60, stopping)
    finally:
        record.unlink(missing_ok=True)
        spark.stop()


def _watch(spark: SparkSession, idle_seconds: float, stopping: list[int]) -> None:
    from state.engines.jvm import connect_executions, interrupt_connect_tag

    last_used = time.time()
    quiet: dict[Process, int] = {}  # a killed command: looks in a row that found nothing of it running
    while not stopping:
        running = connect_executions(spark)
        executions = [] if isinstance(running, int) else running
        clients = _clients()
        dead = [client for client in clients if not client.running()]
        if executions or len(dead) < len(clients):
            last_used = time.time()
        elif isinstance(running, int):
            last_used = max(last_used, running / 1000)
        for client in dead:
            tag = f"{CLIENT_TAG}{client.mark}"
            left = [(user, session) for user, session, tags in executions if tag in tags]
            for user, session in left:
                interrupt_connect_tag(spark, user, session, tag)
            quiet[client] = 0 if left else quiet.get(client, 0) + 1
            if quiet[client] >= 2:  # nothing of it for a whole look: a call it sent before dying has arrived by now
                (folder() / "clients" / client.mark).unlink(missing_ok=True)
                del quiet[client]
        if time.time() - last_used > idle_seconds:
            print(f"idle for {idle_seconds / 60:g} minutes: stopping", flush=True)
            return
        time.sleep(POLL_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(description="the process of 'lakejoin serve' (started by it, not by hand)")
    parser.add_argument("--idle-minutes", type=float, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    _host(args.idle_minutes, args.port, args.verbose)


if __name__ == "__main__":
    main()
