"""Rule policies end to end through ``lakejoin run``, and ``lakejoin validate`` finding a corrupted gold row, and
passing beside a run under way."""

from __future__ import annotations

import json
import os
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

import pipelines
from expectations.audit import audit
from expectations.batch import ExpectationFailed
from pipelines.batch import emit
from pipelines.bronze import write as bronze
from state.config import Config
from state.engines import DeltaEngine, make_engine
from state.faults import CRASH_AT, InjectedCrash
from tests.helpers import Pipeline, lakejoin_here
from tests.reference import Record, batch_join

RECORDS = [Record("r", "r1", 1, "a"), Record("r", "r2", 2, "b"), Record("s", "s1", 3, "a"), Record("s", "s99", 99, "a")]
PLAUSIBLE = [rec for rec in RECORDS if rec.id != "s99"]  # ts_max 50 makes s99 implausible


def landed(engine: DeltaEngine, tmp_path) -> str:
    """A warehouse holding RECORDS in bronze, nothing joined yet (ingested in this process: the policies are
    what these tests check, through ``lakejoin run``; tests/test_cli.py runs ``lakejoin ingest``)."""
    pipeline = Pipeline(engine, str(tmp_path))
    pipeline.land_chunk(RECORDS)
    return pipeline.warehouse.root


def config_file(tmp_path, policy: str) -> str:
    path = tmp_path / f"{policy}.yml"
    path.write_text(f"expectations:\n  ts_max: 50\n  policies:\n    bronze_ts_plausible: {policy}\n")
    return str(path)


def stderr_lines(process) -> list[str]:
    return process.stderr.strip().splitlines()  # Spark's JVM logs a few lines of its own there


def versions(warehouse: str) -> dict[str, int | None]:
    found = {}
    for folder, subfolders, _ in os.walk(warehouse):
        if "_delta_log" in subfolders:
            found[os.path.relpath(folder, warehouse)] = DeltaTable(folder).version()
    return found


def read(table_path: str) -> list[dict]:
    """A Delta table's rows through file_uris + pyarrow (never to_pyarrow_*, which can abort at exit)."""
    if not os.path.isdir(os.path.join(table_path, "_delta_log")):
        return []
    return [row for uri in DeltaTable(table_path).file_uris() for row in pq.read_table(uri).to_pylist()]


def gold_ids(warehouse: str) -> Counter:
    return Counter((row["r_id"], row["s_id"]) for row in read(os.path.join(warehouse, "gold", "join_results")))


def test_fail_stops_the_batch_with_nothing_written_then_a_relaxed_policy_lets_the_next_run_proceed(deltars, tmp_path):
    warehouse = landed(deltars, tmp_path)
    before = versions(warehouse)
    stopped = lakejoin_here(
        "run", "--warehouse", warehouse, "--config", config_file(tmp_path, "fail"), cwd=str(tmp_path)
    )
    assert stopped.returncode == 1
    (message,) = [line for line in stderr_lines(stopped) if line.startswith("lakejoin:")]
    assert "rule bronze_ts_plausible" in message and "id=s99" in message and "nothing written" in message
    assert versions(warehouse) == before

    warned = lakejoin_here(
        "run", "--warehouse", warehouse, "--config", config_file(tmp_path, "warn"), cwd=str(tmp_path)
    )
    assert warned.returncode == 0, warned.stderr[-2000:]
    assert "1 rule failures" in warned.stdout
    assert gold_ids(warehouse) == Counter((p.r_id, p.s_id) for p in batch_join(RECORDS))  # warn keeps the row
    (result,) = [
        rule
        for batch in read(os.path.join(warehouse, "silver", "batches"))
        for rule in batch["rules"]
        if rule["failed"]
    ]
    assert (result["rule"], result["table"], result["policy"], result["failed"], result["evaluated"]) == (
        "bronze_ts_plausible",
        "bronze/s",
        "warn",
        1,
        2,
    )
    assert json.loads(result["examples"]) == ["_id=s99"]
    status = lakejoin_here("status", "--warehouse", warehouse, cwd=str(tmp_path))
    assert "bronze_ts_plausible on bronze/s: 1 of 2 rows failed (warn)" in status.stdout


