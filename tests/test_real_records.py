"""Records shaped like real data: the user's own columns, a TIMESTAMP (or integer) event time, typed values, gold
rows that carry both records — through ingest of JSON Lines, CSV and Parquet, and the silver batches."""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from expectations.reconcile import check_gold
from state.config import Config
from state.errors import LakejoinError
from state.join.relations import R, S
from tests.helpers import Pipeline
from tests.strategies import split

START = datetime(2026, 1, 1, 10, 0, tzinfo=timezone.utc)
RELATIONS = {"r": {"id": "order_id", "event_time": "order_time"}, "s": {"id": "payment_id", "event_time": "paid_at"}}
TYPED_CSV = {
    "r": {**RELATIONS["r"], "columns": {"amount": "double"}},
    "s": {**RELATIONS["s"], "columns": {"amount": "double"}},
}
# Payments from half an hour before an order to an hour after it, by the same customer.
TIME_BAND = "s.paid_at BETWEEN r.order_time - INTERVAL 30 MINUTES AND r.order_time + INTERVAL 1 HOUR"
INTEGER_BAND = "s.paid_at BETWEEN r.order_time - 30 AND r.order_time + 60"
PREDICATES = {
    "timestamp": f"r.customer = s.customer AND {TIME_BAND}",
    "integer": f"r.customer = s.customer AND {INTEGER_BAND}",
}


def order(n: int, minute: int, customer: str) -> dict:
    return {"order_id": f"o{n}", "customer": customer, "order_time": minute, "amount": 10.5 + n}


def payment(n: int, minute: int, customer: str) -> dict:
    return {
        "payment_id": f"p{n}",
        "customer": customer,
        "paid_at": minute,
        "amount": 0.25 + n,
        "method": ("card", "cash")[n % 2],
    }


def reference_gold(orders: list[dict], payments: list[dict]) -> Counter:
    """The batch join, in Python: same customer, payment within [-30, +60] minutes of the order; the older record
    owns the pair (an order on a tie: R ranks before S)."""
    return Counter(
        (o["order_id"], p["payment_id"], "R" if o["order_time"] <= p["paid_at"] else "S", o["amount"], p["method"])
        for o in orders
        for p in payments
        if o["customer"] == p["customer"] and -30 <= p["paid_at"] - o["order_time"] <= 60
    )


def gold(pipeline: Pipeline) -> Counter:
    return Counter(
        (row["r_order_id"], row["s_payment_id"], row["owner"], row["r_amount"], row["s_method"])
        for row in pipeline.gold_rows()
    )


def write(pipeline: Pipeline, rows: list[dict], fmt: str, kind: str) -> str:
    """``rows`` as a file of format ``fmt``, event times (minutes after START) as ISO-8601 text or timestamps for
    ``kind`` timestamp, as integers for ``kind`` integer."""
    timed = [
        {k: (_as_time(v) if k in ("order_time", "paid_at") and kind == "timestamp" else v) for k, v in row.items()}
        for row in rows
    ]
    path = pipeline.write_file([], suffix=f".{fmt}")
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(timed), path)
    elif fmt == "csv":
        columns = list(rows[0])
        text = [",".join(columns)] + [",".join(_csv(row[c]) for c in columns) for row in timed]
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(text) + "\n")
    else:
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(
                json.dumps({k: _csv(v) if isinstance(v, datetime) else v for k, v in row.items()}) + "\n"
                for row in timed
            )
    return path


def _as_time(minute: int) -> datetime:
    return START + timedelta(minutes=minute)


def _csv(value: object) -> str:
    return value.isoformat().replace("+00:00", "Z") if isinstance(value, datetime) else str(value)


records = st.lists(
    st.tuples(st.sampled_from(["r", "s"]), st.integers(0, 150), st.sampled_from(["c1", "c2"])), min_size=2, max_size=10
)


