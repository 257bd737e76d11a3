"""Records that change: joins over change feeds, gold corrected exactly once (state/join/changes.py, pipelines/gold.py).

Gold after every batch is the join of the current version of every record; ``gold/changes`` lists what each batch
added and took out; an older change arriving later changes nothing, and a delete's tombstone outlives it.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from expectations.reconcile import check_gold
from pipelines.commands.status import warehouse_status
from pipelines.silver import BatchReport, run
from state.config import Config
from state.errors import LakejoinError
from tests.helpers import Pipeline, copied, crash_at_each

CHANGES = {"op": "op", "sequence_by": "seq"}
CONFIG = {"relations": {"r": {"changes": CHANGES}, "s": {"changes": CHANGES}}}


def change(op: str, seq: int, id: str, ts: int, key: str, amount: float = 1.0) -> dict:
    return {"op": op, "seq": seq, "id": id, "ts": ts, "key": key, "amount": amount}


# Every batch of two rows retracts what the one before added.
RETRACTING = [
    ("r", change("c", 1, "o1", 1, "k1", 10.0)),
    ("s", change("c", 1, "p1", 2, "k1", 1.0)),
    ("r", change("u", 2, "o1", 3, "k2", 11.0)),
    ("s", change("c", 2, "p2", 4, "k2", 2.0)),
    ("s", change("d", 3, "p2", 4, "k2", 2.0)),
    ("r", change("c", 3, "o3", 5, "k1", 30.0)),
    ("s", change("u", 4, "p1", 6, "k2", 3.0)),
    ("r", change("u", 4, "o3", 7, "k2", 31.0)),
    ("r", change("d", 5, "o1", 3, "k2", 11.0)),
    ("s", change("c", 5, "p5", 8, "k2", 5.0)),
]


def current_gold(pipeline: Pipeline) -> Counter:
    gold = pipeline.engine.rows(pipeline.warehouse.gold)  # on the driver: delta-rs reads it without a Spark job
    return (
        Counter()
        if gold is None
        else Counter((row["_r_id"], row["_s_id"], row["r_amount"], row["s_amount"]) for row in gold.to_pylist())
    )


def changes_sum(pipeline: Pipeline) -> Counter:
    """``gold/changes`` summed: +1 per ``+`` row, -1 per ``-`` row, per row content."""
    rows = pipeline.engine.read(pipeline.warehouse.gold_changes)
    total: Counter = Counter()
    for row in [] if rows is None else rows.collect():
        total[(row["_r_id"], row["_s_id"], row["r_amount"], row["s_amount"])] += 1 if row["_change"] == "+" else -1
    return +total


@pytest.fixture
def orders(tmp_path, deltars) -> Pipeline:
    return Pipeline(deltars, str(tmp_path), Config.of(**CONFIG))


def test_an_update_retracts_the_old_versions_pairs_and_adds_the_new_ones(orders: Pipeline) -> None:
    orders.ingest("r", orders.write_file([change("c", 1, "o1", 10, "k1", 100.0)]))
    orders.ingest("s", orders.write_file([change("c", 1, "p1", 12, "k1", 100.0), change("c", 2, "p2", 13, "k2", 5.0)]))
    orders.run()
    assert current_gold(orders) == Counter({("o1", "p1", 100.0, 100.0): 1})

    orders.ingest("r", orders.write_file([change("u", 2, "o1", 11, "k2", 120.0)]))  # amount corrected, and another key
    orders.run()
    assert current_gold(orders) == Counter({("o1", "p2", 120.0, 5.0): 1})

    orders.ingest("s", orders.write_file([change("d", 3, "p2", 13, "k2", 5.0)]))
    orders.run()
    assert current_gold(orders) == Counter()
    assert changes_sum(orders) == current_gold(orders)
    counts = warehouse_status(orders.engine, orders.warehouse, orders.config).changes
    assert counts["all batches"] == {"inserted": 3, "updated": 1, "deleted": 1, "ignored": 0, "late": 0, "retracted": 2}
    assert counts["batch 3"] == {"inserted": 0, "updated": 0, "deleted": 1, "ignored": 0, "late": 0, "retracted": 1}
    check = check_gold(orders.engine, orders.warehouse, orders.config)
    assert check.passed, check.describe()


def test_an_older_change_arriving_later_changes_nothing_and_a_delete_outlives_a_late_insert(orders: Pipeline) -> None:
    orders.ingest("s", orders.write_file([change("c", 1, "p1", 12, "k1")]))
    orders.ingest(
        "r", orders.write_file([change("u", 5, "o1", 10, "k1", 50.0)])
    )  # an update before its insert: an upsert
    orders.run()
    orders.ingest("r", orders.write_file([change("c", 1, "o1", 10, "k1", 10.0)]))  # the insert, older: ignored
    orders.ingest("s", orders.write_file([change("d", 4, "p1", 12, "k1")]))
    orders.run()
    orders.ingest("s", orders.write_file([change("c", 2, "p1", 12, "k1")]))  # older than its delete: stays deleted
    reports = orders.run()
    assert current_gold(orders) == Counter()
    assert changes_sum(orders) == Counter()
    assert reports[-1].pairs == 0
    logged = {(row["id"], row["reason"]) for row in orders.engine.read(orders.warehouse.late_arrivals).collect()}
    assert logged == {
        ("o1", "older change: sequence 1 is below sequence 5 of the same record"),
        ("p1", "older change: sequence 2 is below sequence 4 of the same record"),
    }


def test_a_three_way_join_over_change_feeds_keeps_the_join_of_the_current_records(tmp_path, deltars) -> None:
    feeds = {"relations": {name: {"changes": CHANGES} for name in ("r", "s", "t")}}
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(**feeds))
    landed = [
        ("r", change("c", 1, "r1", 1, "k1")),
        ("s", change("c", 1, "s1", 2, "k1")),
        ("t", change("c", 1, "t1", 3, "k1")),
        ("t", change("c", 2, "t2", 4, "k1")),
        ("s", change("u", 2, "s1", 5, "k2")),
        ("s", change("c", 3, "s3", 0, "k1")),
        ("t", change("d", 3, "t1", 3, "k1")),
        ("r", change("u", 2, "r1", 6, "k1", 2.0)),
    ]

    def tuples():
        return Counter(tuple(row[f"_{name}_id"] for name in "rst") + (row["r_amount"],) for row in pipeline.gold_rows())

    for relation, row in landed:
        pipeline.ingest(relation, pipeline.write_file([row]))
    pipeline.run(max_batch_rows=3)
    assert tuples() == Counter({("r1", "s3", "t2", 2.0): 1})


def test_a_change_feed_takes_an_inner_join_and_refuses_others_in_one_line() -> None:
    with pytest.raises(LakejoinError, match=r"join: left over change feeds is not built"):
        Config.of(**CONFIG, join="left", window=10, allowed_lateness=5)
    with pytest.raises(LakejoinError, match=r"relations.r.changes: cdf reads a source table"):
        Config.of(relations={"r": {"changes": "cdf"}, "s": {}})


# The semantics in plain Python, independent of the store/probe model: per record, its latest change (by sequence,
# then arrival) among those arrived, absent once deleted; gold is the join of those versions on equal keys.


def current_records(events: list[tuple[str, dict]]) -> dict[str, dict[str, dict]]:
    latest: dict[tuple[str, str], tuple[int, int, dict]] = {}
    for arrival, (relation, row) in enumerate(events):
        held = latest.get((relation, row["id"]))
        if held is None or (row["seq"], arrival) > held[:2]:
            latest[(relation, row["id"])] = (row["seq"], arrival, row)
    current: dict[str, dict[str, dict]] = {"r": {}, "s": {}}
    for (relation, id), (_, _, row) in latest.items():
        if row["op"] != "d":
            current[relation][id] = row
    return current


def reference_gold(events: list[tuple[str, dict]]) -> Counter:
    current = current_records(events)
    return Counter(
        (r["id"], s["id"], r["amount"], s["amount"])
        for r in current["r"].values()
        for s in current["s"].values()
        if r["key"] == s["key"]
    )


# A schedule a user might follow: ("ingest", relation, rows) lands one file, ("run", n) runs batches of up to n rows.
Step = tuple


@st.composite
def change_schedules(draw: st.DrawFn) -> list[Step]:
    """Changes of a few records of r and s (each relation numbering its own sequence), shuffled, landed in files of
    one relation each, with runs of random batch sizes after random ingests and a last run."""
    events = []
    for relation in "rs":
        seq = 0
        for number in range(draw(st.integers(1, 3))):
            for op in ["c", *["u"] * draw(st.integers(0, 2)), *(["d"] if draw(st.booleans()) else [])]:
                seq += 1
                events.append(
                    (
                        relation,
                        change(
                            op,
                            seq,
                            f"{relation}{number}",
                            draw(st.integers(0, 20)),
                            draw(st.sampled_from(["k1", "k2"])),
                            float(seq),
                        ),
                    )
                )
    steps: list[Step] = []
    for relation, run_of in itertools.groupby(draw(st.permutations(events)), key=lambda event: event[0]):
        steps.append(("ingest", relation, [row for _, row in run_of]))
        if draw(st.booleans()):
            steps.append(("run", draw(st.integers(1, 4))))
    return [*steps, ("run", 100)]


# A batch that changes no gold row (an update of a record with no partner: its MERGE changes nothing), then one that
# changes no state row either (an older change arriving after a newer one of its record), then runs that go on.
UNCHANGED = [
    ("ingest", "r", [change("c", 1, "o1", 1, "k1")]), ("run", 5),
    ("ingest", "r", [change("u", 3, "o1", 2, "k2")]), ("run", 5),
    ("ingest", "r", [change("u", 2, "o1", 4, "k1")]), ("run", 5),
    ("ingest", "s", [change("c", 1, "p1", 3, "k2"), change("c", 2, "p2", 3, "k1")]), ("run", 5),
]  # fmt: skip


def follow(
    pipeline: Pipeline, schedule: list[Step], arrived: list[tuple[str, dict]] | None = None
) -> list[tuple[str, dict]]:
    """``schedule`` carried out after the changes ``arrived`` before it, gold checked against the reference after every
    batch; returns every change arrived."""
    arrived = list(arrived or [])

    def check(report: BatchReport) -> None:
        (upto,) = (
            pipeline.engine.rows(pipeline.warehouse.batches, where=f"batch_id = {report.batch_id}")
            .column("seq_to")
            .to_pylist()
        )
        assert current_gold(pipeline) == reference_gold(arrived[:upto]), f"after batch {report.batch_id}"

    for step in schedule:
        if step[0] == "ingest":
            pipeline.ingest(step[1], pipeline.write_file(step[2]))
            arrived += [(step[1], row) for row in step[2]]
        else:
            run(
                pipeline.engine,
                pipeline.warehouse,
                pipeline.config.with_overrides(max_batch_rows=step[1]),
                progress=check,
            )
    assert changes_sum(pipeline) == current_gold(pipeline) == reference_gold(arrived)
    return arrived


CHANGE_PROPERTY = settings(
    deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@settings(CHANGE_PROPERTY, max_examples=1)
@example(schedule=UNCHANGED)
@given(schedule=change_schedules())
def test_runs_after_any_ingests_keep_gold_the_join_of_the_current_records_after_every_batch(
    tmp_path_factory, deltars, schedule
) -> None:
    """Every batch leaves its mark in gold, also one whose MERGE changes nothing there, so every later run goes on."""
    follow(Pipeline(deltars, str(tmp_path_factory.mktemp("changes")), Config.of(**CONFIG)), schedule)


def test_on_delta_spark_batches_that_change_nothing_in_gold_or_state_are_followed_by_runs_that_go_on(
    tmp_path, spark_engine
) -> None:
    """The schedule above on Delta on Spark, whose MERGE likewise commits nothing when it changes nothing (the property
    runs on delta-rs: a change-feed batch costs several times as much here)."""
    follow(Pipeline(spark_engine, str(tmp_path), Config.of(**CONFIG)), UNCHANGED)


def test_a_warehouse_whose_gold_lacks_the_marks_of_batches_that_changed_nothing_there_runs_on(
    tmp_path_factory, deltars
) -> None:
    """Earlier versions left no mark in gold for a batch whose MERGE changed nothing there, and refused every later run;
    the batch log shows such a batch changed nothing in gold, so the next run goes on. A gold restored to before a
    batch that did change it is still refused, however many batches that changed nothing follow it."""
    stuck = Pipeline(deltars, str(tmp_path_factory.mktemp("stuck")), Config.of(**CONFIG))
    arrived = follow(stuck, UNCHANGED[:4])  # batch 2 updates o1, which has no partner: gold unchanged
    assert [row["operation"] for row in DeltaTable(stuck.warehouse.gold).history(1)] == ["WRITE"], (
        "a commit of no rows marks batch 2"
    )
    drop_last_commit(stuck.warehouse.gold)  # as earlier versions left it
    before = str(tmp_path_factory.mktemp("backup") / "gold")
    shutil.copytree(stuck.warehouse.gold, before)
    arrived = follow(stuck, UNCHANGED[4:], arrived)  # batch 3 changes nothing in gold, batch 4 adds (o1, p1)
    follow(stuck, [("ingest", "s", [change("d", 3, "p2", 3, "k1")]), ("run", 5)], arrived)  # p2 has no partner
    assert stuck.engine.txn_version(stuck.warehouse.gold, stuck.warehouse.app_id("lakejoin", stuck.warehouse.gold)) == 5
    shutil.rmtree(stuck.warehouse.gold)
    shutil.copytree(before, stuck.warehouse.gold)  # restored from a copy made before batch 4
    stuck.ingest("r", stuck.write_file([change("c", 5, "o3", 5, "k1")]))
    with pytest.raises(
        LakejoinError,
        match=r"gold/join_results ends at batch 1, but the batch log has committed batch 5 \(was it restored",
    ):
        stuck.run()


def drop_last_commit(table: str) -> None:
    """The table as if its newest commit had never been made: its log entry, and Delta on Spark's checksums of it."""
    log = os.path.join(table, "_delta_log")
    newest = max(name for name in os.listdir(log) if name.endswith(".json") and not name.startswith("."))
    for name in (newest, newest.replace(".json", ".crc"), f".{newest}.crc", f".{newest.replace('.json', '.crc')}.crc"):
        if os.path.exists(os.path.join(log, name)):
            os.remove(os.path.join(log, name))


