"""Joins of three and four relations through the pipeline (docs/design.md section 2.8): configured relations,
a store and N - 1 probe buffers each as Delta state tables, gold equal to the N-way join whatever the arrival
order and batch split, state evicted exactly as the reference evicts it, and the exactly-once protocol."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expectations.reconcile import check_gold
from pipelines.api import Pipeline as Api
from state.config import Config
from tests.conftest import SECOND_VIEW
from tests.helpers import Pipeline, copied, crash_at_each
from tests.reference import BatchJoiner, Match, Record, banded
from tests.strategies import split
from tests.test_cli import doc_block
from tests.test_nway_reference import N1, N5, Q4, T2, T6, THREE, A, B, C, D, expected_tuples, streams

PROPERTY = settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def n_way(engine, root, names: str | tuple[str, ...], **settings: object) -> Pipeline:  # noqa: ANN001 - an engine, a path
    """A warehouse joining ``names`` (listed in rank order) on equal ``key``, with the default columns."""
    return Pipeline(engine, str(root), Config.of(relations=dict.fromkeys(names), **settings))


# The worked three-way orders of tests/test_nway_reference.py, one record per batch: which batch produces each tuple.
WORKED = {
    "ideal": ([N1, T2, Q4, N5, T6], {A: 3, B: 4, C: 5, D: 5}),
    "delayed probe n5": ([N1, T2, Q4, T6, N5], {A: 3, C: 4, B: 5, D: 5}),
    "delayed store q4": ([N1, T2, N5, T6, Q4], {A: 5, B: 5, C: 5, D: 5}),
}


@pytest.mark.parametrize("name", WORKED)
def test_worked_three_way_orders_give_each_tuple_once_with_its_owner_in_the_batch_of_its_last_member(
    deltars, tmp_path, name
):
    order, produced_in = WORKED[name]
    pipeline = n_way(deltars, tmp_path, THREE)
    for record in order:
        pipeline.land([record])
        pipeline.run()
    assert pipeline.gold_matches() == Counter(list(produced_in))
    batches = {
        Match(tuple((rel, row[f"_{rel}_id"]) for rel in THREE), row["owner"].lower()): row["batch_id"]
        for row in pipeline.gold_rows()
    }
    assert batches == produced_in


def arrivals_in_random_batches_give_the_n_way_join(engine, root, data: st.DataObject) -> None:  # noqa: ANN001
    """Random contents of 3 or 4 relations, an arrival permutation, a batch split and, half the time, a lateness
    and a window: gold is what the reference's batch form produces over the batches the pipeline ran, each tuple
    once with the owner of its oldest member, and every state table holds what the reference's buffers hold."""
    n = data.draw(st.sampled_from([3, 4]))
    names = "abcd"[:n]
    records = data.draw(streams(n, per_relation=3, keys=st.sampled_from(["x", "y"]), latest=6).filter(bool))
    order = data.draw(st.permutations(records))
    bounded = data.draw(st.booleans())
    lateness, window = (data.draw(st.integers(0, 2)), data.draw(st.integers(0, 3))) if bounded else (None, None)
    pipeline = n_way(engine, root, tuple(names), allowed_lateness=lateness, window=window)
    for landed in split(data, order, most=2):
        pipeline.land(landed)
        pipeline.run(max_batch_rows=data.draw(st.integers(2, 8)))
    joiner = BatchJoiner(names, banded(window), lateness, window)
    found = Counter(match for batch in pipeline.batches() for match in joiner.step(batch)[1])
    assert pipeline.gold_matches() == found
    assert pipeline.state_rows() == joiner.held()
    if not bounded:
        assert found == expected_tuples(records, names)


@PROPERTY
@given(data=st.data())
def test_any_arrival_order_and_batch_split_of_three_or_four_relations_gives_the_n_way_join(
    deltars, tmp_path_factory, data
):
    arrivals_in_random_batches_give_the_n_way_join(deltars, tmp_path_factory.mktemp("nway"), data)