@pytest.mark.parametrize("kind", ["timestamp", "integer"])
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=records, data=st.data())
def test_orders_and_payments_in_any_format_order_and_split_give_the_batch_join(
    deltars, tmp_path_factory, kind, rows, data
):
    orders = [order(n, minute, customer) for n, (side, minute, customer) in enumerate(rows) if side == "r"]
    payments = [payment(n, minute, customer) for n, (side, minute, customer) in enumerate(rows) if side == "s"]
    arrivals = data.draw(st.permutations([("r", row) for row in orders] + [("s", row) for row in payments]))
    config = Config.of(relations=TYPED_CSV, predicate=PREDICATES[kind])
    pipeline = Pipeline(deltars, str(tmp_path_factory.mktemp("orders")), config)
    for batch in split(data, arrivals, most=2):
        for side in ("r", "s"):
            chunk = [row for rel, row in batch if rel == side]
            if chunk:
                pipeline.ingest(
                    side, write(pipeline, chunk, data.draw(st.sampled_from(["jsonl", "csv", "parquet"])), kind)
                )
        pipeline.run(max_batch_rows=data.draw(st.integers(1, 5)))
    assert gold(pipeline) == reference_gold(orders, payments)


def test_gold_carries_every_column_typed_and_prefixed(engine, tmp_path):
    pipeline = Pipeline(engine, str(tmp_path), Config.of(relations=RELATIONS, predicate=PREDICATES["timestamp"]))
    pipeline.ingest("r", write(pipeline, [order(1, 0, "c1")], "jsonl", "timestamp"))
    pipeline.ingest("s", write(pipeline, [payment(2, 5, "c1")], "parquet", "timestamp"))
    pipeline.run()
    (row,) = pipeline.gold_rows()
    assert {k: v for k, v in row.items() if not k.startswith("_") and k != "produced_at"} == {
        "r_order_id": "o1", "r_customer": "c1", "r_order_time": datetime(2026, 1, 1, 10, 0), "r_amount": 11.5,
        "s_payment_id": "p2", "s_customer": "c1", "s_paid_at": datetime(2026, 1, 1, 10, 5), "s_amount": 2.25, "s_method": "card",
        "owner": "R", "batch_id": 1,
    }  # fmt: skip


def test_a_configured_select_is_gold_s_projection(deltars, tmp_path):
    select = ["r.order_id", "s.payment_id", "s.amount - r.amount AS difference"]
    pipeline = Pipeline(
        deltars, str(tmp_path), Config.of(relations=RELATIONS, predicate=PREDICATES["integer"], select=select)
    )
    pipeline.ingest("r", write(pipeline, [order(1, 0, "c1")], "jsonl", "integer"))
    pipeline.ingest("s", write(pipeline, [payment(2, 5, "c1"), payment(3, 500, "c1")], "jsonl", "integer"))
    pipeline.run()
    (row,) = pipeline.gold_rows()
    assert (row["order_id"], row["payment_id"], row["difference"], row["owner"]) == ("o1", "p2", -9.25, "R")
    assert not {"r_customer", "s_method"} & set(row)


@pytest.mark.parametrize(
    "select, message",
    [
        (
            ["r.order_id", "s.amount AS batch_id"],
            "select gives gold a column named 'batch_id', a name lakejoin keeps for itself",
        ),
        (["r.order_id", "s.amount", "r.amount"], "does not resolve .*The column `amount` already exists"),
    ],
)
def test_a_select_whose_names_clash_is_refused_before_any_write(deltars, tmp_path, select, message):
    pipeline = Pipeline(
        deltars, str(tmp_path), Config.of(relations=RELATIONS, predicate=PREDICATES["integer"], select=select)
    )
    pipeline.ingest("r", write(pipeline, [order(1, 0, "c1")], "jsonl", "integer"))
    pipeline.ingest("s", write(pipeline, [payment(2, 5, "c1")], "jsonl", "integer"))
    with pytest.raises(LakejoinError, match=message):
        pipeline.run()
    assert deltars.version(pipeline.warehouse.batches) is None


def test_bronze_gains_a_column_and_gold_gains_it_too(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(relations=RELATIONS, predicate=PREDICATES["integer"]))
    pipeline.ingest("r", write(pipeline, [order(1, 0, "c1")], "jsonl", "integer"))
    pipeline.ingest("s", write(pipeline, [payment(2, 5, "c1")], "jsonl", "integer"))
    pipeline.run()
    pipeline.ingest("s", write(pipeline, [{**payment(3, 6, "c1"), "card_country": "FR"}], "jsonl", "integer"))
    pipeline.run()
    countries = sorted((row["s_payment_id"], row["s_card_country"]) for row in pipeline.gold_rows())
    assert countries == [("p2", None), ("p3", "FR")]


