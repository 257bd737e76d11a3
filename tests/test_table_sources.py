"""Relations read in place from Delta tables the user already has: incremental by table version, exactly once for
any commit pattern and batch split; change commits refused or skipped; OPTIMIZE followed; vacuumed files named."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expectations.audit import audit
from pipelines.commands.status import warehouse_status
from pipelines.definition import record, settle
from state.config import Config
from state.config_file import load_config
from state.errors import LakejoinError
from state.faults import CRASH_AT, InjectedCrash
from state.join.relations import S
from state.layout import Warehouse
from tests.helpers import Pipeline, crash_at_each, lakejoin_here

START = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
PREDICATE = "r.customer = s.customer AND s.paid_at BETWEEN r.order_time - INTERVAL 30 MINUTES AND r.order_time + INTERVAL 1 HOUR"


def order(n: int, minute: int, customer: str) -> dict:
    return {
        "order_id": f"o{n}",
        "customer": customer,
        "order_time": START + timedelta(minutes=minute),
        "amount": 10.5 + n,
    }


def payment(n: int, minute: int, customer: str) -> dict:
    return {
        "payment_id": f"p{n}",
        "customer": customer,
        "paid_at": START + timedelta(minutes=minute),
        "method": ("card", "cash")[n % 2],
    }


def expected_gold(orders: list[dict], payments: list[dict]) -> Counter:
    """The batch join in Python: same customer, payment within [-30, +60] minutes of the order; the older record
    owns the pair (an order on a tie)."""
    return Counter(
        (o["order_id"], p["payment_id"], "R" if o["order_time"] <= p["paid_at"] else "S", o["amount"], p["method"])
        for o in orders
        for p in payments
        if o["customer"] == p["customer"]
        and timedelta(minutes=-30) <= p["paid_at"] - o["order_time"] <= timedelta(minutes=60)
    )


def gold(pipeline: Pipeline) -> Counter:
    return Counter(
        (row["r_order_id"], row["s_payment_id"], row["owner"], row["r_amount"], row["s_method"])
        for row in pipeline.gold_rows()
    )


def tables_pipeline(
    engine, root: str, orders: str | None = None, payments: str | None = None, **settings: object
) -> Pipeline:
    """A pipeline whose relations read the tables at ``orders`` and ``payments`` (a relation without one takes files)."""
    relations = {
        "r": {"id": "order_id", "event_time": "order_time", **({"table": orders} if orders else {})},
        "s": {"id": "payment_id", "event_time": "paid_at", **({"table": payments} if payments else {}), **settings},
    }
    return Pipeline(engine, root, Config.of(relations=relations, predicate=PREDICATE))


def append(table: str, rows: list[dict], **options: object) -> None:
    write_deltalake(table, pa.Table.from_pylist(rows), mode="append", **options)


def joined_once(engine, root: str, orders: str, payments: str) -> Pipeline:
    """A pipeline that has joined order o1 with payment p1, each its table's first version."""
    append(orders, [order(1, 0, "ann")])
    append(payments, [payment(1, 10, "ann")])
    pipeline = tables_pipeline(engine, root, orders, payments)
    pipeline.run()
    return pipeline


@pytest.fixture
def sources(tmp_path) -> tuple[str, str]:
    return str(tmp_path / "raw" / "orders"), str(tmp_path / "raw" / "payments")


def test_two_tables_are_joined_as_they_grow_without_copying_their_rows(deltars, tmp_path, sources):
    orders, payments = sources
    pipeline = tables_pipeline(deltars, str(tmp_path), orders, payments)
    placed = [order(1, 0, "ann"), order(2, 5, "bob")], [payment(1, 10, "ann"), payment(2, -40, "bob")]
    append(orders, placed[0])
    append(payments, placed[1])
    pipeline.run()
    later = [order(3, 50, "ann")], [payment(3, 20, "bob"), payment(4, 55, "ann")]
    append(orders, later[0])
    append(payments, later[1][:1])
    append(payments, later[1][1:])
    pipeline.run(max_batch_rows=2)

    assert gold(pipeline) == expected_gold(placed[0] + later[0], placed[1] + later[1])
    bronze = deltars.read(pipeline.warehouse.bronze(S))
    assert "method" not in bronze.columns and {
        "paid_at",
        "_id",
        "_source_file",
        "_source_line",
        "_source_version",
    } <= set(bronze.columns)


