"""What a Databricks deployment relies on, run here: Unity Catalog names, landing-folder ingest, maintenance."""

from __future__ import annotations

import json
import os
import re
from collections import Counter

import pytest

from pipelines.api import _path_of
from pipelines.bronze.ingest import ingest_landing
from pipelines.bronze.landing import default_checkpoint, listed
from pipelines.commands.maintain import maintain
from state.config import config_from
from state.errors import LakejoinError
from state.join.relations import R
from state.layout import Warehouse, is_table_name
from state.log.checks import require_engine_for
from state.log.lock import is_local
from tests.conftest import require_spark_delta
from tests.helpers import Pipeline
from tests.reference import Record, batch_join

RECORDS = [Record("r", "r1", 1, "a"), Record("s", "s1", 2, "a"), Record("r", "r2", 3, "a"), Record("s", "s2", 4, "b")]


def test_a_catalog_schema_warehouse_names_one_table_per_layer_and_role():
    warehouse = Warehouse("main.lakejoin")
    assert warehouse.in_catalog and not is_local(warehouse.root)
    names = [warehouse.name_of(table) for table in warehouse.tables()]
    assert names[:3] == ["bronze_r", "bronze_s", "bronze_ingests"]
    assert warehouse.gold == "main.lakejoin.gold_join_results" and is_table_name(warehouse.gold)
    assert len(set(names)) == len(names) and all(name.isidentifier() for name in names)
    assert warehouse.app_id("lakejoin", warehouse.state(R)) == "lakejoin:silver_r_state"


@pytest.mark.parametrize("root", ["main.lakejoin", "/tmp/wh"])
def test_show_and_table_take_a_table_by_its_folder_name_in_a_catalog_too(root):
    warehouse = Warehouse(root)
    assert _path_of(warehouse, "bronze/_ingests") == warehouse.ingest_log
    assert _path_of(warehouse, "silver/r_state") == warehouse.state(R)
    assert _path_of(warehouse, "gold") == warehouse.gold
    with pytest.raises(LakejoinError, match="no table 'silver/nothing'.*use one of gold, "):
        _path_of(warehouse, "silver/nothing")


def records_file(path, records, *more_lines: str) -> str:
    path.write_text(
        "".join(json.dumps({"id": rec.id, "ts": rec.ts, "key": rec.key}) + "\n" for rec in records)
        + "".join(line + "\n" for line in more_lines)
    )
    return str(path)


MEDALLION = {
    "layers": {"bronze": "main.raw", "silver": "main.silver", "gold": "main.analytics"},
    "gold_table": "orders_payments",
}


def test_each_layer_may_live_in_a_schema_of_its_own_its_tables_named_without_the_layer():
    warehouse = config_from(MEDALLION).placed(Warehouse("main.lakejoin"))
    assert (warehouse.bronze(R), warehouse.ingest_log) == ("main.raw.r", "main.raw.ingests")
    assert (warehouse.state(R), warehouse.batches) == ("main.silver.r_state", "main.silver.batches")
    assert (warehouse.gold, warehouse.gold_changes) == ("main.analytics.orders_payments", "main.analytics.changes")
    assert warehouse.quarantine == "main.lakejoin.quarantine_ingest"  # a layer not placed stays at the warehouse
    assert warehouse.definition == "main.lakejoin.silver_definition"  # found before the layers are known
    # What the batch log, the checks and the application transactions call a table does not depend on where it is.
    assert (
        warehouse.name_of(warehouse.state(R)) == "silver_r_state"
        and warehouse.app_id("lakejoin", warehouse.gold) == "lakejoin:gold_orders_payments"
    )
    assert (
        _path_of(warehouse, "silver/r_state") == "main.silver.r_state" and _path_of(warehouse, "gold") == warehouse.gold
    )


def test_a_layer_may_live_in_a_folder_of_its_own():
    warehouse = config_from({"layers": {"gold": "/lake/gold", "silver": "main.silver"}}).placed(Warehouse("/lake/wh"))
    assert (warehouse.gold, warehouse.state(R), warehouse.bronze(R)) == (
        "/lake/gold/join_results",
        "main.silver.r_state",
        "/lake/wh/bronze/r",
    )
    assert warehouse.name_of(warehouse.gold) == "gold/join_results"