def test_timestamp_lateness_quarantines_late_rows_with_their_watermark_as_a_time_and_bounds_state(deltars, tmp_path):
    config = Config.of(
        relations=RELATIONS, predicate="r.customer = s.customer", allowed_lateness="10 minutes", window="1 hour"
    )
    pipeline = Pipeline(deltars, str(tmp_path), config)
    pipeline.ingest("r", write(pipeline, [order(1, 0, "c1"), order(2, 100, "c1")], "jsonl", "timestamp"))
    pipeline.ingest("s", write(pipeline, [payment(3, 30, "c1"), payment(4, 200, "c1")], "jsonl", "timestamp"))
    pipeline.run()
    pipeline.ingest("r", write(pipeline, [order(5, 80, "c1"), order(6, 195, "c1")], "jsonl", "timestamp"))
    reports = pipeline.run()

    late = [row.asDict() for row in deltars.read(pipeline.warehouse.late_arrivals).collect()]
    assert [(row["order_id"], row["reason"]) for row in late] == [
        (
            "o5",
            "order_time below the watermark of R, 2026-01-01T11:30:00Z (newest R order_time seen minus allowed lateness 10 minutes)",
        )
    ]
    assert late[0]["watermark"] == int((START + timedelta(minutes=90)).timestamp() * 1_000_000)
    # After batch 1, S's watermark is 13:10 (13:20 minus 10 minutes): o1 (10:00) and o2 (11:40) are more than the
    # hour's window before it, so R's store never keeps them. Batch 2 moves R's to 13:05, and s_state evicts p3 (10:30):
    # below S's store cutoff and R's probe buffer's.
    stored = {
        rel.name: sorted(row["_id"] for row in deltars.read(pipeline.warehouse.state(rel)).where("_in_store").collect())
        for rel in (R, S)
    }
    assert stored == {"r": ["o6"], "s": ["p4"]}
    assert reports[-1].evicted.get("s_state") == 1
    assert gold(pipeline) == Counter({("o1", "p3", "R", 11.5, "cash"): 1, ("o6", "p4", "R", 16.5, "card"): 1})


def test_every_kind_of_bad_value_is_quarantined_with_its_reason_while_the_rest_lands(deltars, tmp_path):
    relations = {"r": {"id": ["region", "order_no"], "event_time": "order_time"}, "s": RELATIONS["s"]}
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(relations=relations, predicate="r.customer = s.customer"))
    good = {"region": "eu", "order_no": 1, "customer": "c1", "order_time": "2026-01-01T10:00:00Z", "amount": 1.5}
    pipeline.ingest("r", pipeline.write_file([good]))  # establishes amount as double, order_time as a timestamp
    rows = [
        {**good, "order_no": 2, "amount": "lots"},
        {**good, "order_no": 3, "order_time": "next tuesday"},
        {**good, "order_no": 4, "order_time": None},
        {k: v for k, v in {**good, "order_no": 5}.items() if k != "order_time"},
        {**good, "order_no": None},
        {**good, "order_no": 6, "order_time": "2026-01-01T12:00:00+02:00", "amount": 7},
        {**good, "order_no": 7, "order_time": "2026"},  # Spark would read a bare year as a timestamp
    ]
    result = pipeline.ingest("r", pipeline.write_file(rows))
    reasons = sorted(
        (row["source_line"], row["reason"]) for row in deltars.read(pipeline.warehouse.quarantine).collect()
    )
    assert reasons == [
        (1, "amount is not double: lots"),
        (2, "order_time is not a timestamp: next tuesday"),
        (3, "missing order_time"),
        (4, "missing order_time"),
        (5, "missing order_no"),
        (7, "order_time is not a timestamp: 2026"),
    ]
    assert (result.landed, result.quarantined) == (1, 6)
    landed = deltars.read(pipeline.warehouse.bronze(R)).where("order_no = 6").collect()
    assert [(row["_id"], row["order_time"], row["amount"]) for row in landed] == [
        ('["eu","6"]', datetime(2026, 1, 1, 10, 0), 7.0)
    ]