def records(draw_customers: list[str], minutes: list[int], make) -> list[dict]:  # noqa: ANN001 - order or payment
    return [make(n, minute, customer) for n, (minute, customer) in enumerate(zip(minutes, draw_customers))]


@st.composite
def growth(draw: st.DrawFn) -> tuple[list[dict], list[dict], list[tuple[str, int] | None]]:
    """Orders and payments, and how the tables get them: appends of a few rows to one table at a time, with runs
    (None) and OPTIMIZEs (0 rows) anywhere between them."""
    sizes = (draw(st.integers(1, 8)), draw(st.integers(1, 8)))
    customers = st.sampled_from(["ann", "bob"])
    rows = [
        records(
            draw(st.lists(customers, min_size=size, max_size=size)),
            draw(st.lists(st.integers(0, 120), min_size=size, max_size=size)),
            make,
        )
        for size, make in zip(sizes, (order, payment))
    ]
    steps: list[tuple[str, int] | None] = []
    left = {"r": sizes[0], "s": sizes[1]}
    while any(left.values()):
        side = draw(st.sampled_from([side for side, count in left.items() if count]))
        take = draw(st.integers(1, left[side]))
        steps.append((side, take))
        left[side] -= take
        steps += draw(st.sampled_from([[], [None], [(side, 0)], [(side, 0), None]]))  # a run, an OPTIMIZE (0 rows)
    return rows[0], rows[1], steps


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(grown=growth(), batch_rows=st.integers(1, 6))
def test_gold_is_the_batch_join_of_the_tables_for_any_commit_pattern_and_batch_split(
    deltars, tmp_path_factory, grown, batch_rows
):
    orders, payments, steps = grown
    root = str(tmp_path_factory.mktemp("grown"))
    tables = {"r": os.path.join(root, "orders"), "s": os.path.join(root, "payments")}
    pipeline = tables_pipeline(deltars, root, tables["r"], tables["s"])
    written = {"r": 0, "s": 0}
    for step in steps:
        if step is None:
            if all(os.path.isdir(path) for path in tables.values()):
                pipeline.run(max_batch_rows=batch_rows)
            continue
        side, take = step
        rows = orders if side == "r" else payments
        if take == 0:
            DeltaTable(tables[side]).optimize.compact()  # rewrites with dataChange = false: nothing to join again
            continue
        append(tables[side], rows[written[side] : written[side] + take])
        written[side] += take
    pipeline.run(max_batch_rows=batch_rows)

    assert gold(pipeline) == expected_gold(orders, payments)


def test_a_delete_or_an_overwrite_is_refused_with_nothing_written_and_skipped_when_configured(
    engine, tmp_path, sources
):
    orders, payments = sources
    append(orders, [order(1, 0, "ann")])
    append(payments, [payment(1, 10, "ann"), payment(2, 20, "ann")])
    pipeline = tables_pipeline(engine, str(tmp_path), orders, payments)
    pipeline.run()
    DeltaTable(payments).delete("payment_id = 'p1'")
    append(payments, [payment(3, 30, "ann")])
    before = pipeline.versions()

    with pytest.raises(
        LakejoinError,
        match=r"^source table .*payments version 1 is a DELETE, which removes or rewrites rows: .*skip_change_commits: true",
    ):
        pipeline.run()
    assert pipeline.versions() == before

    skipping = tables_pipeline(engine, str(tmp_path), orders, payments, skip_change_commits=True)
    skipping.run()
    # p1 was joined before its delete, which is skipped: gold keeps it; p3, appended after, is joined.
    assert gold(skipping) == expected_gold([order(1, 0, "ann")], [payment(n, 10 * n, "ann") for n in (1, 2, 3)])
    write_deltalake(payments, pa.Table.from_pylist([payment(4, 40, "ann")]), mode="overwrite")  # version 3
    with pytest.raises(
        LakejoinError, match=r"payments version 3 is a WRITE \(overwrite\), which removes or rewrites rows"
    ):
        pipeline.run()
    skipping.run()
    assert gold(skipping) == expected_gold(
        [order(1, 0, "ann")], [payment(n, 10 * n, "ann") for n in (1, 2, 3)]
    )  # p4 skipped with it
    log = engine.read(pipeline.warehouse.ingest_log).where("refused IS NOT NULL").orderBy("source_version").collect()
    assert [(row["source_version"], row["refused"]) for row in log] == [
        (1, "skipped: version 1 is a DELETE (skip_change_commits)"),
        (3, "skipped: version 3 is a WRITE (overwrite) (skip_change_commits)"),
    ]