def test_delta_rs_refuses_a_layer_in_a_catalog_schema_naming_it(deltars):
    warehouse = config_from({"layers": {"silver": "main.silver"}}).placed(Warehouse("/lake/wh"))
    with pytest.raises(LakejoinError, match="^main.silver is a Unity Catalog schema: its tables need Delta on Spark"):
        require_engine_for(warehouse, deltars)


@pytest.mark.parametrize(
    "settings, error",
    [
        (
            {"layers": {"platinum": "main.x"}},
            "'layers' must map some of bronze, silver, gold, quarantine to a folder or a catalog schema",
        ),
        ({"layers": {"gold": " "}}, "'layers.gold' must be a folder or a catalog schema"),
        ({"gold_table": "gold.results"}, "'gold_table' must be a name of letters, digits and _"),
    ],
)
def test_a_bad_layer_or_gold_name_is_refused_in_one_line(settings, error):
    with pytest.raises(LakejoinError, match=re.escape(error)):
        config_from(settings)


def test_two_tables_at_one_place_are_refused_before_anything_is_written():
    with pytest.raises(
        LakejoinError,
        match=re.escape(
            "two tables would be at main.x.changes: give those layers places of their own, or gold another name"
        ),
    ):
        config_from({"layers": {"gold": "main.x"}, "gold_table": "changes"}).placed(Warehouse("main.lakejoin"))


def test_a_run_finds_the_layers_in_the_recorded_definition_and_a_config_that_moves_one_is_refused(deltars, tmp_path):
    from pipelines.api import Pipeline as Api

    placed = {
        "layers": {"silver": str(tmp_path / "silver"), "gold": str(tmp_path / "gold")},
        "gold_table": "pairs",
        "engine": "delta-rs",
    }
    files = [records_file(tmp_path / f"{rec.id}.jsonl", [rec]) for rec in RECORDS[:2]]
    Api(tmp_path / "wh", placed).ingest("r", files[0])
    Api(tmp_path / "wh").ingest("s", files[1])  # the recorded definition places the tables
    assert Api(tmp_path / "wh").run().pairs == 1
    assert (
        deltars.count(str(tmp_path / "gold" / "pairs")) == 1
        and deltars.version(str(tmp_path / "silver" / "batches")) is not None
    )
    assert {name for name in os.listdir(tmp_path / "wh") if not name.startswith("_lakejoin_")} <= {
        "bronze",
        "quarantine",
        "silver",
    }
    assert os.listdir(tmp_path / "wh" / "silver") == ["definition"] and "gold" not in os.listdir(tmp_path / "wh")
    with pytest.raises(
        LakejoinError, match=re.escape("config changes layers.gold from ") + ".*lakejoin does not move them: keep"
    ):
        Api(tmp_path / "wh", placed | {"layers": {**placed["layers"], "gold": str(tmp_path / "elsewhere")}}).run()
    with pytest.raises(LakejoinError, match='config changes gold_table from "pairs" to "join_results"'):
        Api(tmp_path / "wh", {**placed, "gold_table": "join_results"}).run()


