"""The store/probe join through the real pipeline: bronze ingest, silver batches, gold."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame

from pipelines.commands.maintain import maintain
from pipelines.silver import run
from state.config import Config
from state.engines.deltars import DeltaRsEngine
from state.layout import PROVENANCE
from tests.helpers import Pipeline
from tests.reference import Pair, Record, batch_join, join_in_arrival_order
from tests.strategies import split

R2, R4, R8 = (Record("r", f"r{ts}", ts, "k", f"payload r{ts}") for ts in (2, 4, 8))
S1, S7 = (Record("s", f"s{ts}", ts, "k", f"payload s{ts}") for ts in (1, 7))

# docs/design.md section 2's worked example, one record per batch: (r_id, s_id, owner, batch that produced it).
ORDERS = {
    "ideal": (
        [S1, R2, R4, S7, R8],
        {
            ("r2", "s1", "S", 2),
            ("r4", "s1", "S", 3),
            ("r2", "s7", "R", 4),
            ("r4", "s7", "R", 4),
            ("r8", "s1", "S", 5),
            ("r8", "s7", "S", 5),
        },
    ),
    "delayed probe s7": (
        [S1, R2, R4, R8, S7],
        {
            ("r2", "s1", "S", 2),
            ("r4", "s1", "S", 3),
            ("r8", "s1", "S", 4),
            ("r2", "s7", "R", 5),
            ("r4", "s7", "R", 5),
            ("r8", "s7", "S", 5),
        },
    ),
    "delayed store r4": (
        [S1, R2, S7, R4, R8],
        {
            ("r2", "s1", "S", 2),
            ("r2", "s7", "R", 3),
            ("r4", "s1", "S", 4),
            ("r4", "s7", "R", 4),
            ("r8", "s1", "S", 5),
            ("r8", "s7", "S", 5),
        },
    ),
}


@pytest.mark.parametrize(
    "engine, order_name",
    [
        *(("delta-rs", name) for name in ORDERS),
        pytest.param("spark", "delayed store r4", marks=pytest.mark.spark_delta),
    ],
    indirect=["engine"],
)
def test_worked_example_one_record_at_a_time(engine, tmp_path, order_name):
    order, expected = ORDERS[order_name]
    pipeline = Pipeline(engine, str(tmp_path))
    for record in order:
        pipeline.land([record])
        pipeline.run()
    rows = pipeline.gold_rows()
    assert {(row["r_id"], row["s_id"], row["owner"], row["batch_id"]) for row in rows} == expected
    assert len(rows) == 6
    assert Counter(pipeline.gold_pairs()) == Counter(join_in_arrival_order(order))


@pytest.mark.parametrize("engine", ["delta-rs", pytest.param("spark", marks=pytest.mark.spark_delta)], indirect=True)
def test_bronze_and_state_keep_file_statistics_of_the_columns_lakejoin_reads_them_of(engine, tmp_path):
    pipeline = Pipeline(engine, str(tmp_path))
    pipeline.land([S1, R2])
    pipeline.run()
    pipeline.land([R4, S7])  # the tables written again keep their property
    pipeline.run()
    warehouse = pipeline.warehouse
    for rel in warehouse.relations:
        for path in (warehouse.bronze(rel), warehouse.state(rel)):
            assert {frozenset(stats["minValues"]) for stats in file_statistics(path)} == {
                frozenset({"_arrival_seq", "_ts", "_id"})
            }, path
    assert engine.max_value(warehouse.bronze(warehouse.relations[0]), "_arrival_seq") == 3
    assert Counter(pipeline.gold_pairs()) == Counter(join_in_arrival_order([S1, R2, R4, S7]))


@pytest.mark.parametrize("engine", ["delta-rs", pytest.param("spark", marks=pytest.mark.spark_delta)], indirect=True)
def test_batches_leave_checkpoints_to_maintain_which_writes_every_tables_at_its_latest_version(engine, tmp_path):
    """Tables lakejoin makes take a checkpoint interval of 100 commits (Delta on Spark's default, 10, makes every tenth
    commit of a batch wait for one); ``maintain`` writes each table's checkpoint, and the warehouse reads on from it."""
    pipeline = Pipeline(engine, str(tmp_path))
    pipeline.land([S1, R2])
    pipeline.run()
    warehouse = pipeline.warehouse
    tables = [table for table in warehouse.tables() if engine.version(table) is not None]
    assert {warehouse.name_of(table): log_configuration(table).get("delta.checkpointInterval") for table in tables} == {
        warehouse.name_of(table): "100" for table in tables
    }
    assert maintain(engine, warehouse)
    assert {warehouse.name_of(table): last_checkpoint(table) for table in tables} == {
        warehouse.name_of(table): engine.version(table) for table in tables
    }
    pipeline.land([R4, S7])
    pipeline.run()
    assert Counter(pipeline.gold_pairs()) == Counter(join_in_arrival_order([S1, R2, R4, S7]))


