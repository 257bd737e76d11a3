"""What the bundle deploys to tell someone (resources/monitoring.yml, resources/lakejoin.lvdash.json), and the page that
explains it (docs/monitoring.md): every query over lakejoin's tables runs against a warehouse built here (batches
committed, rows quarantined by the landing and by a rule, a late arrival, arrivals ingested after the last batch), the
page shows the SQL the bundle deploys, and the alerts and the dashboard validate against Databricks' models."""

from __future__ import annotations

import json
import os
import re

import pytest
from databricks.bundles.alerts import Alert
from databricks.bundles.dashboards import Dashboard

from state.config import config_from
from state.engines import make_engine
from tests.helpers import REPO, Pipeline
from tests.reference import Record
from tests.test_bundle import defaults, load, resolved

QUERY = re.compile(r"```sql\n-- lakejoin: (?P<name>[^\n]+)\n(?P<sql>.*?)```", re.S)
# The page's tables are the checklist's warehouse and relations (orders, payments); here they are r and s.
RELATIONS = {"orders": "r", "payments": "s"}
MONITORING = os.path.join(REPO, "resources", "monitoring.yml")
THE_PAGES_WAREHOUSE = "main.lakejoin."
ALERTS = {
    "lakejoin_arrivals_waiting": "arrivals waiting",
    "lakejoin_rows_set_aside": "rows set aside",
    "lakejoin_rules_broke": "rules that broke",
    "lakejoin_join_task_failed": "join task failed",
}


def queries() -> dict[str, str]:
    with open(f"{REPO}/docs/monitoring.md", encoding="utf-8") as handle:
        return {match["name"]: match["sql"] for match in QUERY.finditer(handle.read())}


def alerts() -> dict[str, dict]:
    return load(MONITORING)["resources"]["alerts"]


