"""The as-of join on the pipeline (docs/design.md section 2.9): each left record (R) once, with the latest right
record (S) of its key at or before its time, in the batch whose S watermark makes that match final; the same rows
whatever the arrival order, the batch split or a crash, pandas' ``merge_asof`` of the records not late in the end,
and state holding only what a left record still to come may take."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expectations.audit import audit
from expectations.reconcile import check_gold
from pipelines.commands.status import warehouse_status
from state.config import Config
from state.errors import LakejoinError
from state.event_time import TIMESTAMP
from tests.helpers import Pipeline, copied, crash_at_each
from tests.reference import Pair, Record, advance, late_in_batches, on_time
from tests.reference_final import asof_in_batches, kept_rights
from tests.strategies import split, two_streams
from tests.test_cli import doc_block
from tests.test_final_reference import FAR, merge_asof

PROPERTY = settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
S1, R3, S2, S5, R4 = (
    Record("s", "s1", 1, "k"),
    Record("r", "r3", 3, "k"),
    Record("s", "s2", 2, "k"),
    Record("s", "s5", 5, "k"),
    Record("r", "r4", 4, "k"),
)


def as_of(engine, root, kind: str = "asof", lateness: int = 0, tolerance: int | None = None) -> Pipeline:  # noqa: ANN001 - an engine, a path
    return Pipeline(engine, str(root), Config.of(join=kind, allowed_lateness=lateness, tolerance=tolerance))


def rows(pipeline: Pipeline) -> Counter[Pair]:
    return Counter(Pair(row["_r_id"], row["_s_id"], row["owner"]) for row in pipeline.gold_rows())


def rows_by_batch(pipeline: Pipeline) -> dict[int, set[Pair]]:
    emitted: dict[int, set[Pair]] = {}
    for row in pipeline.gold_rows():
        emitted.setdefault(row["batch_id"], set()).add(Pair(row["_r_id"], row["_s_id"], row["owner"]))
    return emitted


def stored(pipeline: Pipeline, relation: str) -> set[str]:
    table = pipeline.engine.read(pipeline.warehouse.buffers()[f"{relation}_state"])
    return set() if table is None else {row["id"] for row in table.where("_in_store").collect()}


def one_by_one(pipeline: Pipeline, order: list[Record]) -> None:
    for rec in order:
        pipeline.land([rec])
        pipeline.run(max_batch_rows=1)


def test_a_trade_waits_for_the_quotes_watermark_and_takes_a_quote_that_arrived_after_it(engine, tmp_path):
    """On both engines: the quotes' store deletes a superseded quote by its MERGE."""
    pipeline = as_of(engine, tmp_path)
    one_by_one(pipeline, [S1, R3])
    waiting = warehouse_status(engine, pipeline.warehouse, pipeline.config).waiting
    assert waiting == [
        {"relation": "r", "records": 1, "oldest": "3", "until": "S's watermark passes 3"}
    ]  # an s at 3 may come
    one_by_one(pipeline, [S2, S5, R4])
    # S's watermark 5 makes r3 final with s2 (batch 4); r4 arrives final (below 5) and takes s2 too (s5 is after it).
    assert rows_by_batch(pipeline) == {4: {Pair("r3", "s2", "R")}, 5: {Pair("r4", "s2", "R")}}
    assert stored(pipeline, "r") == set()  # r3 left once final, r4 was final on arrival
    assert stored(pipeline, "s") == {"s2", "s5"}  # s1 superseded by s2 below the floor (R's watermark 3)
    assert not any(
        column.endswith("_probes")
        for path in pipeline.warehouse.buffers().values()
        for column in pipeline.engine.read(path).columns
    )  # none kept


def test_several_quotes_in_one_batch_and_an_equal_time_take_the_latest_by_id(deltars, tmp_path):
    pipeline = as_of(deltars, tmp_path)
    quotes = [Record("s", f"s{n}", ts, "k") for n, ts in ((1, 2), (2, 4), (3, 4), (4, 5))]
    pipeline.land([R4, *quotes])
    pipeline.run()
    assert rows(pipeline) == Counter([Pair("r4", "s3", "R")])


def test_with_a_tolerance_the_left_variant_keeps_a_trade_without_a_recent_quote(deltars, tmp_path):
    pipeline = as_of(deltars, tmp_path, "asof_left", tolerance=2)
    pipeline.land([S1, R4, Record("r", "r2", 2, "k"), Record("r", "r9", 9, "z"), Record("s", "s20", 20, "z")])
    pipeline.run()
    assert rows(pipeline) == Counter([Pair("r4", None, "R"), Pair("r2", "s1", "R"), Pair("r9", None, "R")])
    unmatched = next(row for row in pipeline.gold_rows() if row["_r_id"] == "r4")
    assert (unmatched["r_id"], unmatched["s_id"], unmatched["s_ts"]) == ("r4", None, None)
    validated = audit(
        deltars, pipeline.warehouse, pipeline.config, str(tmp_path / "docs")
    )  # every rule and the reconciliation
    assert validated.success, validated.describe()


