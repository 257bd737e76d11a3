"""The monitoring queries of docs/monitoring.md, each run as the page gives it against a warehouse built here: batches
committed, rows quarantined by the landing and by a rule, a late arrival, and arrivals ingested after the last
batch."""

from __future__ import annotations

import re

import pytest

from state.config import config_from
from state.engines import make_engine
from tests.helpers import REPO, Pipeline
from tests.reference import Record

QUERY = re.compile(r"```sql\n-- lakejoin: (?P<name>[^\n]+)\n(?P<sql>.*?)```", re.S)
# The page's tables are the checklist's warehouse and relations (orders, payments); here they are r and s.
RELATIONS = {"orders": "r", "payments": "s"}


def queries() -> dict[str, str]:
    with open(f"{REPO}/docs/monitoring.md", encoding="utf-8") as handle:
        return {match["name"]: match["sql"] for match in QUERY.finditer(handle.read())}


@pytest.fixture(scope="module")
def answer(spark, tmp_path_factory):
    """Runs a page's query on the warehouse built here, its tables named as the page names them."""
    config = config_from({"allowed_lateness": 5, "expectations": {"ts_max": 50, "policies": {"bronze_ts_plausible": "quarantine"}}})
    pipeline = Pipeline(make_engine(spark, "delta-rs"), str(tmp_path_factory.mktemp("monitored")), config)
    pipeline.land_chunk([Record("r", "r1", 10, "a"), Record("s", "s1", 12, "a"), Record("s", "s99", 99, "a")])  # s99: after ts_max
    pipeline.ingest("r", pipeline.write_file(['{"id": "r2", "ts": 11, "key": "b"}', "not json"]))
    pipeline.run()
    pipeline.land_chunk([Record("r", "r3", 2, "a"), Record("s", "s2", 20, "b")])  # r3 is late: r's watermark is 6
    pipeline.run()
    pipeline.land_chunk([Record("r", "r4", 30, "a"), Record("r", "r5", 31, "b")])  # ingested, not joined
    warehouse = pipeline.warehouse
    views = {f"bronze/{short}": f"bronze_{name}" for name, short in RELATIONS.items()}
    for path in warehouse.tables():
        frame = pipeline.engine.read(path)
        if frame is not None:
            table = warehouse.name_of(path)
            frame.createOrReplaceTempView(views.get(table, "_".join(part.strip("_") for part in table.split("/"))))
    return lambda name: [row.asDict() for row in spark.sql(queries()[name].replace("main.lakejoin.", "")).collect()]


def test_the_page_gives_each_query_the_tests_run():
    assert set(queries()) == {"freshness", "arrivals waiting", "batches per day", "rows set aside per day", "rules that broke per day"}


def test_freshness_is_the_last_committed_batch_and_the_minutes_since(answer):
    (row,) = answer("freshness")
    assert row["last_batch_at"] is not None and 0 <= row["minutes_since_last_batch"] <= 5  # the batch just committed


def test_arrivals_waiting_are_those_ingested_after_the_last_batch(answer):
    waiting = {row["relation"]: row["waiting"] for row in answer("arrivals waiting")}
    assert waiting == {"orders": 2, "payments": 0}


def test_batches_per_day_count_the_batches_their_arrivals_pairs_and_late_rows(answer):
    (day,) = answer("batches per day")
    assert (day["batches"], day["arrivals"], day["late"]) == (2, 6, 1)
    assert day["pairs"] == 2  # r1 with s1, r2 with s2


def test_rows_set_aside_per_day_come_from_each_quarantine(answer):
    kept = {(row["kept_in"], row["of"]): row["rows"] for row in answer("rows set aside per day")}
    assert kept == {("quarantine_ingest", "r"): 1, ("quarantine_expectations", "bronze/s"): 1, ("quarantine_late_arrivals", "r"): 1}


def test_rules_that_broke_per_day_name_the_rule_its_table_and_rows(answer):
    broke = [(row["rule"], row["table"], row["policy"], row["rows_failed"]) for row in answer("rules that broke per day")]
    assert broke == [("bronze_ts_plausible", "bronze/s", "quarantine", 1)]