def log_configuration(path: str) -> dict[str, str]:
    """The table properties of the newest ``metaData`` action among the table's commits."""
    log = os.path.join(path, "_delta_log")
    commits = sorted(name for name in os.listdir(log) if name.endswith(".json"))
    actions = [json.loads(line) for name in commits for line in open(os.path.join(log, name)) if line.strip()]
    return [action["metaData"] for action in actions if "metaData" in action][-1].get("configuration", {})


def last_checkpoint(path: str) -> int | None:
    """The version ``_last_checkpoint`` points at; None when the table has no checkpoint."""
    pointer = os.path.join(path, "_delta_log", "_last_checkpoint")
    return json.load(open(pointer))["version"] if os.path.exists(pointer) else None


def test_state_keeps_no_provenance_and_a_state_table_made_holding_it_keeps_getting_it(deltars, tmp_path):
    """Where bronze got a record (its file, line and ingest) stays in bronze; a state table an earlier lakejoin made
    with those columns gets them for its new rows too, so the layout needs no migration."""
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land([S1, R2])
    pipeline.run()
    warehouse = pipeline.warehouse
    r, s = warehouse.relations
    assert not set(PROVENANCE) & set(deltars.schema(warehouse.state(r)).fieldNames())
    assert set(PROVENANCE) <= set(deltars.schema(warehouse.bronze(r)).fieldNames())

    made_before(deltars, warehouse.state(s), warehouse.bronze(s))
    pipeline.land([R4, S7])
    pipeline.run()
    held = {row["_id"]: row for row in deltars.rows(warehouse.state(s)).to_pylist()}
    bronze = {row["_id"]: row for row in deltars.rows(warehouse.bronze(s)).to_pylist()}
    assert {(id_, name): held[id_][name] for id_ in held for name in PROVENANCE} == {
        (id_, name): bronze[id_][name] for id_ in held for name in PROVENANCE
    }
    assert held.keys() == {"s1", "s7"}
    assert not set(PROVENANCE) & set(deltars.schema(warehouse.state(r)).fieldNames())
    assert pipeline.gold_pairs() == Counter(join_in_arrival_order([S1, R2, R4, S7]))


def made_before(engine: DeltaRsEngine, state: str, bronze: str) -> None:
    """``state`` rewritten as lakejoin kept state tables before: each row with its bronze row's provenance."""
    provenance = engine.rows(bronze).select(["_id", *PROVENANCE])
    write_deltalake(state, engine.rows(state).join(provenance, "_id"), mode="overwrite", schema_mode="overwrite")
    engine.refresh()


def file_statistics(path: str) -> list[dict]:
    """The statistics of every file the table's commits added (Delta's JSON)."""
    log = os.path.join(path, "_delta_log")
    commits = sorted(name for name in os.listdir(log) if name.endswith(".json"))
    actions = [json.loads(line) for name in commits for line in open(os.path.join(log, name)) if line.strip()]
    return [json.loads(action["add"]["stats"]) for action in actions if "add" in action and action["add"].get("stats")]