@PROPERTY
@given(
    data=st.data(),
    recs=two_streams(),
    lateness=st.integers(0, 3),
    window=st.one_of(st.none(), st.integers(0, 2)),
    keep=st.booleans(),
)
def test_any_arrival_order_and_batch_split_gives_merge_asof_of_what_was_not_late_each_trade_once(
    deltars, tmp_path_factory, data, recs, lateness, window, keep
):
    """Batch by batch, gold and the quotes kept are the reference's on the same batches; once both watermarks
    pass everything, gold is pandas' merge_asof of the records not late, the late ones are the watermark model's,
    and validate reconciles."""
    pipeline = as_of(deltars, tmp_path_factory.mktemp("asof"), "asof_left" if keep else "asof", lateness, window)
    for landed in split(data, data.draw(st.permutations(recs)), most=3):
        pipeline.land(landed)
        pipeline.run(max_batch_rows=data.draw(st.integers(1, 6)))
    batches = pipeline.batches()
    expected, _ = asof_in_batches(batches, lateness, window, keep)
    assert rows(pipeline) == Counter(expected)
    assert stored(pipeline, "s") == {rec.id for rec in kept_quotes(batches, lateness, window)}
    pipeline.land([Record("r", "r~", FAR, "~r"), Record("s", "s~", FAR, "~s")])  # keys that match nothing
    pipeline.run()
    late = pipeline.late_ids()
    assert late == {rec.id for rec in late_in_batches(pipeline.batches(), lateness)}
    final = Counter(row for row in rows(pipeline).elements() if row.r_id != "r~")
    assert final == Counter(merge_asof([rec for rec in recs if rec.id not in late], window, keep))
    check = check_gold(deltars, pipeline.warehouse, pipeline.config)
    assert check.passed, check.describe()


def kept_quotes(batches: list[list[Record]], lateness: int, window: int | None) -> list[Record]:
    """The quotes the reference keeps after ``batches``."""
    marks: dict[str, int] = {}
    quotes: list[Record] = []
    for batch in batches:
        arrived = on_time(batch, marks)
        quotes += [rec for rec in arrived if rec.relation == "s"]
        advance(marks, arrived, lateness)
        quotes = kept_rights(quotes, [], marks, window)
    return quotes


def test_an_asof_run_dying_at_each_write_in_turn_resumes_to_the_uninterrupted_result(
    deltars, tmp_path_factory, monkeypatch
):
    """Every crash point of an as-of batch: the plan, each output, the two stores (a MERGE that deletes superseded
    quotes among them), the commit."""
    order = [S1, R3, S2, S5, R4, Record("s", "s6", 6, "k"), Record("r", "r8", 8, "k"), Record("s", "s9", 9, "k")]
    uninterrupted = as_of(deltars, tmp_path_factory.mktemp("uninterrupted"))
    uninterrupted.land(order)
    crashed = copied(uninterrupted, tmp_path_factory.mktemp("crashed"))
    uninterrupted.run(max_batch_rows=2)
    steps = ["gold", "late_arrivals", "r_state", "s_state", "dq_quarantine", "commit"]
    crash_at_each(
        crashed, monkeypatch, [f"{moment}:{step}" for step in steps for moment in ("before", "after")], max_batch_rows=2
    )
    assert crashed.snapshot() == uninterrupted.snapshot()
    assert rows(uninterrupted) == Counter([Pair("r3", "s2", "R"), Pair("r4", "s2", "R"), Pair("r8", "s6", "R")])


def test_state_stays_flat_on_a_long_stream_of_repeating_keys(deltars, tmp_path):
    """Per key, the quotes at or above the floor and the latest below it, and the trades not final yet."""
    stream = [Record(rel, f"{rel}{t:03d}", t, f"k{t % 4}") for t in range(80) for rel in ("r", "s")]
    pipeline = as_of(deltars, tmp_path, lateness=2)
    held = []
    for start in range(0, len(stream), 40):
        pipeline.land_chunk(stream[start : start + 40])
        pipeline.run(max_batch_rows=40)
        held.append(pipeline.state_rows())
    assert max(held) <= 4 + 2 * 3  # a quote per key below the floor, the lateness's worth above it, waiting trades
    assert sum(rows(pipeline).values()) >= 70


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"join": "asof"},
            "config: join: asof emits each r record once no s record at or before its time can still arrive, which takes an 'allowed_lateness' for s: set it (without it that row is never final)",
        ),
        (
            {"join": "asof_left", "relations": dict.fromkeys("abc"), "allowed_lateness": 1},
            "config: join: asof_left joins two relations (the first is left), got 3: a, b, c",
        ),
        (
            {"join": "asof", "allowed_lateness": 1, "window": 5},
            "config: join: asof bounds a match's age with 'tolerance' (no match older than that), not 'window': rename it",
        ),
        (
            {"join": "inner", "tolerance": 5},
            "config: 'tolerance' bounds an as-of join's match (join: asof | asof_left); join: inner takes 'window'",
        ),
        (
            {"join": "asof", "allowed_lateness": 1, "direction": "forward"},
            "config: direction: forward is not built: an as-of join takes the latest right record at or before the left's time (direction: backward)",
        ),
        (
            {"join": "left", "direction": "nearest", "window": 1, "allowed_lateness": 1},
            "config: 'direction' is an as-of join's (join: asof | asof_left), not join: left's: remove it",
        ),
    ],
)
def test_an_asof_join_that_could_never_emit_or_is_misspelt_is_refused_in_one_line(settings, message):
    with pytest.raises(LakejoinError) as refused:
        Config.of(**settings)
    assert str(refused.value) == message


def test_the_docs_asof_config_reads_as_written():
    config = Config.of(**yaml.safe_load(doc_block("docs/joins.md", "**The as-of join**")))
    assert (config.join, config.tolerance, config.direction) == ("asof", timedelta(seconds=5), "backward")
    condition = config.on_axis(TIMESTAMP).join_condition  # microseconds
    assert (
        condition
        == "(trades.symbol = quotes.symbol) AND abs(trades._ts - quotes._ts) <= 5000000 AND quotes._ts <= trades._ts"
    )