@settings(PROPERTY, max_examples=1)
@given(data=st.data())
def test_on_delta_spark_any_arrival_order_and_batch_split_of_n_relations_gives_the_n_way_join(
    spark_engine, tmp_path_factory, data
):
    arrivals_in_random_batches_give_the_n_way_join(spark_engine, tmp_path_factory.mktemp("nway"), data)


THREE_WAY_FIRST = [
    Record(name, f"{name[0]}{ts}", ts, "k", rank=THREE.index(name))
    for name, ts in [("news", 1), ("trades", 2), ("quotes", 3), ("trades", 4)]
]
THREE_WAY_LATER = [
    Record(name, f"{name[0]}{ts}", ts, "k", rank=THREE.index(name))
    for name, ts in [("quotes", 6), ("news", 5), ("trades", 9), ("news", 0), ("quotes", 8), ("news", 9)]
]


def test_a_three_way_run_dying_at_each_write_in_turn_resumes_to_the_uninterrupted_result(
    deltars, tmp_path_factory, monkeypatch
):
    """Every crash point of a three-way batch (the plan, each output, each of the nine state tables, the commit),
    in one warehouse: each rerun resumes what the last left unfinished and dies at the next point."""
    settings = {"allowed_lateness": 2, "window": 3}
    uninterrupted = n_way(deltars, tmp_path_factory.mktemp("uninterrupted"), THREE, **settings)
    uninterrupted.land(THREE_WAY_FIRST)
    uninterrupted.run(max_batch_rows=3)
    uninterrupted.land(THREE_WAY_LATER)
    crashed = copied(uninterrupted, tmp_path_factory.mktemp("crashed"))
    uninterrupted.run(max_batch_rows=3)
    tables = list(crashed.warehouse.buffers())
    assert len(tables) == 3  # one per relation
    steps = ["gold", "late_arrivals", *tables, "dq_quarantine", "commit"]
    crash_at_each(
        crashed, monkeypatch, [f"{moment}:{step}" for step in steps for moment in ("before", "after")], max_batch_rows=3
    )
    assert crashed.snapshot() == uninterrupted.snapshot()
    assert crashed.late_ids() == {"n0"}  # below the news watermark (5 - 2) when it arrives
    assert uninterrupted.gold_matches()  # the case joins something


@SECOND_VIEW  # state equal to the reference's after every batch: the properties above; bounded: tests/test_bounded_state.py
def test_three_way_state_stays_flat_on_a_long_stream(deltars, tmp_path):
    """A long in-order three-way stream with a window and a lateness: after every batch the state tables hold
    what the reference holds, and never more than a few windows' worth of records."""
    records = [Record(name, f"{name}{t}", t, "k", rank=rank) for t in range(60) for rank, name in enumerate(THREE)]
    pipeline = n_way(deltars, tmp_path, THREE, allowed_lateness=1, window=2)
    joiner = BatchJoiner(THREE, banded(2), 1, 2)
    held = []
    for start in range(0, len(records), 30):
        pipeline.land_chunk(records[start : start + 30])  # one file per relation: each batch is one chunk
        pipeline.run(max_batch_rows=30)
        joiner.step(records[start : start + 30])
        held.append(pipeline.state_rows())
        assert held[-1] == joiner.held()
    assert max(held[1:]) == min(held[1:])  # flat: what a batch adds, the watermarks evict


@st.composite
def synchronized_streams(draw: st.DrawFn, lateness: int) -> tuple[list[Record], list[Record]]:
    """Three streams of distinct, rising event times (two keys), and an arrival order: each stream in its own order
    with lateness 0, else each record delayed by up to ``lateness``, so never below its watermark."""
    records = []
    for rank, name in enumerate("abc"):
        times = sorted(draw(st.sets(st.integers(0, 9), max_size=6)))
        records += [Record(name, f"{name}{t}", t, draw(st.sampled_from(["x", "y"])), rank=rank) for t in times]
    if lateness == 0:
        streams_left = {name: [rec for rec in records if rec.relation == name] for name in "abc"}
        order = []
        while any(streams_left.values()):  # interleave: any stream may come next, each keeps its own order
            name = draw(st.sampled_from([name for name, rest in streams_left.items() if rest]))
            order.append(streams_left[name].pop(0))
        return records, order
    delays = [draw(st.integers(0, lateness)) for _ in records]
    return records, [
        rec
        for _, rec in sorted(
            zip([rec.ts + delay for rec, delay in zip(records, delays)], records), key=lambda pair: pair[0]
        )
    ]