@pytest.mark.spark_delta
def test_layers_in_a_local_catalog_of_several_schemas_join_as_one_warehouse(spark, tmp_path):
    from pipelines.api import Pipeline as Api

    require_spark_delta(spark)

    def tables(schema: str) -> set[str]:  # the schema's own: other tests' temporary views are listed too
        return {row.tableName for row in spark.sql(f"SHOW TABLES IN {schema}").collect() if not row.isTemporary}

    schemas = {"home": "lj_home", "bronze": "lj_bronze", "silver": "lj_silver", "gold": "lj_gold"}
    for schema in schemas.values():
        spark.sql(f"CREATE SCHEMA {schema} LOCATION '{tmp_path / schema}'")
    try:
        layers = {layer: f"spark_catalog.{schema}" for layer, schema in schemas.items() if layer != "home"}
        config = {"layers": layers, "gold_table": "pairs", "engine": "spark"}
        pipeline = Api(f"spark_catalog.{schemas['home']}", config, spark=spark)
        for name in ("r", "s"):  # a malformed line each: set aside in the quarantine layer, left at the warehouse
            pipeline.ingest(
                name,
                records_file(tmp_path / f"{name}.jsonl", [rec for rec in RECORDS if rec.relation == name], "{not json"),
            )
        assert pipeline.run().pairs == 2
        assert sorted(
            (row["r_id"], row["s_id"]) for row in spark.table("spark_catalog.lj_gold.pairs").collect()
        ) == sorted((pair.r_id, pair.s_id) for pair in batch_join(RECORDS))
        assert tables("lj_silver") >= {"r_state", "s_state", "batches"}
        assert tables("lj_home") == {"silver_definition", "silver_leases", "quarantine_ingest"}
        assert {table["name"] for table in pipeline.status()["tables"]} >= {"bronze_r", "silver_batches", "gold_pairs"}
        assert pipeline.table("gold").count() == 2
        assert "silver_batches" in pipeline.reset() and not spark.catalog.tableExists("spark_catalog.lj_gold.pairs")
        assert spark.catalog.tableExists("spark_catalog.lj_bronze.r")
    finally:
        for schema in schemas.values():
            spark.sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize("root", ["/tmp/wh", "./main.lakejoin", "s3://bucket/wh", "/Volumes/main/lakejoin/wh"])
def test_paths_stay_paths(root):
    warehouse = Warehouse(root)
    assert not warehouse.in_catalog and not is_table_name(warehouse.gold)
    assert warehouse.name_of(warehouse.gold) == "gold/join_results"


def test_delta_rs_refuses_a_catalog_warehouse_with_one_line(deltars):
    with pytest.raises(LakejoinError, match="Unity Catalog schema: its tables need Delta on Spark") as error:
        require_engine_for(Warehouse("main.lakejoin"), deltars)
    assert "\n" not in str(error.value)
    require_engine_for(Warehouse("/tmp/wh"), deltars)


