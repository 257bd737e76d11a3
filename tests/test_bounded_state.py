"""Bounded state (docs/design.md section 4): late arrivals are set aside, eviction never loses a pair, state stays small."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.commands.status import warehouse_status
from pipelines.silver import RunReport
from state.config import Config
from state.join.relations import R
from tests.helpers import Pipeline
from tests.reference import Record, batch_join, late_in_batches, respects_lateness, within
from tests.strategies import split

PROPERTY = settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def delayed_streams(draw: st.DrawFn, max_delay: int) -> list[Record]:
    """Records with random ts, each arriving up to ``max_delay`` ts units late: order by ts + delay."""
    rows = draw(
        st.lists(
            st.tuples(st.sampled_from("rs"), st.integers(0, 12), st.sampled_from("ab"), st.integers(0, max_delay)),
            min_size=1,
            max_size=12,
        )
    )
    records = [
        (ts + delay, i, Record(rel, f"{rel}{i}", ts, key, f"p{i}")) for i, (rel, ts, key, delay) in enumerate(rows)
    ]
    return [record for _, _, record in sorted(records)]


def land_and_run(pipeline: Pipeline, order: list[Record], data: st.DataObject) -> None:
    """Random ingest splits, a run after each, random batch sizes."""
    for batch in split(data, order, most=3):
        pipeline.land(batch)
        pipeline.run(max_batch_rows=data.draw(st.integers(1, 5)))


@PROPERTY
@given(data=st.data(), lateness=st.integers(0, 4), window=st.one_of(st.none(), st.integers(0, 5)))
def test_when_every_record_respects_the_lateness_bound_gold_is_the_unbounded_join(
    deltars, tmp_path_factory, data, lateness, window
):
    order = data.draw(delayed_streams(lateness))
    assert respects_lateness(order, lateness)
    pipeline = Pipeline(
        deltars, str(tmp_path_factory.mktemp("bound")), Config.of(allowed_lateness=lateness, window=window)
    )
    land_and_run(pipeline, order, data)
    assert pipeline.late_ids() == set()
    assert pipeline.gold_pairs() == Counter(batch_join(order, within(window)))


def only_the_violators_are_late(engine, root: str, data: st.DataObject, lateness: int, window: int | None) -> None:
    order = data.draw(delayed_streams(8))
    pipeline = Pipeline(engine, root, Config.of(allowed_lateness=lateness, window=window))
    land_and_run(pipeline, order, data)
    late = late_in_batches(pipeline.batches(), lateness)
    assert pipeline.late_ids() == {rec.id for rec in late}
    on_time = [rec for rec in order if rec not in late]
    assert pipeline.gold_pairs() == Counter(batch_join(on_time, within(window)))


@PROPERTY
@given(data=st.data(), lateness=st.integers(0, 2), window=st.one_of(st.none(), st.integers(0, 3)))
def test_exactly_the_violators_are_quarantined_and_the_rest_join_exactly(
    deltars, tmp_path_factory, data, lateness, window
):
    only_the_violators_are_late(deltars, str(tmp_path_factory.mktemp("late")), data, lateness, window)


@settings(PROPERTY, max_examples=1)  # ~90 s an example on Delta on Spark
@given(data=st.data(), lateness=st.integers(0, 2), window=st.integers(0, 3))
def test_on_delta_spark_exactly_the_violators_are_quarantined_and_the_rest_join_exactly(
    spark_engine, tmp_path_factory, data, lateness, window
):
    only_the_violators_are_late(spark_engine, str(tmp_path_factory.mktemp("late")), data, lateness, window)


def test_a_late_record_is_kept_with_its_reason_watermark_and_batch(deltars, tmp_path):
    first = [Record("r", "r20", 20, "a"), Record("s", "s1", 1, "a")]
    then = [Record("r", "r14", 14, "a"), Record("r", "r15", 15, "a"), Record("s", "s0", 0, "a")]
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(allowed_lateness={"r": 5}))
    pipeline.land(first)
    pipeline.run()
    pipeline.land(then)
    reports = pipeline.run()
    (late,) = [row.asDict() for row in pipeline.engine.read(pipeline.warehouse.late_arrivals).collect()]
    assert (late["id"], late["ts"], late["relation"], late["watermark"], late["batch_id"]) == ("r14", 14, "r", 15, 2)
    assert late["reason"] == "ts below the watermark of R (newest R ts seen minus allowed lateness 5)"
    assert reports[-1].late == {"r": 1, "s": 0}  # S has no lateness: s0 is never late
    assert "1 late" in RunReport(reports).describe()
    status = warehouse_status(pipeline.engine, pipeline.warehouse, pipeline.config)
    assert (status.late, status.watermarks, status.bounded) == (1, {"r": 15}, False)
    assert "stores keep full history" in status.describe()
    assert pipeline.gold_pairs() == Counter(batch_join([rec for rec in first + then if rec.id != "r14"]))


def steady_stream(per_relation: int, disorder: int, seed: int) -> list[Record]:
    """One record per relation per ts unit over 3 keys, each arriving up to ``disorder`` units late."""
    rng = random.Random(seed)
    records = [Record(rel, f"{rel}{ts}", ts, f"k{rng.randrange(3)}") for ts in range(per_relation) for rel in "rs"]
    arrival = {rec.id: rec.ts + rng.randrange(disorder + 1) for rec in records}
    return sorted(records, key=lambda rec: (arrival[rec.id], rec.order()))


def largest_state(pipeline: Pipeline, records: list[Record], chunk: int) -> dict[str, int]:
    """Stream ``records`` in chunks (ingest, then run) and return each buffer's largest row count."""
    largest: Counter[str] = Counter()
    for start in range(0, len(records), chunk):
        pipeline.land_chunk(records[start : start + chunk])
        pipeline.run(max_batch_rows=chunk)
        for name, count in pipeline.buffer_rows().items():
            largest[name] = max(largest[name], count)
    return dict(largest)