def test_gold_rows_carry_both_records(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land([S1, R2])
    pipeline.run()
    (row,) = pipeline.gold_rows()
    assert {k: row[k] for k in ("r_id", "s_id", "r_ts", "s_ts", "r_key", "s_key", "r_payload", "s_payload", "owner", "batch_id")} == {
        "r_id": "r2", "s_id": "s1", "r_ts": 2, "s_ts": 1, "r_key": "k", "s_key": "k",
        "r_payload": "payload r2", "s_payload": "payload s1", "owner": "S", "batch_id": 1,
    }  # fmt: skip
    assert row["produced_at"] is not None


def test_running_with_nothing_pending_changes_nothing(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land([S1, R2, R4])
    assert len(pipeline.run(max_batch_rows=2)) == 2
    versions = {path: deltars.version(path) for path in (pipeline.warehouse.gold, pipeline.warehouse.batches)}
    assert pipeline.run() == []
    assert {path: deltars.version(path) for path in versions} == versions


def test_batches_are_prefixes_of_the_arrival_order_of_at_most_n_rows(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land([S1, R2, R4, S7, R8])
    reports = pipeline.run(max_batch_rows=2)
    assert [report.arrivals for report in reports] == [{"r": 1, "s": 1}, {"r": 1, "s": 1}, {"r": 1, "s": 0}]
    history = sorted(pipeline.engine.read(pipeline.warehouse.batches).collect(), key=lambda r: r.batch_id)
    assert [(row.seq_from, row.seq_to) for row in history] == [(0, 2), (2, 4), (4, 5)]
    steps = {"planning", "read", "measure", "gold", "r_state", "s_state", "commit"}
    assert all(steps <= set(report.phases) for report in reports), [sorted(report.phases) for report in reports]
    assert all(0 < report.phases["measure"] < report.seconds for report in reports)


arrival_sequences = st.lists(
    st.tuples(st.sampled_from(["r", "s"]), st.integers(0, 5), st.sampled_from(["a", "b"])), min_size=1, max_size=12
).map(lambda rows: [Record(rel, f"{rel}{i}", ts, key, f"p{i}") for i, (rel, ts, key) in enumerate(rows)])


def arrivals_in_random_batches_give_the_batch_join(
    engine, root: str, records: list[Record], data: st.DataObject
) -> None:
    """Random relations, arrival permutations and micro-batch splits: gold is the batch join, each pair once."""
    order = data.draw(st.permutations(records))
    batches = split(data, order, most=3)
    pipeline = Pipeline(engine, root)
    for batch in batches:
        pipeline.land(batch)
        pipeline.run(max_batch_rows=data.draw(st.integers(1, 6)))
    assert pipeline.gold_pairs() == Counter(batch_join(records))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=arrival_sequences, data=st.data())
def test_any_arrival_order_and_batch_split_gives_the_batch_join(deltars, tmp_path_factory, records, data):
    arrivals_in_random_batches_give_the_batch_join(deltars, str(tmp_path_factory.mktemp("prop")), records, data)


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=arrival_sequences.filter(lambda records: len(records) <= 8), data=st.data())
def test_an_engine_keeping_its_tables_open_writes_what_a_fresh_engine_per_batch_writes(
    spark, tmp_path_factory, records, data
):
    """The delta-rs engine opens a table once and follows its new commits (a warm run, or ``run --follow``); a new
    process opens everything again. Both give the same gold, state, rule tables and batch log."""
    order = data.draw(st.permutations(records))
    batches = split(data, order, most=2)
    rows = data.draw(st.integers(2, 4))
    warm = Pipeline(DeltaRsEngine(spark), str(tmp_path_factory.mktemp("warm")))
    cold = Pipeline(DeltaRsEngine(spark), str(tmp_path_factory.mktemp("cold")))
    for batch in batches:
        for pipeline in (warm, cold):
            pipeline.land(batch)
        warm.run(max_batch_rows=rows)
        while True:  # one batch per fresh engine, as one process per batch would
            cold.engine = DeltaRsEngine(spark)
            taken = iter([False, True])
            if not run(
                cold.engine, cold.warehouse, cold.config.with_overrides(max_batch_rows=rows), stop=lambda: next(taken)
            ):
                break
    assert cold.snapshot() == warm.snapshot()


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=arrival_sequences, data=st.data())
def test_on_delta_spark_any_arrival_order_and_batch_split_gives_the_batch_join(
    spark_engine, tmp_path_factory, records, data
):
    arrivals_in_random_batches_give_the_batch_join(spark_engine, str(tmp_path_factory.mktemp("prop")), records, data)


