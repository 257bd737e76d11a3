"""A warehouse the previous release wrote is read and extended exactly: its gold, state, batch log and pending
arrivals carry on under today's code (tests/fixtures/previous_release.py says how the fixture was made)."""

from __future__ import annotations

import os
import shutil

from pyspark.sql import SparkSession

from pipelines.api import Pipeline
from tests.fixtures.previous_release import CONFIG, JOINED, LATER, PENDING, land

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "previous-release", "warehouse")


def banded_pairs(records: list[tuple[str, str, int, str]]) -> set[tuple[str, str]]:
    """What the config joins: equal key, event times at most the window apart."""
    rs = [record for record in records if record[0] == "r"]
    ss = [record for record in records if record[0] == "s"]
    return {(r[1], s[1]) for r in rs for s in ss if r[3] == s[3] and abs(r[2] - s[2]) <= CONFIG["window"]}


def gold(pipeline: Pipeline) -> list[tuple[str, str, int]]:
    return sorted((row["r_id"], row["s_id"], row["batch_id"]) for row in pipeline.table("gold").collect())


def test_the_previous_releases_warehouse_is_read_and_extended_exactly(spark: SparkSession, tmp_path) -> None:
    shutil.copytree(FIXTURE, tmp_path / "warehouse")
    files = tmp_path / "files"
    files.mkdir()
    with Pipeline(tmp_path / "warehouse", CONFIG, spark=spark) as pipeline:
        before = gold(pipeline)
        assert {(r, s) for r, s, _ in before} == banded_pairs(JOINED)
        assert pipeline.status()["pending"] == {"r": 1, "s": 1}  # PENDING: landed, not joined yet
        land(pipeline, LATER, str(files))
        report = pipeline.run(max_batch_rows=4)
        after = gold(pipeline)
    assert [batch.batch_id for batch in report.batches] == [3, 4]
    assert set(before) <= set(after)  # what the previous release wrote stays as it was
    assert len(after) == len({(r, s) for r, s, _ in after})  # each pair once
    assert {(r, s) for r, s, _ in after} == banded_pairs(JOINED + PENDING + LATER)
    assert report.late == 0