@pytest.mark.parametrize("window", [10, None])
def test_state_stays_bounded_with_a_window_and_grows_without_one(deltars, tmp_path, window):
    lateness, disorder, chunk = 20, 20, 400  # chunk: 200 arrivals per relation, about 200 ts units
    records = steady_stream(1_200, disorder, seed=1)  # 6 chunks: the bound holds after the first
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(allowed_lateness=lateness, window=window))
    largest = largest_state(pipeline, records, chunk)
    assert pipeline.late_ids() == set()
    # Rate 1 record per ts unit per relation: a probe lives while ts >= watermark = newest - lateness, a
    # stored record while ts + window >= the other's watermark; a batch adds up to chunk / 2 + disorder units.
    probe_bound = lateness + disorder + chunk // 2
    assert largest["r_probes_s"] <= probe_bound and largest["s_probes_r"] <= probe_bound
    if window is None:
        assert largest["r_store"] == largest["s_store"] == 1_200  # full history
    else:
        store_bound = lateness + window + disorder + chunk // 2
        assert largest["r_store"] <= store_bound and largest["s_store"] <= store_bound
    assert pipeline.gold_pairs() == Counter(batch_join(records, within(window)))


def test_a_state_table_is_appended_to_while_nothing_leaves_it_and_merged_once_a_cutoff_moves(deltars, tmp_path):
    """A MERGE scans the table for the batch's keys; with no cutoff moving and nothing to mark, the batch's arrivals
    are new ids, so the state write is an append. Once a watermark moves a cutoff, the MERGE evicts."""
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(allowed_lateness=1, window=1))
    pipeline.land([Record("r", "r1", 1, "a"), Record("s", "s1", 1, "a")])
    pipeline.run()
    pipeline.land([Record("r", "r2", 1, "a")])  # R's newest stays 1: no watermark moves
    pipeline.run()
    pipeline.land([Record("r", "r9", 9, "a"), Record("s", "s9", 9, "a")])  # both watermarks move to 8
    pipeline.run()
    operations = [commit["operation"] for commit in reversed(DeltaTable(pipeline.warehouse.state(R)).history())]
    assert operations == ["WRITE", "WRITE", "MERGE"]
    assert pipeline.gold_pairs() == Counter(
        batch_join(
            [
                Record("r", "r1", 1, "a"),
                Record("s", "s1", 1, "a"),
                Record("r", "r2", 1, "a"),
                Record("r", "r9", 9, "a"),
                Record("s", "s9", 9, "a"),
            ],
            within(1),
        )
    )
