"""One warehouse, either engine: what delta-rs writes Delta on Spark continues and reads, and the reverse."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from deltalake import DeltaTable, QueryBuilder

from state.engines import make_engine
from tests.helpers import Pipeline
from tests.reference import Record, batch_join


def stream(seed: int) -> list[Record]:
    rng = random.Random(seed)
    return [Record(rel, f"{rel}{i}", rng.randrange(30), f"k{rng.randrange(3)}", f"p{i}") for i in range(10) for rel in "rs"]


@pytest.mark.parametrize("first, then", [("delta-rs", "spark"), ("spark", "delta-rs")])
def test_a_warehouse_started_on_one_engine_and_continued_on_the_other_gives_the_exact_gold(spark, spark_engine, tmp_path, first, then):
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
            counted = QueryBuilder().register("t", DeltaTable(path, version=version)).execute("SELECT count(*) AS n FROM t")
            assert counted.read_all().column("n")[0].as_py() == by_spark, (path, version)