def change_source(engine, table: str, statement: str, rows: list[dict] | None = None) -> None:
    """A real Delta commit to the user's table: Spark SQL on Delta on Spark, delta-rs's own operation otherwise."""
    if engine.name == "spark":
        if rows:
            engine.spark.createDataFrame(rows).createOrReplaceTempView("incoming")
        engine.spark.sql(statement.format(table=f"delta.`{table}`")).collect()
        return
    opened = DeltaTable(table)
    if statement.startswith("UPDATE"):
        opened.update(updates={"amount": "15.0"}, predicate="order_id = 'o1'")
    elif statement.startswith("DELETE"):
        opened.delete("order_id = 'o2'")
    else:
        merge = opened.merge(
            pa.Table.from_pylist(rows),
            "target.order_id = source.order_id",
            source_alias="source",
            target_alias="target",
        )
        merge.when_matched_update_all().when_not_matched_insert_all().execute()


def test_a_source_tables_update_delete_and_merge_commits_correct_gold_through_its_change_data_feed(
    tmp_path, engine
) -> None:
    orders = str(tmp_path / "raw" / "orders")
    write_deltalake(
        orders,
        pa.Table.from_pylist(
            [
                {"order_id": "o1", "customer": "ann", "t": 1, "amount": 10.0},
                {"order_id": "o2", "customer": "bob", "t": 2, "amount": 20.0},
            ]
        ),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    relations = {
        "r": {"id": "order_id", "event_time": "t", "table": orders, "changes": "cdf"},
        "s": {"id": "payment_id", "event_time": "t"},
    }
    pipeline = Pipeline(engine, str(tmp_path), Config.of(relations=relations, predicate="r.customer = s.customer"))
    pipeline.ingest(
        "s",
        pipeline.write_file(
            [{"payment_id": "p1", "customer": "ann", "t": 3}, {"payment_id": "p2", "customer": "bob", "t": 4}]
        ),
    )

    def joined() -> Counter:
        pipeline.run()
        return Counter(
            (row["r_order_id"], row["s_payment_id"], row["r_customer"], row["r_amount"]) for row in pipeline.gold_rows()
        )

    assert joined() == Counter({("o1", "p1", "ann", 10.0): 1, ("o2", "p2", "bob", 20.0): 1})
    change_source(engine, orders, "UPDATE {table} SET amount = 15.0 WHERE order_id = 'o1'")
    assert joined() == Counter({("o1", "p1", "ann", 15.0): 1, ("o2", "p2", "bob", 20.0): 1})
    change_source(engine, orders, "DELETE FROM {table} WHERE order_id = 'o2'")
    assert joined() == Counter({("o1", "p1", "ann", 15.0): 1})
    merged = [
        {"order_id": "o1", "customer": "bob", "t": 1, "amount": 15.0},
        {"order_id": "o3", "customer": "ann", "t": 5, "amount": 30.0},
    ]
    change_source(
        engine,
        orders,
        "MERGE INTO {table} AS target USING incoming AS source ON target.order_id = source.order_id "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
        merged,
    )
    assert joined() == Counter({("o1", "p2", "bob", 15.0): 1, ("o3", "p1", "ann", 30.0): 1})
    signed: Counter = Counter()
    for row in pipeline.engine.read(pipeline.warehouse.gold_changes).collect():
        signed[(row["r_order_id"], row["s_payment_id"], row["r_amount"])] += 1 if row["_change"] == "+" else -1
    assert +signed == Counter({("o1", "p2", 15.0): 1, ("o3", "p1", 30.0): 1})
    assert DeltaTable(pipeline.warehouse.gold).metadata().configuration.get("delta.enableChangeDataFeed") == "true"


def test_a_source_table_without_its_change_data_feed_is_refused_in_one_line(tmp_path, deltars) -> None:
    orders = str(tmp_path / "orders")
    write_deltalake(orders, pa.Table.from_pylist([{"id": "o1", "ts": 1, "key": "k"}]))
    pipeline = Pipeline(
        deltars, str(tmp_path), Config.of(relations={"r": {"table": orders, "changes": "cdf"}, "s": {}})
    )
    with pytest.raises(
        LakejoinError,
        match=r"has no Change Data Feed .*ALTER TABLE .* SET TBLPROPERTIES \(delta.enableChangeDataFeed = true\)",
    ):
        pipeline.run()


def test_a_run_dying_at_each_write_of_change_batches_resumes_to_the_uninterrupted_gold(
    deltars, tmp_path_factory, monkeypatch
) -> None:
    """Every batch retracts what the one before added: a crash between gold's MERGE and the state tables' (or the
    commit) must neither lose a retraction nor apply one twice."""
    events = RETRACTING
    uninterrupted = Pipeline(deltars, str(tmp_path_factory.mktemp("uninterrupted")), Config.of(**CONFIG))
    for relation, row in events:
        uninterrupted.ingest(relation, uninterrupted.write_file([row]))
    crashed = copied(uninterrupted, tmp_path_factory.mktemp("crashed"))
    uninterrupted.run(max_batch_rows=2)
    steps = ["gold", "gold_changes", "r_state", "s_state", "commit"]
    crash_at_each(
        crashed, monkeypatch, [f"{moment}:{step}" for step in steps for moment in ("before", "after")], max_batch_rows=2
    )
    assert current_gold(crashed) == current_gold(uninterrupted) == reference_gold(events)
    assert changes_sum(crashed) == changes_sum(uninterrupted) == reference_gold(events)

    def logged(pipeline):
        return pipeline.engine.read(pipeline.warehouse.gold_changes).groupBy("batch_id", "_change").count().collect()

    assert sorted(logged(crashed)) == sorted(logged(uninterrupted))


def test_a_change_row_without_a_known_operation_or_a_sequence_is_quarantined_with_the_reason(orders: Pipeline) -> None:
    rows = [
        change("x", 1, "o1", 1, "k1"),
        {**change("u", 1, "o2", 1, "k1"), "seq": "soon"},
        change("r", 2, "o3", 1, "k1"),
    ]
    result = orders.ingest("r", orders.write_file(rows))
    assert (result.landed, result.quarantined) == (1, 2)
    reasons = {row["id"]: row["reason"] for row in orders.engine.read(orders.warehouse.quarantine).collect()}
    assert reasons == {
        "o1": "op is not a change operation (insert: c, r; update: u; delete: d): x",
        "o2": "seq is not an integer or a timestamp: soon",
    }