def dashboard() -> dict:
    with open(os.path.join(REPO, "resources", "lakejoin.lvdash.json"), encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def answer(spark, tmp_path_factory):
    """Runs a page's query on the warehouse built here, its tables named as the page names them."""
    config = config_from(
        {"allowed_lateness": 5, "expectations": {"ts_max": 50, "policies": {"bronze_ts_plausible": "quarantine"}}}
    )
    pipeline = Pipeline(make_engine(spark, "delta-rs"), str(tmp_path_factory.mktemp("monitored")), config)
    pipeline.land_chunk(
        [Record("r", "r1", 10, "a"), Record("s", "s1", 12, "a"), Record("s", "s99", 99, "a")]
    )  # s99: after ts_max
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
    return lambda name: [row.asDict() for row in spark.sql(queries()[name].replace(THE_PAGES_WAREHOUSE, "")).collect()]


def test_the_page_shows_each_query_the_bundle_deploys_and_the_tests_run():
    shown = queries()
    assert set(shown) == {
        *ALERTS.values(),
        "freshness",
        "batches per day",
        "rows set aside per day",
        "rules that broke per day",
    }
    for key, alert in alerts().items():
        deployed = (
            alert["query_text"]
            .replace("${var.catalog}.${var.schema}.", THE_PAGES_WAREHOUSE)
            .replace("${resources.jobs.lakejoin_join.id}", "<job id>")
            .replace("${var.workspace_id}", "<workspace id>")
        )
        assert deployed == shown[ALERTS[key]], key
    for dataset in dashboard()["datasets"]:  # the dashboard's datasets run in the warehouse's catalog and schema
        assert "".join(dataset["queryLines"]) == shown[dataset["displayName"]].replace(THE_PAGES_WAREHOUSE, ""), (
            dataset["name"]
        )


def test_the_alerts_and_the_dashboard_validate_and_tell_whom_the_target_names():
    values = defaults(load(os.path.join(REPO, "databricks.yml")))
    for key, alert in alerts().items():
        deployed = Alert.from_dict(resolved(alert, values))
        assert deployed.warehouse_id == values["sql_warehouse_id"], key
        assert [subscription.user_email for subscription in deployed.evaluation.notification.subscriptions] == [
            "data-oncall@example.com"
        ], key
    board = load(MONITORING)["resources"]["dashboards"]["lakejoin"]
    Dashboard.from_dict(resolved(board, values))
    assert os.path.normpath(os.path.join(REPO, "resources", board["file_path"])) == os.path.join(
        REPO, "resources", "lakejoin.lvdash.json"
    )
    widgets = [item["widget"] for page in dashboard()["pages"] for item in page["layout"]]
    assert {query["query"]["datasetName"] for widget in widgets for query in widget["queries"]} == {
        dataset["name"] for dataset in dashboard()["datasets"]
    }


def test_each_widget_shows_columns_its_query_gives(answer):
    names = {dataset["name"]: dataset["displayName"] for dataset in dashboard()["datasets"]}
    for page in dashboard()["pages"]:
        for item in page["layout"]:
            (query,) = item["widget"]["queries"]
            rows = answer(names[query["query"]["datasetName"]])
            assert rows and {field["name"] for field in query["query"]["fields"]} <= set(rows[0]), query["query"][
                "datasetName"
            ]


def fires(alert: dict, rows: list[dict]) -> bool:
    """Whether an alert's evaluation fires on its query's ``rows`` (its column, aggregated, against its threshold)."""
    evaluation = alert["evaluation"]
    if not rows:
        return evaluation.get("empty_result_state", "UNKNOWN") == "TRIGGERED"
    values = [row[evaluation["source"]["name"]] for row in rows]
    value = max(values) if evaluation["source"].get("aggregation") == "MAX" else values[0]
    threshold = float(
        resolved(evaluation["threshold"]["value"]["double_value"], defaults(load(os.path.join(REPO, "databricks.yml"))))
    )
    assert evaluation["comparison_operator"] == "GREATER_THAN"
    return value > threshold


def test_freshness_is_the_last_committed_batch_and_the_minutes_since(answer):
    (row,) = answer("freshness")
    assert row["last_batch_at"] is not None and 0 <= row["minutes_since_last_batch"] <= 5  # the batch just committed


def test_arrivals_waiting_are_those_ingested_after_the_last_batch_and_fire_only_once_they_wait_too_long(answer):
    rows = answer("arrivals waiting")
    assert {row["relation"]: row["waiting"] for row in rows} == {"r": 2}
    assert not fires(alerts()["lakejoin_arrivals_waiting"], rows)  # they just arrived
    assert fires(alerts()["lakejoin_arrivals_waiting"], [{**rows[0], "minutes_waiting": 31}])
    assert not fires(alerts()["lakejoin_arrivals_waiting"], []), "a quiet stream: nothing waits, nothing fires"


def test_rows_set_aside_come_from_each_quarantine_and_fire_the_hours_alert(answer):
    kept = {(row["kept_in"], row["of"]): row["rows"] for row in answer("rows set aside per day")}
    assert kept == {
        ("quarantine_ingest", "r"): 1,
        ("quarantine_expectations", "bronze/s"): 1,
        ("quarantine_late_arrivals", "r"): 1,
    }
    (hour,) = answer("rows set aside")
    assert hour["rows_set_aside"] == 3 and fires(alerts()["lakejoin_rows_set_aside"], [hour])


def test_batches_per_day_count_the_batches_their_arrivals_pairs_and_late_rows(answer):
    (day,) = answer("batches per day")
    assert (day["batches"], day["arrivals"], day["late"]) == (2, 6, 1)
    assert day["pairs"] == 2  # r1 with s1, r2 with s2


def test_rules_that_broke_name_the_rule_its_table_and_rows_and_fire_the_hours_alert(answer):
    broke = [
        (row["rule"], row["table"], row["policy"], row["rows_failed"]) for row in answer("rules that broke per day")
    ]
    assert broke == [("bronze_ts_plausible", "bronze/s", "quarantine", 1)]
    (hour,) = answer("rules that broke")
    assert hour["rows_failed"] == 1 and fires(alerts()["lakejoin_rules_broke"], [hour])


def test_the_join_task_alert_reads_the_scheduled_jobs_join_task_runs_in_this_workspace_only():
    """system.lakeflow holds every workspace's runs of the account in the region, and a job id is unique only within
    one: without the workspace filter another workspace's job of the same id would fire it."""
    text = alerts()["lakejoin_join_task_failed"]["query_text"]
    assert (
        "system.lakeflow.job_task_run_timeline" in text
        and "task_key = 'join'" in text
        and "job_id = '${resources.jobs.lakejoin_join.id}'" in text
        and "workspace_id = '${var.workspace_id}'" in text
    )