# On Delta on Spark only: delta-rs's quarantine is exercised by tests/test_bounded_state.py and test_expectations.py.
@pytest.mark.parametrize("cli_engine", [pytest.param("spark", marks=pytest.mark.spark_delta)], indirect=True)
def test_quarantine_takes_the_row_out_of_the_join_and_keeps_it_with_the_rule_name(spark, tmp_path, cli_engine):
    warehouse = landed(make_engine(spark, cli_engine), tmp_path)
    ran = lakejoin_here(
        "run",
        "--warehouse",
        warehouse,
        "--config",
        config_file(tmp_path, "quarantine"),
        cwd=str(tmp_path),
        engine=cli_engine,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert gold_ids(warehouse) == Counter((p.r_id, p.s_id) for p in batch_join(PLAUSIBLE))
    (kept,) = read(os.path.join(warehouse, "quarantine", "expectations"))
    assert (kept["rule"], kept["table"], kept["row_key"], json.loads(kept["row"])["ts"]) == (
        "bronze_ts_plausible",
        "bronze/s",
        "s99",
        99,
    )
    audited = pipelines.Pipeline(warehouse, config_file(tmp_path, "quarantine"), spark=spark).validate(
        str(tmp_path / "docs")
    )  # in this JVM
    assert audited.success and audited.reconciliation.passed, (
        audited.describe()
    )  # gold = join of bronze minus the quarantined row


def test_the_audit_finds_a_gold_row_corrupted_after_it_was_written(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land(PLAUSIBLE)
    pipeline.run()
    config = Config.of()
    clean = audit(deltars, pipeline.warehouse, config, str(tmp_path / "docs"))
    assert clean.success and os.path.isfile(clean.docs)

    gold_path = pipeline.warehouse.gold
    (row,) = [row for row in read(gold_path) if row["r_id"] == "r1"]
    corrupted = {**row, "owner": "S", "s_key": "zzz"}  # a wrong owner, and keys that no longer match
    schema = pq.read_schema(DeltaTable(gold_path).file_uris()[0])
    write_deltalake(gold_path, pa.Table.from_pylist([corrupted], schema), mode="append")

    found = audit(deltars, pipeline.warehouse, config, str(tmp_path / "docs"))
    assert not found.success
    failed = {result.rule.name: result for result in found.results if not result.passed}
    assert set(failed) == {"gold_pair_unique", "gold_predicate_true", "gold_owner_consistent"}
    assert failed["gold_owner_consistent"].failing == ({"_r_id": "r1", "_s_id": "s1"},)
    assert not found.reconciliation.passed and found.reconciliation.extra_count == 1
    assert "gold_owner_consistent" in found.describe() and os.path.isfile(found.docs)


def test_validation_beside_a_run_under_way_reconciles_gold_as_of_the_last_committed_batch(
    deltars, tmp_path, monkeypatch
):
    """A Unity Catalog warehouse has no lock, so validation may meet a run that has written some of a batch's gold
    and ingests that no batch has joined yet: neither is a failure."""
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land(PLAUSIBLE)
    pipeline.run()  # batch 1: (r1, s1)
    pipeline.land([Record("s", "s2", 4, "a")])
    monkeypatch.setenv(CRASH_AT, "after:gold")
    with pytest.raises(InjectedCrash):
        pipeline.run()  # batch 2 planned, its gold (r1, s2) written, not committed
    monkeypatch.delenv(CRASH_AT)
    pipeline.land([Record("s", "s3", 5, "a")])  # ingested, in no batch yet

    audited = audit(deltars, pipeline.warehouse, Config.of(), str(tmp_path / "docs"))
    assert audited.success, audited.describe()
    assert (audited.reconciliation.expected, audited.reconciliation.actual) == (1, 1)


def landing_blind_to_what_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault in landing: a record already held (in state, or ingested before) is taken as new."""
    classify = bronze.outcomes
    monkeypatch.setattr(bronze, "outcomes", lambda rows, known, changes: classify(rows, None, changes))


@pytest.fixture
def proofs(monkeypatch) -> list[bool]:
    """Whether each batch's rows were proven unique (not counted), in the order of the batches."""
    found: list[bool] = []
    rows_unique = emit._rows_unique
    monkeypatch.setattr(emit, "_rows_unique", lambda *args: found.append(rows_unique(*args)) or found[-1])
    return found


def test_a_batch_whose_arrival_is_held_already_recounts_its_pairs_and_stops_at_a_repeat(
    deltars, tmp_path, monkeypatch, proofs
):
    """gold_pair_unique is counted only when the batch's inputs do not prove it: r1, delivered again past landing's
    check, is in state and among the arrivals, so s2 pairs with both copies; the fail rule stops the batch before gold
    commits."""
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land(PLAUSIBLE)
    pipeline.run()
    landing_blind_to_what_is_held(monkeypatch)
    pipeline.land([Record("r", "r1", 1, "a"), Record("s", "s2", 4, "a")])
    with pytest.raises(ExpectationFailed, match=r"rule gold_pair_unique .* e\.g\. _r_id=r1, _s_id=s2"):
        pipeline.run()
    assert pipeline.gold_pairs() == Counter(batch_join(PLAUSIBLE))
    assert proofs == [True, False]  # the first batch's rows proven unique, the second's counted


@pytest.mark.parametrize("policy", ["warn", "quarantine"])
def test_arrivals_repeating_an_id_are_set_aside_or_counted(deltars, tmp_path, monkeypatch, proofs, policy):
    """r3 twice in one batch (past landing's check): bronze_id_unique sets both copies aside by default, so the batch's
    rows are still proven unique and gold holds what the rest joins; kept with ``warn``, both copies pair with s1 and go
    to r's state, so the batch's rows are counted, and a fail rule stops it."""
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(expectations={"policies": {"bronze_id_unique": policy}}))
    landing_blind_to_what_is_held(monkeypatch)
    pipeline.land([*PLAUSIBLE, Record("r", "r3", 2, "a")])
    pipeline.land([Record("r", "r3", 2, "a", "sent again")])  # another file: a copy of a landed file is skipped whole
    if policy == "quarantine":
        pipeline.run()
        assert pipeline.gold_pairs() == Counter(batch_join(PLAUSIBLE))
        assert proofs == [True]
    else:
        with pytest.raises(ExpectationFailed, match=r"rule (gold_pair_unique|state_id_unique) .* e\.g\. _(r_|)id=r3"):
            pipeline.run()
        assert pipeline.gold_pairs() == Counter()
        assert proofs == [False]
