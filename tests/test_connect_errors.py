"""A Spark Connect URL where no server answers is refused in one line, fast, by every command that computes.

Spark Connect's own client retries such a server for ten minutes or more; lakejoin gives up on the first call."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.helpers import lakejoin

DEADLINE = 30.0  # seconds: what a user waits for a wrong URL, start-up included


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def hanging_up_port() -> Iterator[int]:
    """A port that accepts connections and closes each at once: something listens, but no Spark Connect server."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def hang_up() -> None:
        while True:
            try:
                accepted, _ = listener.accept()
            except OSError:  # the listener closed: the test is over
                return
            accepted.close()

    threading.Thread(target=hang_up, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


COMMANDS = {
    "run": ["run"],
    "ingest": ["ingest", "--relation", "r", "r.jsonl"],
    "status": ["status"],
    "show": ["show"],
    "validate": ["validate"],
    "maintain": ["maintain"],
    "advance": ["advance", "--relation", "r", "--to", "5"],
    "reset": ["reset", "--yes"],
}


def refused(tmp_path, *args: str, env: dict[str, str] | None = None) -> tuple[list[str], float]:
    """Run ``lakejoin ARGS`` on an empty warehouse folder; its stderr lines and seconds, once it exited 2."""
    (tmp_path / "wh").mkdir(exist_ok=True)
    (tmp_path / "r.jsonl").write_text('{"id": "r1", "ts": 1, "key": "k"}\n')
    started = time.monotonic()
    done = lakejoin(*args, cwd=str(tmp_path), env=env)
    seconds = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-2000:]
    return done.stderr.strip().splitlines(), seconds


@pytest.mark.parametrize("command", COMMANDS)
def test_a_closed_port_is_refused_in_one_line_naming_the_url(tmp_path, command):
    url = f"sc://127.0.0.1:{closed_port()}"
    args = [*COMMANDS[command][:1], "--warehouse", "wh", *COMMANDS[command][1:]]
    lines, seconds = refused(tmp_path, *args, "--remote", url)
    assert lines == [
        f"lakejoin: error: cannot reach the Spark Connect server at {url}: Connection refused; check the host and port, and that the server runs"
    ]
    assert seconds < DEADLINE


def test_the_demo_and_spark_remote_are_refused_the_same_way(tmp_path):
    url = f"sc://127.0.0.1:{closed_port()}"
    lines, seconds = refused(tmp_path, "demo", "--rows", "100", env={"SPARK_REMOTE": url})
    assert lines == [
        f"lakejoin: error: cannot reach the Spark Connect server at {url}: Connection refused; check the host and port, and that the server runs"
    ]
    assert seconds < DEADLINE


def test_a_port_that_is_no_spark_connect_server_is_refused_within_the_deadline_and_a_token_is_not_printed(
    tmp_path, hanging_up_port
):
    url = f"sc://127.0.0.1:{hanging_up_port}/;token=dapi0123456789abcdef"
    lines, seconds = refused(tmp_path, "run", "--warehouse", "wh", "--remote", url)
    assert len(lines) == 1 and lines[0].startswith(
        f"lakejoin: error: cannot reach the Spark Connect server at sc://127.0.0.1:{hanging_up_port}/;token=…: "
    )
    assert "dapi" not in lines[0]
    assert seconds < DEADLINE


def test_a_url_that_is_not_spark_connect_s_is_refused_before_anything_is_tried(tmp_path):
    lines, _ = refused(tmp_path, "run", "--warehouse", "wh", "--remote", "http://127.0.0.1:15002")
    assert len(lines) == 1 and lines[0].startswith(
        "lakejoin: error: http://127.0.0.1:15002 is not a Spark Connect URL ("
    )


def unavailable(retry_after_ms: int | None = None) -> BaseException:
    """A gRPC UNAVAILABLE error, as Spark Connect's client sees one: from a server that answered asking to be called
    back after ``retry_after_ms`` (its RetryInfo), or, without it, from an address where nothing answered."""
    import grpc
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="unavailable")
    if retry_after_ms is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=retry_after_ms // 1000)))
        status.details.append(detail)

    class Unavailable(grpc.RpcError, grpc.Call):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return status.message

        def trailing_metadata(self) -> tuple:
            return (("grpc-status-details-bin", status.SerializeToString()),)

        def initial_metadata(self) -> tuple:
            return ()

        def is_active(self) -> bool:
            return False

        def time_remaining(self) -> None:
            return None

        def cancel(self) -> bool:
            return False

        def add_callback(self, callback: object) -> bool:
            return False

    return Unavailable()


def waited(error: BaseException) -> float:
    """The seconds the first call's retries sleep on ``error`` before giving up (nothing is slept here)."""
    import warnings

    from pyspark.sql.connect.client.retries import Retrying

    from pipelines.spark import hurried_retries

    sleeps: list[float] = []
    with warnings.catch_warnings(), pytest.raises(type(error)):
        warnings.simplefilter("ignore")
        for attempt in Retrying(hurried_retries(), sleep=sleeps.append):
            with attempt:
                raise error
    return sum(sleeps)


def test_the_first_call_gives_up_on_no_answer_in_seconds_but_waits_for_a_server_that_asks_to_be_called_back():
    assert 5 < waited(unavailable()) < 10
    assert waited(unavailable(retry_after_ms=30_000)) > 10 * 60  # Spark Connect's own patience, as for every later call


class RefusingConnectSession:
    """A Spark Connect session (as lakejoin tells one) whose server names no extension and refuses the probe's path
    with an error that is not Delta's, as serverless does with DBFS's root."""

    __module__ = "pyspark.sql.connect.session"

    class conf:  # noqa: N801 - the session's attribute
        @staticmethod
        def get(name: str, default: str | None = None) -> str | None:
            return default

    def sql(self, query: str) -> None:
        raise PermissionError(
            "[INSUFFICIENT_PERMISSIONS] Public DBFS root is disabled. Access is denied on path: /lakejoin-probe-of-delta/none"
        )


def test_a_probe_refused_by_the_server_is_one_line_and_a_catalog_warehouse_needs_no_probe():
    from state.engines import make_engine
    from state.errors import LakejoinError

    with pytest.raises(
        LakejoinError,
        match=r"^cannot tell whether the Spark Connect server has Delta \(\[INSUFFICIENT_PERMISSIONS\] Public DBFS root is disabled.*set engine: spark",
    ):
        make_engine(RefusingConnectSession())  # type: ignore[arg-type]
    assert make_engine(RefusingConnectSession(), catalog=True).name == "spark"  # type: ignore[arg-type] - decided without the probe