def test_an_optimize_is_followed_without_joining_anything_twice_and_a_new_column_is_carried(engine, tmp_path, sources):
    orders, payments = sources
    pipeline = tables_pipeline(engine, str(tmp_path), orders, payments)
    placed = [order(1, 0, "ann"), order(2, 5, "ann")], [payment(1, 10, "ann")]
    append(orders, placed[0][:1])
    append(payments, placed[1])
    pipeline.run()
    append(orders, placed[0][1:])
    DeltaTable(orders).optimize.compact()  # the two appended files, rewritten as one with dataChange = false
    DeltaTable(payments).optimize.compact()
    later = [{**payment(2, 30, "ann"), "note": "split"}]  # the table gains a column (additive evolution)
    append(payments, later, schema_mode="merge")
    pipeline.run()

    assert gold(pipeline) == expected_gold(placed[0], placed[1] + later)
    assert sorted((row["s_payment_id"], row["s_note"]) for row in pipeline.gold_rows()) == [
        ("p1", None),
        ("p1", None),
        ("p2", "split"),
        ("p2", "split"),
    ]


def test_files_vacuumed_before_they_were_joined_are_a_one_line_error(deltars, tmp_path, sources):
    orders, payments = sources
    pipeline = joined_once(deltars, str(tmp_path), orders, payments)
    append(payments, [payment(2, 20, "ann")])
    table = DeltaTable(payments)
    table.optimize.compact()
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    with pytest.raises(
        LakejoinError, match=r"^source table .*payments: data files lakejoin has not joined yet were deleted \(VACUUM\)"
    ) as error:
        pipeline.run()
    assert "\n" not in str(error.value)


def test_bad_rows_of_a_table_are_quarantined_with_the_table_and_version_and_the_rest_joined(deltars, tmp_path, sources):
    orders, payments = sources
    pipeline = joined_once(deltars, str(tmp_path), orders, payments)
    conflicting = {**payment(1, 15, "ann")}  # p1 again, with another time
    missing_time = {**payment(2, 0, "ann"), "paid_at": None}
    append(payments, [conflicting, missing_time, payment(3, 20, "ann"), payment(3, 20, "ann")])
    pipeline.run()

    assert gold(pipeline) == expected_gold([order(1, 0, "ann")], [payment(1, 10, "ann"), payment(3, 20, "ann")])
    quarantined = deltars.read(pipeline.warehouse.quarantine).collect()
    assert sorted((row["source_file"], row["source_version"], row["reason"].split(":")[0]) for row in quarantined) == [
        (payments, 1, "id conflict"),
        (payments, 1, "missing paid_at"),
    ]


def test_a_mixed_warehouse_joins_files_with_a_table(deltars, tmp_path, sources):
    _, payments = sources
    pipeline = tables_pipeline(deltars, str(tmp_path), None, payments)
    placed = [order(1, 0, "ann"), order(2, 5, "bob")], [payment(1, 10, "ann"), payment(2, 30, "bob")]
    append(payments, placed[1][:1])
    pipeline.ingest(
        "r", pipeline.write_file([{**row, "order_time": row["order_time"].isoformat()} for row in placed[0]])
    )
    pipeline.run()
    append(payments, placed[1][1:])
    pipeline.run()

    assert gold(pipeline) == expected_gold(*placed)