def test_non_equi_predicate(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(predicate="r.x < s.y AND r.region = s.region"))
    r_rows = [
        {"id": "r1", "ts": 1, "key": "-", "x": 5, "region": "eu"},
        {"id": "r2", "ts": 9, "key": "-", "x": 1, "region": "us"},
    ]
    s_rows = [{"id": "s1", "ts": 5, "key": "-", "y": 7, "region": "eu"}, {"id": "s2", "ts": 3, "key": "-", "y": 2, "region": "us"},
              {"id": "s3", "ts": 4, "key": "-", "y": 9, "region": "us"}, {"id": "s4", "ts": 6, "key": "-", "y": 4, "region": "eu"}]  # fmt: skip
    pipeline.ingest("s", pipeline.write_file(s_rows[:2]))
    pipeline.ingest("r", pipeline.write_file(r_rows))
    pipeline.run(max_batch_rows=1)
    pipeline.ingest("s", pipeline.write_file(s_rows[2:]))
    pipeline.run(max_batch_rows=1)
    assert pipeline.gold_pairs() == Counter([Pair("r1", "s1", "R"), Pair("r2", "s2", "S"), Pair("r2", "s3", "S")])


def test_a_null_operand_never_matches(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(predicate="r.x = s.y"))
    pipeline.ingest(
        "r",
        pipeline.write_file([{"id": "r1", "ts": 1, "key": "k", "x": None}, {"id": "r2", "ts": 2, "key": "k", "x": 3}]),
    )
    pipeline.ingest(
        "s",
        pipeline.write_file([{"id": "s1", "ts": 3, "key": "k", "y": None}, {"id": "s2", "ts": 4, "key": "k", "y": 3}]),
    )
    pipeline.run()
    assert pipeline.gold_pairs() == Counter([Pair("r2", "s2", "R")])


def test_a_record_with_a_null_key_is_quarantined_and_never_joins(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.ingest("r", pipeline.write_file([{"id": "r1", "ts": 1, "key": None}, {"id": "r2", "ts": 2, "key": "k"}]))
    pipeline.ingest("s", pipeline.write_file([{"id": "s1", "ts": 3, "key": "k"}]))
    pipeline.run()
    assert pipeline.gold_pairs() == Counter([Pair("r2", "s1", "R")])


@pytest.mark.parametrize("predicate", ["r.nope = s.key", "r.key = s.key AND r._ingest_id = s._ingest_id"])
def test_a_predicate_that_does_not_resolve_fails_before_any_write(deltars, tmp_path, predicate):
    """Bronze's provenance is no record column: state keeps none of it, so a predicate naming it is refused, not
    met by nulls in stored records."""
    from state.errors import LakejoinError

    pipeline = Pipeline(deltars, str(tmp_path), Config.of(predicate=predicate))
    pipeline.land([S1, R2])
    with pytest.raises(LakejoinError, match="does not resolve"):
        pipeline.run()
    assert deltars.version(pipeline.warehouse.batches) is None
    assert deltars.version(pipeline.warehouse.gold) is None


def test_on_delta_spark_neither_a_file_nor_a_batch_s_pairs_pass_through_the_driver(spark_engine, tmp_path, monkeypatch):
    """What reaches the driver as Arrow is at most a relation's arrivals in one small batch (held there to be joined
    from): the files ingested and the batch's 1,600 pairs stay in Spark, and gold is still exact."""
    sizes: list[int] = []
    frames = type(spark_engine.spark.range(0))  # the session's DataFrame class (pyspark.sql.classic)
    to_arrow = frames.toArrow

    def measured(frame: DataFrame):  # noqa: ANN202 - pyarrow.Table
        table = to_arrow(frame)
        sizes.append(table.num_rows)
        return table

    monkeypatch.setattr(frames, "toArrow", measured)
    records = [Record(side, f"{side}{n}", n, "k", "") for side in ("r", "s") for n in range(40)]
    pipeline = Pipeline(spark_engine, str(tmp_path))
    pipeline.land(records)
    brought_by_ingest, sizes[:] = max(sizes, default=0), []
    (report,) = pipeline.run(max_batch_rows=80)

    assert brought_by_ingest <= 1  # the ingest log's look-up of the file
    assert report.pairs == 1_600 and max(sizes) <= 40
    assert pipeline.gold_pairs() == Counter(batch_join(records))