def test_a_parquet_column_whose_type_cannot_widen_is_refused_before_anything_lands(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(relations=RELATIONS))
    pipeline.ingest("r", write(pipeline, [order(1, 0, "c1")], "parquet", "timestamp"))
    versions = pipeline.versions()
    path = os.path.join(str(tmp_path), "text_amount.parquet")
    pq.write_table(pa.Table.from_pylist([{**order(2, 5, "c1"), "order_time": _as_time(5), "amount": "12"}]), path)
    with pytest.raises(LakejoinError, match=r"column amount is string there but double in bronze/r .* does not widen"):
        pipeline.ingest("r", path)
    assert pipeline.versions() == versions


def test_durations_need_time_and_integers_need_integer_time(deltars, tmp_path):
    with pytest.raises(LakejoinError, match="'window' is a duration \\(1 hour\\) but the event time is an integer"):
        Config.of(window="1 hour").on_axis("integer")
    with pytest.raises(LakejoinError, match="'allowed_lateness' is the integer 600 but the event time is a timestamp"):
        Config.of(allowed_lateness=600).on_axis("timestamp")
    with pytest.raises(LakejoinError, match="'window' must be a non-negative integer .* or a duration"):
        Config.of(window="soon")
    assert Config.of(window="90 seconds", allowed_lateness="2 days").on_axis("timestamp").window == 90_000_000
    assert Config.of(allowed_lateness="2 days").on_axis("date").lateness("r") == 2


def test_date_event_time_takes_a_window_in_days(deltars, tmp_path):
    relations = {
        "r": {"id": "order_id", "event_time": "day"},
        "s": {"id": "payment_id", "event_time": "day", "columns": {"day": "date"}},
    }
    pipeline = Pipeline(
        deltars, str(tmp_path), Config.of(relations=relations, predicate="r.customer = s.customer", window="1 day")
    )
    path = os.path.join(str(tmp_path), "orders.parquet")
    pq.write_table(pa.Table.from_pylist([{"order_id": "o1", "customer": "c1", "day": date(2026, 1, 1)},
                                         {"order_id": "o2", "customer": "c1", "day": date(2026, 1, 5)}]), path)  # fmt: skip
    pipeline.ingest("r", path)
    late_evening = {
        "payment_id": "p2",
        "customer": "c1",
        "day": "2026-01-02T23:30:00+05:00",
    }  # not a date: not cut to one
    pipeline.ingest(
        "s", pipeline.write_file([{"payment_id": "p1", "customer": "c1", "day": "2026-01-02"}, late_evening])
    )
    assert [row["reason"] for row in deltars.read(pipeline.warehouse.quarantine).collect()] == [
        "day is not a date: 2026-01-02T23:30:00+05:00"
    ]
    pipeline.run()
    assert [(row["r_order_id"], row["s_payment_id"], row["s_day"], row["owner"]) for row in pipeline.gold_rows()] == [
        ("o1", "p1", date(2026, 1, 2), "R")
    ]


def test_gold_whose_records_hold_maps_reconciles_with_the_batch_join(deltars, tmp_path):
    """Spark compares no maps in set operations: the reconciliation compares each map as its sorted entries."""
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(relations=RELATIONS, predicate=PREDICATES["integer"]))
    tagged = [{**order(1, 0, "c1"), "labels": [("b", 2), ("a", 1)]}, {**order(2, 10, "c1"), "labels": [("x", 9)]}]
    path = pipeline.write_file([], suffix=".parquet")
    pq.write_table(
        pa.Table.from_pylist(
            tagged,
            pa.schema(
                [*pa.Table.from_pylist([order(1, 0, "c1")]).schema, ("labels", pa.map_(pa.string(), pa.int64()))]
            ),
        ),
        path,
    )
    pipeline.ingest("r", path)
    pipeline.ingest("s", write(pipeline, [payment(3, 5, "c1")], "parquet", "integer"))
    pipeline.run()
    found = check_gold(deltars, pipeline.warehouse, pipeline.config)
    assert found.passed and found.expected == 2, found.describe()
