"""The ``lakejoin`` command: exit codes, one-line errors, a clean exit every time in fresh processes; the demos and the
README's commands, run in this process (``lakejoin_here``), where what they print and return is the point."""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest

from pipelines.commands.acceptance import FORCED
from tests.helpers import REPO, damaged_parquet, lakejoin, lakejoin_here


@pytest.fixture
def landing(tmp_path):
    r_file, s_file = tmp_path / "r.jsonl", tmp_path / "s.jsonl"
    r_file.write_text("\n".join(json.dumps({"id": f"r{i}", "ts": 2 * i, "key": f"k{i % 3}"}) for i in range(20)))
    s_file.write_text("\n".join(json.dumps({"id": f"s{i}", "ts": 2 * i + 1, "key": f"k{i % 3}"}) for i in range(20)))
    return tmp_path


def test_every_command_exits_zero_when_it_succeeds_run_after_run(landing):
    """delta-rs can abort an interpreter at exit (134); lakejoin must exit 0 every time, in fresh processes."""
    warehouse = str(landing / "wh")
    codes = [
        lakejoin(
            "ingest", "--warehouse", warehouse, "--side", "r", str(landing / "r.jsonl"), cwd=str(landing)
        ).returncode
    ]
    codes.append(
        lakejoin(
            "ingest", "--warehouse", warehouse, "--side", "s", str(landing / "s.jsonl"), cwd=str(landing)
        ).returncode
    )
    first = lakejoin("run", "--warehouse", warehouse, "--max-batch-rows", "10", cwd=str(landing))
    codes.append(first.returncode)
    again = lakejoin("run", "--warehouse", warehouse, cwd=str(landing))
    codes.append(again.returncode)
    assert "nothing pending" in again.stdout
    declared = lakejoin("advance", "--warehouse", warehouse, "--relation", "s", "--to", "5", cwd=str(landing))
    codes.append(declared.returncode)
    assert declared.stdout.strip() == "s: no record older than 5 will come; the next run takes it as S's watermark"
    assert codes == [0] * 5, first.stderr[-2000:]
    assert first.stdout.count("batch ") == 4


def test_errors_are_one_line_with_a_non_zero_exit(landing):
    missing = lakejoin("run", "--warehouse", str(landing / "nowhere"), cwd=str(landing))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"lakejoin: error: no warehouse at {landing / 'nowhere'}: land files there first with 'lakejoin ingest'"
    ]
    (landing / "bad.yml").write_text("predicate: r.key = s.key\nbatch_size: 3\n")
    bad_config = lakejoin("run", "--warehouse", str(landing), "--config", str(landing / "bad.yml"), cwd=str(landing))
    assert bad_config.returncode == 2
    assert "unknown setting 'batch_size'" in bad_config.stderr and len(bad_config.stderr.strip().splitlines()) == 1


def test_bad_files_are_refused_in_one_line_each_and_the_good_ones_land(landing, cli_engine):
    """The files a landing zone gave as tracebacks: keys with a dot and a space, a CSV header repeating a name, a
    truncated Parquet file, one whose footer reads and whose first data page does not (Spark's task fails in the
    write: no stack trace, no Spark log line)."""
    (landing / "dots.jsonl").write_text('{"id": "w1", "ts": 1, "key": "k", "a b": 1, "c.d": 2}\n')
    (landing / "repeats.csv").write_text("id,ts,key,key\na,1,k,k2\n")
    (landing / "truncated.parquet").write_bytes(b"PAR1\x00\x01garbage")
    damaged_parquet(str(landing / "damaged.parquet"))
    files = ["repeats.csv", "dots.jsonl", "truncated.parquet", "damaged.parquet"]
    result = lakejoin("ingest", "--warehouse", "wh", "--side", "r", *files, cwd=str(landing), engine=cli_engine)
    assert result.returncode == 2
    assert result.stdout.splitlines() == ["dots.jsonl: 1 rows to bronze/r, 0 quarantined, 0 duplicates skipped"]
    assert result.stderr.splitlines() == [  # Spark started: Java's incubator-module notice is not among them
        "lakejoin: error: cannot ingest repeats.csv: column 'key' appears twice: rename one of them; nothing of it was written",
        "lakejoin: error: cannot ingest truncated.parquet: not a readable Parquet file (Parquet magic bytes not found in footer. "
        "Either the file is corrupted or this is not a parquet file.); nothing of it was written",
        "lakejoin: error: cannot ingest damaged.parquet: a Parquet data page cannot be read, the file is damaged "
        "(java.io.IOException: FAILED_TO_UNCOMPRESS(5)); nothing of it was written",
    ]