def test_a_five_line_config_joins_two_tables_from_the_command_line_then_status_and_validate_cover_them(
    deltars, tmp_path, sources
):
    orders, payments = sources
    append(orders, [order(1, 0, "ann"), order(2, 5, "bob")])
    append(payments, [payment(1, 10, "ann")])
    append(payments, [payment(2, 30, "bob")])
    config = tmp_path / "lakejoin.yml"
    config.write_text(
        "relations:\n"
        f"  r: {{table: {orders}, id: order_id, event_time: order_time}}\n"
        f"  s: {{table: {payments}, id: payment_id, event_time: paid_at}}\n"
        f'predicate: "{PREDICATE}"\n'
    )
    warehouse = Warehouse(str(tmp_path / "wh"))

    first = lakejoin_here("run", "--warehouse", warehouse.root, "--config", str(config), cwd=str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert f"source {payments}: version 1: 2 rows to bronze/s (pointers)" in first.stdout
    files = lakejoin_here("ingest", "--warehouse", warehouse.root, "--side", "s", str(config), cwd=str(tmp_path))
    assert files.returncode == 2
    assert (
        files.stderr.strip().splitlines()[-1]
        == f"lakejoin: error: relation s reads table {payments} in place and takes no files: 'lakejoin run' joins what the table gains"
    )

    append(payments, [payment(3, 40, "ann")])
    given = load_config(str(config))
    status = warehouse_status(deltars, warehouse, given).describe()
    assert f"source S: {payments}: read up to version 1, 1 versions pending, 1 rows" in status, status
    # gold is reconciled with the tables at the versions joined: p3, not read yet, is not expected
    audited = audit(deltars, warehouse, given, str(tmp_path / "docs"))
    assert audited.reconciliation is not None and audited.reconciliation.passed and audited.success, audited.describe()
    assert audited.reconciliation.expected == 2


CRASHES = ["before:ingest_log", "after:ingest_log", "after:gold", "before:commit"]


def test_runs_dying_while_ingesting_a_table_or_joining_it_resume_to_the_exact_gold(
    deltars, tmp_path, sources, monkeypatch
):
    """A run dies at each point in turn — before and after the source's ingest log entry (its pointer rows landed
    first), then at writes of a batch — and the next resumes; the clean run at the end leaves gold exact."""
    orders, payments = sources
    placed = (
        [order(n, 7 * n, ("ann", "bob")[n % 2]) for n in range(1, 7)],
        [payment(n, 9 * n - 20, ("ann", "bob")[n % 3 % 2]) for n in range(1, 7)],
    )
    append(orders, placed[0][:3])
    append(payments, placed[1][:3])
    pipeline = tables_pipeline(deltars, str(tmp_path), orders, payments)
    pipeline.run(max_batch_rows=2)
    append(orders, placed[0][3:])
    append(payments, placed[1][3:5])
    append(payments, placed[1][5:])
    crash_at_each(pipeline, monkeypatch, CRASHES, max_batch_rows=2)

    assert gold(pipeline) == expected_gold(*placed)


def test_a_partitioned_table_with_text_event_times_is_joined_with_its_partition_values(deltars, tmp_path, sources):
    orders, payments = sources
    as_text = [order(1, 0, "ann b"), order(2, 5, "bob")], [payment(1, 10, "ann b"), payment(2, 20, "bob")]
    append(
        orders, [{**row, "order_time": row["order_time"].isoformat()} for row in as_text[0]], partition_by=["customer"]
    )
    append(payments, as_text[1][:1], partition_by=["customer", "method"])
    pipeline = tables_pipeline(deltars, str(tmp_path), orders, payments)
    pipeline.run()
    append(payments, as_text[1][1:])
    pipeline.run()

    assert gold(pipeline) == expected_gold(*as_text)
    assert {row["r_customer"] for row in pipeline.gold_rows()} == {"ann b", "bob"}


def test_appends_before_a_skipped_change_are_read_again_when_reading_them_failed(deltars, tmp_path, sources):
    orders, payments = sources
    pipeline = tables_pipeline(deltars, str(tmp_path), orders, payments, skip_change_commits=True)
    append(orders, [order(1, 0, "ann")])
    append(payments, [payment(1, 10, "ann")])
    pipeline.run()
    append(payments, [payment(2, 20, "ann")])  # version 1
    DeltaTable(payments).delete("payment_id = 'p1'")  # version 2, skipped
    files = [
        set(DeltaTable(payments, version=v).get_add_actions(flatten=True).column("path").to_pylist()) for v in (0, 1)
    ]
    added = os.path.join(payments, (files[1] - files[0]).pop())
    os.rename(added, added + ".away")  # version 1's file cannot be read for a moment
    with pytest.raises(LakejoinError):
        pipeline.run()
    os.rename(added + ".away", added)
    pipeline.run()

    assert gold(pipeline) == expected_gold([order(1, 0, "ann")], [payment(1, 10, "ann"), payment(2, 20, "ann")])


def test_a_first_ingest_that_died_before_its_log_row_resumes_from_its_snapshot_and_still_refuses_a_delete(
    deltars, tmp_path, sources, monkeypatch
):
    _, payments = sources
    append(payments, [payment(1, 10, "ann"), payment(2, 20, "ann")])
    pipeline = tables_pipeline(deltars, str(tmp_path), None, payments)  # the table's ingest is the run's only one
    monkeypatch.setenv(CRASH_AT, "before:ingest_log")
    with pytest.raises(InjectedCrash):
        pipeline.run()
    monkeypatch.delenv(CRASH_AT)
    DeltaTable(payments).delete("payment_id = 'p1'")

    with pytest.raises(LakejoinError, match="payments version 1 is a DELETE"):
        pipeline.run()


def test_a_table_created_again_under_the_same_path_is_refused(deltars, tmp_path, sources):
    orders, payments = sources
    pipeline = joined_once(deltars, str(tmp_path), orders, payments)
    append(orders, [order(2, 5, "ann")])
    shutil.rmtree(payments)
    append(payments, [payment(7, 10, "ann")])

    with pytest.raises(
        LakejoinError,
        match=r"^source table .*payments is not the table lakejoin has read up to version 0 \(now at version 0, another table id\): it was dropped and created again",
    ):
        pipeline.run()


def test_the_source_table_is_part_of_the_definition_and_skipping_changes_is_not(deltars, tmp_path, sources):
    orders, payments = sources
    given = tables_pipeline(deltars, str(tmp_path), orders, payments)
    record(deltars, given.warehouse, settle(deltars, given.warehouse, given.config, "run"))  # as the first run does
    pipeline = joined_once(deltars, str(tmp_path), orders, payments)

    skipping = tables_pipeline(deltars, str(tmp_path), orders, payments, skip_change_commits=True)
    assert settle(deltars, pipeline.warehouse, skipping.config, "run").config == skipping.config
    moved = tables_pipeline(deltars, str(tmp_path), orders, str(tmp_path / "elsewhere"))
    with pytest.raises(LakejoinError, match="config changes relations.s.table from .* but bronze/s was ingested with"):
        settle(deltars, pipeline.warehouse, moved.config, "run")


def test_pointers_that_landed_without_their_log_row_are_joined_by_the_next_run_with_nothing_new(
    deltars, tmp_path, sources, monkeypatch
):
    _, payments = sources
    pipeline = tables_pipeline(deltars, str(tmp_path), None, payments)
    pipeline.ingest("r", pipeline.write_file([{**order(1, 0, "ann"), "order_time": START.isoformat()}]))
    append(payments, [payment(1, 10, "ann"), {**payment(2, 20, "ann"), "paid_at": None}])
    monkeypatch.setenv(CRASH_AT, "before:ingest_log")  # the table's ingest: its pointers and quarantined row landed
    with pytest.raises(InjectedCrash):
        pipeline.run()
    monkeypatch.delenv(CRASH_AT)
    pipeline.run()  # the table has no new version

    assert gold(pipeline) == expected_gold([order(1, 0, "ann")], [payment(1, 10, "ann")])
    reasons = [row["reason"] for row in deltars.read(pipeline.warehouse.quarantine).collect()]
    assert set(reasons) == {"missing paid_at"}


@pytest.mark.parametrize("step", ["source_identity", "source_commits"])
def test_a_table_with_a_row_filter_or_column_mask_is_refused_in_one_line_with_nothing_written(
    deltars, tmp_path, sources, monkeypatch, step
):
    """Databricks reads neither the history nor a past version of a table with a row filter or column mask, which
    lakejoin reads a source table by: emulated here by its documented error on the first history read (a first run)
    and on the versions after the last ingested (a later run, the filter added since)."""
    from pyspark.errors import AnalysisException

    orders, payments = sources
    pipeline = joined_once(deltars, str(tmp_path), orders, payments)
    append(payments, [payment(2, 20, "ann")])
    before = {path: deltars.version(path) for path in pipeline.warehouse.tables()}

    def refused(*_: object) -> None:
        raise AnalysisException(
            "[ROW_LEVEL_SECURITY_COLUMN_MASK_FEATURE_NOT_SUPPORTED.DESCRIBE_HISTORY] Row level security policies and "
            f"column mask policies for {payments} are not supported: Reading commit history is not supported for "
            "tables with row level security and column mask policies. SQLSTATE: 0A000"
        )

    monkeypatch.setattr(deltars, step, refused)
    with pytest.raises(LakejoinError, match=r"^source table \S+ has a row filter or column mask") as error:
        pipeline.run()
    assert "\n" not in str(error.value)
    assert {path: deltars.version(path) for path in pipeline.warehouse.tables()} == before
