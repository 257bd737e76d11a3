"""Relations read in place from Delta tables the user already has: incremental by table version, exactly once for
any commit pattern and batch split; change commits refused or skipped; OPTIMIZE followed; vacuumed files named."""

from __future__ import annotations

import os
from collections import Counter
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.config import Config
from state.errors import LakejoinError
from state.relations import S
from tests.helpers import Pipeline

START = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
PREDICATE = "r.customer = s.customer AND s.paid_at BETWEEN r.order_time - INTERVAL 30 MINUTES AND r.order_time + INTERVAL 1 HOUR"


def order(n: int, minute: int, customer: str) -> dict:
    return {"order_id": f"o{n}", "customer": customer, "order_time": START + timedelta(minutes=minute), "amount": 10.5 + n}


def payment(n: int, minute: int, customer: str) -> dict:
    return {"payment_id": f"p{n}", "customer": customer, "paid_at": START + timedelta(minutes=minute), "method": ("card", "cash")[n % 2]}


def expected_gold(orders: list[dict], payments: list[dict]) -> Counter:
    """The batch join in Python: same customer, payment within [-30, +60] minutes of the order; the older record
    owns the pair (an order on a tie)."""
    return Counter(
        (o["order_id"], p["payment_id"], "R" if o["order_time"] <= p["paid_at"] else "S", o["amount"], p["method"])
        for o in orders
        for p in payments
        if o["customer"] == p["customer"] and timedelta(minutes=-30) <= p["paid_at"] - o["order_time"] <= timedelta(minutes=60)
    )


def gold(pipeline: Pipeline) -> Counter:
    return Counter((row["r_order_id"], row["s_payment_id"], row["owner"], row["r_amount"], row["s_method"]) for row in pipeline.gold_rows())


def tables_pipeline(engine, root: str, orders: str | None = None, payments: str | None = None, **settings: object) -> Pipeline:
    """A pipeline whose relations read the tables at ``orders`` and ``payments`` (a relation without one takes files)."""
    relations = {
        "r": {"id": "order_id", "event_time": "order_time", **({"table": orders} if orders else {})},
        "s": {"id": "payment_id", "event_time": "paid_at", **({"table": payments} if payments else {}), **settings},
    }
    return Pipeline(engine, root, Config(relations=relations, predicate=PREDICATE))


def append(table: str, rows: list[dict]) -> None:
    write_deltalake(table, pa.Table.from_pylist(rows), mode="append")


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
    pipeline.run(max_batch_rows=1)

    assert gold(pipeline) == expected_gold(placed[0] + later[0], placed[1] + later[1])
    bronze = deltars.read(pipeline.warehouse.bronze(S))
    assert "method" not in bronze.columns and {"paid_at", "_id", "_source_file", "_source_line", "_source_version"} <= set(bronze.columns)