def test_landing_ingest_takes_every_new_file_once_in_name_order(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    landing = tmp_path / "landing"
    (landing / "2026" / "_tmp").mkdir(parents=True)
    for name, rec in (("b.jsonl", RECORDS[2]), ("a.jsonl", RECORDS[0]), ("2026/c.jsonl", Record("r", "r3", 5, "b"))):
        (landing / name).write_text(f'{{"id": "{rec.id}", "ts": {rec.ts}, "key": "{rec.key}"}}\n')
    (landing / "2026" / "_tmp" / "partial.jsonl").write_text("{")
    (landing / "notes.txt").write_text("not data")
    assert [os.path.relpath(path, landing) for path in listed(str(landing))] == ["2026/c.jsonl", "a.jsonl", "b.jsonl"]
    results = []
    ingest_landing(deltars, pipeline.warehouse, R, str(landing), None, results.append)
    assert [result.landed for result in results] == [1, 1, 1]
    again = []
    ingest_landing(deltars, pipeline.warehouse, R, str(landing), None, again.append)
    assert sum(result.landed for result in again) == 0


def landing_config(tmp_path, **landings: str) -> str:
    """A config whose relations r and s land their files in the folders given, written beside the warehouse."""
    relations = {name: {"landing": folder} for name, folder in landings.items()}
    path = tmp_path / "pipeline.yml"
    path.write_text(json.dumps({"relations": {"r": {}, "s": {}} | relations, "engine": "delta-rs"}))  # JSON is YAML
    return str(path)


def test_run_ingests_every_landing_folder_of_the_config_and_a_refused_file_exits_2_once(spark, tmp_path, capsys):
    from pipelines.cli import main

    folders = {name: tmp_path / "landing" / name for name in ("r", "s")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    (folders["r"] / "a.jsonl").write_text('{"id": "r1", "ts": 1, "key": "a"}\n')
    (folders["s"] / "a.jsonl").write_text('{"id": "s1", "ts": 2, "key": "a"}\n')
    (folders["s"] / "b.parquet").write_text("not parquet")
    run = [
        "run",
        "--warehouse",
        str(tmp_path / "wh"),
        "--config",
        landing_config(tmp_path, r=str(folders["r"]), s=str(folders["s"])),
    ]
    assert main(run) == 2
    out, err = capsys.readouterr()
    assert "1 pairs" in out.splitlines()[-1]
    assert (
        err.count("\n") == 1 and err.startswith("lakejoin: error: ") and "b.parquet" in err and "not tried again" in err
    )
    moved = tmp_path / "landing" / "r2"
    moved.mkdir()
    (moved / "c.jsonl").write_text('{"id": "r2", "ts": 3, "key": "a"}\n')
    run[-1] = landing_config(tmp_path, r=str(moved), s=str(folders["s"]))  # a landing folder changes freely
    assert main(run) == 0
    out, err = capsys.readouterr()
    assert "b.parquet" not in out and err == "" and "1 batches: 1 arrivals, 1 pairs" in out


def test_a_landing_folder_that_is_not_there_is_refused_in_one_line_before_anything_is_written(spark, tmp_path, capsys):
    from pipelines.cli import main

    (tmp_path / "r").mkdir()
    warehouse = tmp_path / "wh"
    run = [
        "run",
        "--warehouse",
        str(warehouse),
        "--config",
        landing_config(tmp_path, r=str(tmp_path / "r"), s=str(tmp_path / "typo")),
    ]
    assert main(run) == 2
    assert capsys.readouterr().err == (
        f"lakejoin: error: s's landing folder {tmp_path / 'typo'} does not exist: create it, or correct the path "
        "(config relations.s.landing, or --landing)\n"
    )
    assert not (warehouse / "silver").exists() and not (warehouse / "bronze").exists()


def test_auto_loader_keeps_one_checkpoint_per_warehouse_in_the_landing_folder():
    dev, prod = (
        default_checkpoint("/Volumes/main/lakejoin/landing/r", Warehouse(root), R)
        for root in ("main.lakejoin_dev", "main.lakejoin")
    )
    assert dev == "/Volumes/main/lakejoin/landing/r/_lakejoin_checkpoint/main.lakejoin_dev/r"
    assert prod == "/Volumes/main/lakejoin/landing/r/_lakejoin_checkpoint/main.lakejoin/r"


@pytest.mark.parametrize(
    "relation, error",
    [
        ({"landing": ""}, "relations.r.landing must be a folder's path"),
        ({"landing": ["/a"]}, "relations.r.landing must be a folder's path"),
        (
            {"landing": "/a", "table": "/t"},
            "relations.r reads table /t in place and takes no files: remove its landing or its table",
        ),
    ],
)
def test_a_bad_landing_setting_is_refused_in_one_line(relation, error):
    with pytest.raises(LakejoinError, match=re.escape(error)):
        config_from({"relations": {"r": relation, "s": {}}}, "config")


def test_maintenance_compacts_every_table_and_the_next_run_joins_as_before(engine, tmp_path):
    pipeline = Pipeline(engine, str(tmp_path))
    pipeline.land(RECORDS[:3])
    pipeline.run(max_batch_rows=1)  # s1 and r2 each add pairs: two gold files
    gold_version = engine.version(pipeline.warehouse.gold)
    assert len(engine.read(pipeline.warehouse.gold).inputFiles()) == 2
    maintained = maintain(engine, pipeline.warehouse)
    assert {"bronze/r", "silver/batches", "gold/join_results"} <= set(maintained)
    assert len(engine.read(pipeline.warehouse.gold).inputFiles()) == 1
    assert (
        engine.version(pipeline.warehouse.gold) > gold_version
    )  # OPTIMIZE (Delta on Spark also logs VACUUM start and end)
    pipeline.land(RECORDS[3:])
    pipeline.run()
    assert pipeline.gold_pairs() == Counter(batch_join(RECORDS))
    with pytest.raises(LakejoinError, match="use at least 168"):
        maintain(engine, pipeline.warehouse, retention_hours=1)