@settings(PROPERTY, max_examples=2)
@given(data=st.data(), lateness=st.sampled_from([0, 2]))
def test_a_synchronized_join_of_three_streams_gives_one_row_per_time_and_key_with_state_bounded_by_the_lateness(
    deltars, tmp_path_factory, data, lateness
):
    """RtBot's Join: a tuple for every time at which every stream holds a record of one key, whatever the
    interleaving of the streams (or disorder within the lateness); state keeps only records a future tuple
    can still take, those at or after the oldest of the streams' newest times, minus the lateness."""
    records, order = data.draw(synchronized_streams(lateness).filter(lambda drawn: drawn[0]))
    config = Config.of(
        relations=dict.fromkeys("abc"),
        join="synchronized",
        predicate="a.key = b.key AND b.key = c.key",
        allowed_lateness=lateness or None,
    )
    pipeline = Pipeline(deltars, str(tmp_path_factory.mktemp("sync")), config)
    joiner = BatchJoiner("abc", banded(0), lateness, 0)
    for landed in split(data, order, most=3):
        pipeline.land(landed)
        pipeline.run(max_batch_rows=data.draw(st.integers(1, 6)))
        newest = [
            max((rec.ts for rec in order[: order.index(landed[-1]) + 1] if rec.relation == name), default=None)
            for name in "abc"
        ]
        state = [
            row["_ts"]
            for path in pipeline.warehouse.buffers().values()
            if (rows := deltars.read(path)) is not None
            for row in rows.collect()
        ]
        if None not in newest:
            assert all(ts >= min(newest) - lateness for ts in state)
    found = Counter(match for batch in pipeline.batches() for match in joiner.step(batch)[1])
    assert pipeline.gold_matches() == found == expected_tuples(records, "abc", window=0)
    assert pipeline.late_ids() == set()
    assert pipeline.state_rows() == joiner.held()


def test_validate_passes_while_one_relation_has_nothing_ingested_yet(deltars, tmp_path):
    """Regression: the audit read a relation without bronze as a table and stopped with a traceback."""
    pipeline = n_way(deltars, tmp_path, THREE)
    pipeline.land([T2, Q4])
    pipeline.run()
    check = check_gold(deltars, pipeline.warehouse, pipeline.config)
    assert check.passed and check.expected == 0, check.describe()


def test_the_docs_three_way_example_joins_and_validates_as_written(spark, tmp_path):
    """The config of docs/joins.md's three-way example, as written: each relation's file ingested, a run, status
    and validate (the command line's own run of the same steps is the README's two-file example, tests/test_cli.py)."""
    pipeline = Api(
        tmp_path / "wh", yaml.safe_load(doc_block("docs/joins.md", "A three-way join of trades")), spark=spark
    )
    for name, key, offset in (("trades", "trade_id", 0), ("quotes", "quote_id", 1), ("news", "news_id", 2)):
        rows = [
            {key: f"{name}{i}", "symbol": "AB"[i % 2], "t": f"2026-01-01T00:00:{3 * i + offset:02d}Z"} for i in range(6)
        ]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
        (landed,) = pipeline.ingest(name, tmp_path / f"{name}.jsonl")
        assert (landed.landed, landed.refused) == (6, None)
    assert pipeline.run().pairs > 0
    tables = {table["name"] for table in pipeline.status()["tables"]}
    assert {"silver/trades_state", "silver/quotes_state", "silver/news_state"} <= tables
    assert pipeline.validate().success