def test_the_demo_prints_pass(tmp_path):
    demo = lakejoin_here(
        "demo", "--rows", "300", "--keys", "50", "--chunk-rows", "300", "--max-batch-rows", "200", cwd=str(tmp_path)
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "PASS: gold equals the batch SQL join" in demo.stdout
    assert "rows per second" in demo.stdout


def test_the_asof_demo_joins_each_trade_with_its_latest_quote_and_prints_pass(tmp_path):
    demo = lakejoin_here(
        "demo",
        "--join",
        "asof",
        "--rows",
        "300",
        "--keys",
        "20",
        "--disorder",
        "30",
        "--chunk-rows",
        "300",
        "--max-batch-rows",
        "300",
        cwd=str(tmp_path),
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "PASS: gold equals the batch SQL join" in demo.stdout
    assert "results: 0 " not in demo.stdout, demo.stdout
    assert "tolerance 1 hour" in demo.stdout


def test_the_left_join_demo_prints_pass(tmp_path):
    demo = lakejoin_here(
        "demo",
        "--join",
        "left",
        "--rows",
        "400",
        "--keys",
        "300",
        "--chunk-rows",
        "400",
        "--max-batch-rows",
        "400",
        cwd=str(tmp_path),
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "PASS: gold equals the batch SQL join" in demo.stdout
    assert "join: left (a row waits until the other relation's watermark makes it final)" in demo.stdout


def doc_block(page: str, after: str, language: str = "yaml") -> str:
    """The first fenced ``language`` block of ``page`` (``README.md``, ``docs/joins.md``) after the line containing
    ``after``: the examples the docs show are the ones the tests run."""
    with open(os.path.join(REPO, page), encoding="utf-8") as handle:
        text = handle.read()
    start = text.index(f"```{language}\n", text.index(after)) + len(f"```{language}\n")
    return text[start : text.index("```", start)]


def test_a_newcomer_joins_their_own_two_files_with_the_readmes_commands(tmp_path):
    """The README's "Join your own two files", as written: its config, then its commands, on two files of the shape
    it describes; ``show`` prints the joined rows."""
    section = "## Join your own two files"
    (tmp_path / "join.yml").write_text(doc_block("README.md", section))
    orders = [
        ("o1", "c1", "2026-03-01T10:00:00Z"),
        ("o2", "c2", "2026-03-01T10:05:00Z"),
        ("o3", "c3", "2026-03-01T10:07:00Z"),
    ]
    payments = [
        ("p1", "c1", "2026-03-01T10:02:00Z"),
        ("p2", "c1", "2026-03-01T11:00:00Z"),
        ("p3", "c2", "2026-03-01T09:59:00Z"),
    ]
    (tmp_path / "orders.jsonl").write_text(
        "\n".join(json.dumps({"order_id": o, "customer": c, "order_time": t}) for o, c, t in orders)
    )
    (tmp_path / "payments.jsonl").write_text(
        "\n".join(json.dumps({"payment_id": p, "customer": c, "paid_at": t}) for p, c, t in payments)
    )
    commands = [
        shlex.split(line)[1:]
        for line in doc_block("README.md", section, "bash").splitlines()
        if line.startswith(".venv/bin/lakejoin ")
    ]
    assert [command[0] for command in commands] == ["ingest", "ingest", "run", "show"]
    for command in commands:
        done = lakejoin_here(*command, cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr[-2000:]
    header, *rows = done.stdout.splitlines()
    assert header.split()[:2] == ["orders_customer", "orders_order_id"]  # the records' own columns first
    pairs = [(re.search(r"\bo\d\b", row).group(), re.search(r"\bp\d\b", row).group()) for row in rows]
    assert sorted(pairs) == [("o1", "p1"), ("o1", "p2"), ("o2", "p3")]


def test_the_three_way_demo_prints_pass(tmp_path):
    demo = lakejoin_here(
        "demo",
        "--relations",
        "3",
        "--rows",
        "150",
        "--keys",
        "20",
        "--chunk-rows",
        "225",
        "--max-batch-rows",
        "225",
        cwd=str(tmp_path),
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "PASS: gold equals the batch SQL join" in demo.stdout


def test_failed_exits_1_naming_the_tasks_that_failed_and_0_when_none_did(tmp_path):
    """The bundle's jobs end with it, run after every other task, so that a failed one ends the run FAILED
    (tests/test_job_results.py)."""
    failed = lakejoin_here("failed", "join=failed", "validate=excluded", "maintain=upstream_failed", cwd=str(tmp_path))
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.strip().splitlines() == [
        "lakejoin: error: this run failed at join (failed), maintain (upstream_failed): the failed task's output says why"
    ]
    passed = lakejoin_here("failed", "join=success", "validate=excluded", cwd=str(tmp_path))
    assert passed.returncode == 0 and passed.stderr == ""
    timed_out = lakejoin_here("failed", "join=timedout", "validate=excluded", cwd=str(tmp_path))
    assert timed_out.returncode == 1 and "join (timedout)" in timed_out.stderr


def test_acceptance_forced_to_fail_exits_1_in_one_line(tmp_path):
    """The acceptance job's forced failure, whose run must end FAILED: one line, no Spark started."""
    forced = lakejoin("acceptance", "--fail", "--warehouse", "main.lakejoin_acceptance", cwd=str(tmp_path))
    assert forced.returncode == 1 and forced.stderr.strip().splitlines() == [f"lakejoin: error: {FORCED}"]


def test_the_path_read_check_passes_on_unity_catalog_s_refusal_only():
    """Any exception used to pass it: a missing file, a typo or an outage proved nothing about managed storage."""
    from types import SimpleNamespace

    from pipelines.commands.acceptance import _path_read_refused

    def session(error: Exception) -> SimpleNamespace:
        def collect() -> None:
            raise error

        detail = SimpleNamespace(first=lambda: {"location": "s3://bucket/managed/gold"})
        read = SimpleNamespace(limit=lambda _: SimpleNamespace(collect=collect))
        reader = SimpleNamespace(format=lambda _: SimpleNamespace(load=lambda _: read))
        return SimpleNamespace(sql=lambda _: detail, read=reader)

    refusal = RuntimeError(
        "[RequestId=1 ErrorClass=INVALID_PARAMETER_VALUE.LOCATION_OVERLAP] Input path url 's3://bucket/managed/gold' "
        "overlaps with managed storage within 'CheckPathAccess' call"
    )
    assert _path_read_refused(session(refusal), "main.acceptance").startswith("refused: ")
    with pytest.raises(AssertionError, match="not as Unity Catalog refuses it"):
        _path_read_refused(session(FileNotFoundError("No such file or directory")), "main.acceptance")
