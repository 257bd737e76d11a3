"""A warehouse in a catalog schema has no file to lock: two runs against it (any two jobs, or a job and a notebook)
never both commit a batch. Each job's lease is a row of ``silver_leases`` taken by a conditional UPDATE, which Delta
lets one of two racing transactions commit, and a run proves it still holds the lease before each batch writes and
before it commits (state/log/lease.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from pipelines.api import Pipeline as Api
from state.engines.spark_delta import committing_on
from state.errors import LakejoinError, WarehouseBusy
from state.log import lease as lease_module
from state.log.lease import Lease, LeaseLost, lease_table
from state.log.lock import hold
from tests.conftest import require_spark_delta
from tests.reference import Record, batch_join

pytestmark = pytest.mark.spark_delta
RECORDS = [Record("r", f"r{n}", n, "a" if n % 2 else "b") for n in range(6)] + [
    Record("s", f"s{n}", n, "a" if n % 3 else "b") for n in range(6)
]


@pytest.fixture
def warehouse(spark, tmp_path):
    """A catalog warehouse with every record ingested, none joined."""
    require_spark_delta(spark)
    spark.sql(f"CREATE SCHEMA lj_lock LOCATION '{tmp_path / 'lj_lock'}'")
    pipeline = Api("spark_catalog.lj_lock", {"engine": "spark"}, spark=spark)
    for name in "rs":
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            "".join(
                f'{{"id": "{rec.id}", "ts": {rec.ts}, "key": "{rec.key}"}}\n' for rec in RECORDS if rec.relation == name
            )
        )
        pipeline.ingest(name, [str(path)])
    yield "spark_catalog.lj_lock"
    spark.sql("DROP SCHEMA IF EXISTS lj_lock CASCADE")


def gold(spark, warehouse: str) -> Counter:
    return Counter((row.r_id, row.s_id) for row in spark.table(f"{warehouse}.gold_join_results").collect())


def test_two_runs_racing_for_a_catalog_warehouse_never_both_commit_a_batch(spark, warehouse):
    start, outcomes = threading.Barrier(2), {}

    def run(name: str) -> None:
        session = spark.newSession()  # a job and a notebook: sessions of their own
        start.wait()
        try:
            outcomes[name] = Api(warehouse, spark=session).run(max_batch_rows=3).pairs
        except WarehouseBusy as busy:
            outcomes[name] = busy

    threads = [threading.Thread(target=run, args=(name,)) for name in ("job", "notebook")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    busy = [outcome for outcome in outcomes.values() if isinstance(outcome, WarehouseBusy)]
    assert len(busy) <= 1, outcomes
    assert all("holds spark_catalog.lj_lock" in str(outcome) for outcome in busy)
    batches = [row.batch_id for row in spark.table(f"{warehouse}.silver_batches").orderBy("batch_id").collect()]
    assert batches == list(range(1, len(batches) + 1)) and len(batches) == 4  # 12 arrivals, 3 a batch, each batch once
    assert gold(spark, warehouse) == Counter((pair.r_id, pair.s_id) for pair in batch_join(RECORDS))
    assert spark.table(lease_table(warehouse)).where("holder IS NOT NULL").count() == 0, "both let their leases go"


def test_a_run_whose_lease_lapsed_and_was_taken_stops_before_committing_and_the_taker_resumes_its_batch(
    spark, warehouse, monkeypatch
):
    """The lapse is forced: the lease's expiry moved to the past just before the batch's commit, as if the run had
    stalled that long, and another run takes it."""
    taker = Lease(spark.newSession(), lease_table(warehouse), "run")
    checks = []
    original = Lease.check

    def stalled(self: Lease) -> None:
        checks.append(self.holder)
        if self is not taker and len(checks) == 2:  # the batch's second proof: before its log row
            spark.sql(
                f"UPDATE {lease_table(warehouse)} SET expires_at = current_timestamp() - INTERVAL 1 SECOND WHERE job = 'run'"
            )
            taker.take(wait_seconds=0)
            self._renewed_at = float("-inf")  # the stall: its last renewal is long past
        original(self)

    monkeypatch.setattr(Lease, "check", stalled)
    with pytest.raises(LeaseLost, match="lapsed and another run took the warehouse"):
        Api(warehouse, spark=spark).run()
    assert not spark.catalog.tableExists(f"{warehouse}.silver_batches"), "the stalled run committed no batch"
    with pytest.raises(WarehouseBusy):
        Api(warehouse, spark=spark).run()  # the taker holds it
    taker.release()
    monkeypatch.setattr(Lease, "check", original)
    report = Api(warehouse, spark=spark).run()
    assert [batch.resumed for batch in report.batches] == [
        True
    ]  # the stalled run's batch, with the plan its writes carry
    assert gold(spark, warehouse) == Counter((pair.r_id, pair.s_id) for pair in batch_join(RECORDS))


def test_a_lease_is_taken_by_one_of_two_and_given_back(spark, warehouse):
    first, second = (Lease(spark.newSession(), lease_table(warehouse), "run") for _ in range(2))
    first.take(wait_seconds=0)
    with pytest.raises(WarehouseBusy, match=r"another 'lakejoin run' holds spark_catalog.lj_lock \(pid \d+ on"):
        second.take(wait_seconds=0)
    first.check()
    first.release()
    second.take(wait_seconds=0)
    assert second.epoch == first.epoch + 1
    second.release()
    with pytest.raises(LakejoinError):
        Lease(spark, lease_table(warehouse), "run").check()  # never taken: holds nothing


def test_a_lease_is_renewed_while_a_write_on_the_run_s_session_holds_its_commits(spark, warehouse, monkeypatch):
    """A write that reads back the version it committed holds off the session's other commits: the lease, on a session
    apart, is renewed meanwhile, so a write longer than the lease does not let another run take the warehouse. Waits for
    a renewal rather than for the clock: a loaded machine's UPDATE may take longer than a short lease."""
    monkeypatch.setattr(lease_module, "RENEW_SECONDS", 0.5)
    expiry = f"SELECT expires_at FROM {lease_table(warehouse)} WHERE job = 'run'"
    with hold(warehouse, "run", spark=spark) as held:
        taken_at, taken_expiry = held._renewed_at, spark.sql(expiry).first().expires_at
        with committing_on(spark):
            deadline = time.monotonic() + 120
            while held._renewed_at == taken_at and time.monotonic() < deadline:
                time.sleep(0.2)
            assert held._renewed_at > taken_at, "no renewal while the run's session held its commits"
            assert spark.sql(expiry).first().expires_at > taken_expiry
            with pytest.raises(WarehouseBusy):
                Lease(spark.newSession(), lease_table(warehouse), "run").take(wait_seconds=0)
        held.check()


def test_a_run_on_a_schema_that_is_no_warehouse_is_refused_in_one_line_before_any_lease_is_made(spark, tmp_path):
    require_spark_delta(spark)
    spark.sql(f"CREATE SCHEMA lj_none LOCATION '{tmp_path / 'lj_none'}'")
    try:
        with pytest.raises(LakejoinError, match="is not a lakejoin warehouse"):
            Api("spark_catalog.lj_none", {"engine": "spark"}, spark=spark).run()
        assert not spark.catalog.tableExists(lease_table("spark_catalog.lj_none"))
    finally:
        spark.sql("DROP SCHEMA IF EXISTS lj_none CASCADE")
