"""One warehouse, either engine: what delta-rs writes Delta on Spark continues and reads, and the reverse."""

from __future__ import annotations

import json
import random
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from state.engines import Commit, make_engine
from state.engines.base import marker
from tests.helpers import Pipeline
from tests.reference import Record, batch_join


def stream(seed: int) -> list[Record]:
    rng = random.Random(seed)
    return [
        Record(rel, f"{rel}{i}", rng.randrange(30), f"k{rng.randrange(3)}", f"p{i}") for i in range(10) for rel in "rs"
    ]


@pytest.mark.parametrize("first, then", [("delta-rs", "spark"), ("spark", "delta-rs")])
def test_a_warehouse_started_on_one_engine_and_continued_on_the_other_gives_the_exact_gold(
    spark, spark_engine, tmp_path, first, then
):
    records = stream(seed=len(first))
    started = Pipeline(make_engine(spark, first), str(tmp_path))
    started.land_chunk(records[:10])
    started.run(max_batch_rows=4)
    continued = Pipeline(make_engine(spark, then), str(tmp_path))
    continued.land_chunk(records[10:])
    continued.run(max_batch_rows=4)
    assert continued.gold_pairs() == Counter(batch_join(records))
    assert continued.snapshot() == started.snapshot()  # both engines read every table alike

    for path in continued.warehouse.tables():  # each table, written by both engines, through both readers
        latest = spark_engine.version(path)
        if latest is None:
            continue
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
        assert sorted(row.version for row in history) == list(range(latest + 1))
        for version in (0, latest):  # time travel gives both the same rows
            by_spark = spark.read.format("delta").option("versionAsOf", version).load(path).count()
            counted = (
                QueryBuilder().register("t", DeltaTable(path, version=version)).execute("SELECT count(*) AS n FROM t")
            )
            assert counted.read_all().column("n")[0].as_py() == by_spark, (path, version)


def test_each_engine_finds_the_app_transactions_the_other_recorded_and_spark_pays_delta_s_check_once(
    spark, spark_engine, deltars, tmp_path
):
    """Delta on Spark records a write as a marker in its commit's userMetadata, with Delta's own app transaction only
    on a table's first write (Delta checks one by reconstructing the table's state); delta-rs writes both. Either
    engine's txn_version is the newest record, whoever wrote it."""
    path, app = str(tmp_path / "t"), "lakejoin:t"
    rows = pa.table({"id": ["a"]})
    for batch in (1, 2, 3):
        spark_engine.append(path, rows, commit=Commit(app, batch))
    assert spark_engine.append(path, rows, commit=Commit(app, 3)) is None  # recorded: skipped
    commits = [
        [json.loads(line) for line in (tmp_path / "t" / "_delta_log" / f"{v:020d}.json").read_text().splitlines()]
        for v in range(3)
    ]
    assert [sum("txn" in action for action in commit) for commit in commits] == [1, 0, 0]
    assert [next(a["commitInfo"]["userMetadata"] for a in commit if "commitInfo" in a) for commit in commits] == [
        marker(Commit(app, b)) for b in (1, 2, 3)
    ]
    assert deltars.txn_version(path, app) == spark_engine.txn_version(path, app) == 3
    assert deltars.append(path, rows, commit=Commit(app, 3)) is None
    deltars.append(path, rows, commit=Commit(app, 4))
    assert spark_engine.txn_version(path, app) == deltars.txn_version(path, app) == 4
    assert spark_engine.append(path, rows, commit=Commit(app, 4)) is None
    assert (
        deltars.txn_version(path, "lakejoin:other") is None and spark_engine.txn_version(path, "lakejoin:other") is None
    )
