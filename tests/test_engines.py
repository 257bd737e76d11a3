"""The contract every Delta engine honours (state/engines/base.py), run against each engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from benchmarks.costs import counted
from pipelines.bronze.sources import APPEND, SourceCommit
from pipelines.spark import DELTA_JARS, delta_jars
from state.engines import Commit, Eviction, Memberships, Merged, OnMatch, make_engine
from state.engines.base import Aligned, Recorded, applied
from state.engines.delta_log import Listed, greatest_after
from state.engines.jvm import JvmLog
from state.engines.public_log import PublicLog
from state.engines.spark_delta import SparkDeltaEngine
from state.faults import CRASH_AT, InjectedCrash
from tests.conftest import SPARK_DELTA_SKIP, require_spark_delta
from tests.helpers import REPO


@pytest.fixture(
    params=[
        "delta-rs",
        pytest.param("spark", marks=pytest.mark.spark_delta),
        pytest.param("spark-public-log", marks=pytest.mark.spark_delta),
    ]
)
def engine(request: pytest.FixtureRequest, spark):
    """Each engine in turn, and ``spark-public-log``: Delta on Spark reading the log as it does on Databricks and as a
    Spark Connect client (SQL and reads by name, no JVM), here in a classic session."""
    if request.param == "delta-rs":
        return make_engine(spark, request.param)
    require_spark_delta(spark)
    return make_engine(spark, "spark") if request.param == "spark" else SparkDeltaEngine(spark, PublicLog(spark))


def frame(spark, rows):
    return spark.createDataFrame(rows, "id string, ts bigint")


def test_a_missing_table_has_no_version_and_reads_as_none(engine, tmp_path):
    path = str(tmp_path / "t")
    assert engine.version(path) is None
    assert engine.read(path) is None
    assert engine.max_value(path, "ts") is None
    assert engine.schema(path) is None
    assert engine.txn_version(path, "app") is None
    assert not applied(engine, path, Commit("app", 1))
    engine.drop(path)


def test_append_creates_then_adds_and_reads_back(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    assert engine.append(path, frame(spark, [("a", 1), ("b", 2)])) == 2
    assert engine.append(path, pa.table({"id": ["c"], "ts": pa.array([3], pa.int64())})) == 1
    assert_df_equality(
        engine.read(path), frame(spark, [("a", 1), ("b", 2), ("c", 3)]), ignore_row_order=True, ignore_nullable=True
    )
    assert engine.max_value(path, "ts") == 3


def test_an_engine_sees_what_another_commits_and_a_table_it_drops_and_creates_again(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.append(path, frame(spark, [("a", 1)]))
    assert engine.version(path) == 0
    type(engine)(spark).append(path, frame(spark, [("b", 2)]))  # another process's engine
    assert engine.version(path) == 1 and engine.max_value(path, "ts") == 2
    engine.drop(path)
    engine.append(path, frame(spark, [("c", 3)]))
    assert engine.version(path) == 0
    assert [row.id for row in engine.read(path).collect()] == ["c"]


def test_append_adds_new_columns(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.append(path, frame(spark, [("a", 1)]))
    engine.append(path, spark.createDataFrame([("b", 2, "eu")], "id string, ts bigint, region string"))
    assert engine.schema(path).fieldNames() == ["id", "ts", "region"]
    rows = sorted(engine.read(path).collect())
    assert [(row.id, row.region) for row in rows] == [("a", None), ("b", "eu")]


def test_a_write_whose_transaction_the_table_records_is_skipped(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    assert engine.append(path, frame(spark, [("a", 1)]), commit=Commit("pipe:t", 1)) == 1
    version = engine.version(path)
    assert engine.txn_version(path, "pipe:t") == 1 and engine.txn_version(path, "other-app") is None
    assert applied(engine, path, Commit("pipe:t", 1)) and not applied(engine, path, Commit("pipe:t", 2))
    assert engine.append(path, frame(spark, [("a", 1)]), commit=Commit("pipe:t", 1)) is None
    assert engine.merge(path, frame(spark, [("z", 9)]), key="id", commit=Commit("pipe:t", 1)) is None
    assert engine.version(path) == version
    assert engine.append(path, frame(spark, [("b", 2)]), commit=Commit("other-app", 1)) == 1


def test_an_append_of_no_rows_still_records_its_transaction(engine, spark, tmp_path):
    """Gold is written every batch, rows or none, and the consistency check holds it to that record."""
    path = str(tmp_path / "t")
    engine.append(path, frame(spark, [("a", 1)]), commit=Commit("pipe:t", 1))
    assert (
        engine.append(
            path,
            pa.table({"id": pa.array([], pa.string()), "ts": pa.array([], pa.int64())}),
            commit=Commit("pipe:t", 2),
        )
        == 0
    )
    assert engine.txn_version(path, "pipe:t") == 2
    assert engine.append(path, frame(spark, []), commit=Commit("pipe:t", 3)) == 0
    assert engine.txn_version(path, "pipe:t") == 3
    assert engine.append(path, frame(spark, []), commit=Commit("pipe:t", 3)) is None
    assert engine.read(path).count() == 1


def test_applying_changes_that_change_no_row_still_records_its_transaction(engine, spark, tmp_path):
    """A change feed's gold MERGE that changes nothing (a delete of a row gold does not hold) commits nothing by
    itself: the table records the batch all the same, and a replay is skipped."""
    path = str(tmp_path / "t")
    rows = spark.createDataFrame([("a", 1, 1)], "id string, ts bigint, batch_id bigint")
    engine.append(path, rows, commit=Commit("pipe:t", 1))
    retraction = spark.createDataFrame([("z", 9, None)], "id string, ts bigint, batch_id bigint")
    assert (
        engine.apply_changes(
            path, retraction, keys=["id"], retraction="source.batch_id IS NULL", commit=Commit("pipe:t", 2)
        )
        == 0
    )
    assert engine.txn_version(path, "pipe:t") == 2
    assert (
        engine.apply_changes(
            path, retraction, keys=["id"], retraction="source.batch_id IS NULL", commit=Commit("pipe:t", 2)
        )
        is None
    )
    assert (
        engine.apply_changes(
            path,
            spark.createDataFrame([("a", 1, None)], "id string, ts bigint, batch_id bigint"),
            keys=["id"],
            retraction="source.batch_id IS NULL",
            commit=Commit("pipe:t", 3),
        )
        == 1
    )
    assert engine.read(path).count() == 0 and engine.txn_version(path, "pipe:t") == 3


@pytest.mark.spark_delta
def test_where_settings_are_refused_a_merge_is_marked_just_before_it_and_run_again_only_if_it_did_not_commit(
    spark, tmp_path, monkeypatch
):
    """Databricks serverless lets no MERGE carry a marker: it goes in a commit of no rows before the MERGE, and the
    write is done once a MERGE follows that commit (a resumed batch finds out which, here in a classic session)."""
    require_spark_delta(spark)
    restricted, path = SparkDeltaEngine(spark, restricted=True), str(tmp_path / "t")

    def operations() -> list[str]:
        return [row.operation for row in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()]

    restricted.append(path, frame(spark, [("a", 1)]), commit=Commit("pipe:t", 1))
    assert restricted.merge(path, frame(spark, [("b", 2)]), key="id", commit=Commit("pipe:t", 2, "plan 2")) == Merged(
        1, 0
    )
    assert restricted.info(path, "pipe:t").recorded == Recorded(2, True, "plan 2", before_merge=True)
    assert restricted.merge(path, frame(spark, [("b", 2)]), key="id", commit=Commit("pipe:t", 2, "plan 2")) is None
    monkeypatch.setenv(CRASH_AT, f"marked:{path}")
    with pytest.raises(InjectedCrash):
        restricted.merge(path, frame(spark, [("c", 3)]), key="id", commit=Commit("pipe:t", 3))
    monkeypatch.delenv(CRASH_AT)
    assert operations() == ["WRITE", "WRITE", "MERGE", "WRITE"]
    assert restricted.merge(path, frame(spark, [("c", 3)]), key="id", commit=Commit("pipe:t", 3)) == Merged(1, 0)
    assert (
        make_engine(spark, "spark").merge(path, frame(spark, [("c", 3)]), key="id", commit=Commit("pipe:t", 3)) is None
    )  # a classic session reads it alike
    assert operations() == ["WRITE", "WRITE", "MERGE", "WRITE", "MERGE"]
    assert sorted(row.id for row in restricted.read(path).collect()) == ["a", "b", "c"]
    assert spark.sql(f"SHOW TBLPROPERTIES delta.`{path}` ('delta.enableDeletionVectors')").first().value == "false"


def test_merge_inserts_only_unseen_keys_and_is_idempotent(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    assert engine.merge(path, frame(spark, [("a", 1), ("b", 2)]), key="id", commit=Commit("pipe:t", 1)) == Merged(2, 0)
    assert engine.merge(path, frame(spark, [("b", 2), ("c", 3)]), key="id", commit=Commit("pipe:t", 2)) == Merged(1, 0)
    assert engine.merge(path, frame(spark, [("b", 2), ("c", 3)]), key="id", commit=Commit("pipe:t", 2)) is None
    assert sorted(row.id for row in engine.read(path).collect()) == ["a", "b", "c"]


def test_an_aligned_merge_finds_every_match_within_the_source_range_and_still_evicts(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.merge(path, stored(["a", "b", "c"], [1, 5, 9]), key="id")
    rows = stored(["b", "c", "d"], [5, 9, 7])
    assert engine.merge(path, rows, key="id", aligned=Aligned("ts", 5, 9)) == Merged(
        1, 0
    )  # b and c matched inside ts 5..9
    assert engine.merge(path, rows, key="id", aligned=Aligned("ts", 5, 9)) == Merged(0, 0)
    late = stored(["e"], [8])
    assert engine.merge(path, late, key="id", evict=only(Eviction("ts", 6)), aligned=Aligned("ts", 8, 8)) == Merged(
        1, 2
    )  # a and b, outside the range
    assert sorted(row.id for row in engine.read(path).collect()) == ["c", "d", "e"]


def test_a_merge_flags_or_deletes_the_stored_rows_its_source_names_again_and_inserts_the_rest(engine, spark, tmp_path):
    """A source row naming a stored key acts on it only where its ``when`` column is true; new keys are inserted."""
    path = str(tmp_path / "t")
    engine.merge(
        path,
        pa.table({"id": ["a", "b", "c"], "ts": pa.array([1, 2, 3], pa.int64()), "_matched": [False] * 3}),
        key="id",
    )
    named = pa.table({"id": ["a", "b", "d"], "ts": pa.array([1, 2, 4], pa.int64()), "_matched": [True, False, False]})
    assert engine.merge(path, named, key="id", aligned=Aligned("ts", 1, 4), on_match=OnMatch("_matched")) == Merged(
        1, 0
    )
    assert {row.id: row._matched for row in engine.read(path).collect()} == {
        "a": True,
        "b": False,
        "c": False,
        "d": False,
    }
    dropped = pa.table({"id": ["b", "e"], "ts": pa.array([2, 5], pa.int64())})
    assert engine.merge(
        path, dropped, key="id", aligned=Aligned("ts", 2, 5), on_match=OnMatch(None, delete=True)
    ) == Merged(1, 1)
    assert sorted(row.id for row in engine.read(path).collect()) == ["a", "c", "d", "e"]


def test_merge_evicts_rows_below_the_cutoff_in_the_same_commit(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.merge(path, stored(["a", "b", "c"], [1, 5, 9]), key="id")
    version = engine.version(path)
    assert engine.merge(path, stored(["d"], [2]), key="id", evict=only(Eviction("ts", 6))) == Merged(1, 2)
    assert engine.version(path) == version + 1
    assert sorted(row.id for row in engine.read(path).collect()) == ["c", "d"]
    assert engine.merge(path, stored([], []), key="id", evict=only(Eviction("ts", 9))) == Merged(0, 1)
    assert [row.id for row in engine.read(path).collect()] == ["c"]


def stored(ids: list[str], times: list[int]) -> pa.Table:
    """Rows of a table of one buffer, each in it."""
    return pa.table(
        {
            "id": pa.array(ids, pa.string()),
            "ts": pa.array(times, pa.int64()),
            "_in_store": pa.array([True] * len(ids), pa.bool_()),
        }
    )


def only(cutoff: Eviction) -> Memberships:
    """A table of one buffer, whose rows below ``cutoff`` leave it and, in no buffer then, leave the table."""
    return Memberships({"_in_store": cutoff}, held_until=cutoff)


def test_a_merge_clears_the_buffers_a_row_leaves_and_deletes_the_rows_no_buffer_keeps(engine, spark, tmp_path):
    """One state table, two buffers: a row leaving one buffer stays, with that buffer's column cleared (a row its
    source names too); a row below both cutoffs is deleted."""
    path = str(tmp_path / "t")

    def rows(ids: list[str], times: list[int], **columns: list[bool]) -> pa.Table:
        return pa.table(
            {
                "id": pa.array(ids, pa.string()),
                "ts": pa.array(times, pa.int64()),
                **{name: pa.array(values, pa.bool_()) for name, values in columns.items()},
            }
        )

    engine.merge(
        path,
        rows(["a", "b", "c", "d"], [1, 3, 5, 7], _in_store=[True] * 4, _in_s_probes=[True] * 4, _matched=[False] * 4),
        key="id",
    )
    named = rows(["b", "e"], [3, 8], _in_store=[None, True], _in_s_probes=[None, True], _matched=[True, False])
    cutoffs = Memberships(
        {"_in_store": Eviction("ts", 2), "_in_s_probes": Eviction("ts", 6)}, held_until=Eviction("ts", 2)
    )
    assert engine.merge(
        path, named, key="id", evict=cutoffs, aligned=Aligned("ts", 3, 8), on_match=OnMatch("_matched")
    ) == Merged(1, 1)
    stored = {row.id: (row._in_store, row._in_s_probes, row._matched) for row in engine.read(path).collect()}
    assert stored == {
        "b": (True, False, True),
        "c": (True, False, False),
        "d": (True, True, False),
        "e": (True, True, False),
    }
    never = Memberships({"_in_store": None, "_in_s_probes": Eviction("ts", 8)})
    assert engine.merge(
        path, rows([], [], _in_store=[], _in_s_probes=[], _matched=[]), key="id", evict=never
    ) == Merged(0, 0)  # a store without a window keeps every row
    assert {row.id for row in engine.read(path).collect() if row._in_s_probes} == {"e"}


def test_time_travel_reads_the_snapshot_at_a_version(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.append(path, frame(spark, [("a", 1)]))
    first = engine.version(path)
    engine.append(path, frame(spark, [("b", 2)]))
    assert [row.id for row in engine.read(path, first).collect()] == ["a"]
    assert engine.max_value(path, "ts", first) == 1


def test_max_value_follows_new_versions_and_a_table_recreated_at_the_same_path(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.append(path, frame(spark, [("a", 5)]))
    assert engine.max_value(path, "ts") == 5
    engine.append(path, frame(spark, [("b", 7)]))
    assert engine.max_value(path, "ts") == 7
    engine.optimize(path)
    engine.append(path, frame(spark, [("c", 6)]))
    assert engine.max_value(path, "ts") == 7  # a compaction and a smaller value since: the greatest stays
    DeltaTable(path).delete("ts = 7")
    assert engine.max_value(path, "ts") == 6  # a delete since: found again
    engine.drop(path)
    engine.append(path, frame(spark, [("a", 2)]))
    engine.append(path, frame(spark, [("b", 3)]))  # the same version as the dropped table's last
    assert engine.max_value(path, "ts") == 3
    assert engine.max_value(path, "ts", 0) == 2


@pytest.mark.parametrize("on_driver", [True, False], ids=["driver rows", "a DataFrame"])
def test_max_value_follows_the_engine_s_own_appends_and_is_asked_again_after_another_writer_s(
    engine, spark, tmp_path, on_driver
):
    """A maximum known before an append of the engine's own is carried to its commit (the rows on the driver, or
    observed as a DataFrame is written: on the public reader, an aggregate's Spark job saved per look)."""
    path = str(tmp_path / "t")
    schema = pa.schema([("id", pa.string()), ("ts", pa.int64())])

    def rows(*values: int | None) -> pa.Table:
        table = pa.Table.from_pylist([{"id": "x", "ts": value} for value in values], schema)
        return table if on_driver else spark.createDataFrame(table.to_pylist(), "id string, ts bigint")

    engine.append(path, rows(5))
    assert engine.max_value(path, "ts") == 5
    engine.append(path, rows(9, 3))
    engine.append(path, rows(None))
    assert engine.max_value(path, "ts") == 9
    DeltaTable(path).delete("ts = 9")  # another writer's commit between the known maximum and the next append
    engine.append(path, rows(4))
    assert engine.max_value(path, "ts") == 5


def test_max_value_passes_over_a_file_of_nulls(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.append(path, spark.createDataFrame([("a", None)], "id string, ts bigint"))
    assert engine.max_value(path, "ts") is None
    engine.append(path, frame(spark, [("b", 4)]))
    assert engine.max_value(path, "ts") == 4


def test_lookup_finds_rows_by_key_past_the_prefix_that_statistics_keep(engine, spark, tmp_path):
    """Delta's statistics keep a prefix of a text's minimum and maximum (32 characters): keys that share it are told
    apart all the same."""
    path = str(tmp_path / "t")
    stem = "f" * 40
    keyed = "key string, relation string"
    engine.append(path, spark.createDataFrame([(stem + "a", "r"), (stem + "c", "r")], keyed).coalesce(1))
    engine.append(path, spark.createDataFrame([("b" * 64, "s")], keyed))
    assert engine.lookup(path, "key", [stem + "c", "zz"]).column("key").to_pylist() == [stem + "c"]
    assert engine.lookup(path, "key", [stem + "b", "a"]).num_rows == 0
    assert engine.lookup(path, "key", ["b" * 64], where="relation = 'r'").num_rows == 0
    assert engine.lookup(path, "key", ["b" * 64], where="relation = 's'").column("relation").to_pylist() == ["s"]
    assert engine.lookup(str(tmp_path / "none"), "key", ["a"]) is None


def test_a_listing_answers_from_the_files_statistics_only_what_they_say():
    """A file's statistics may be missing, cut to a prefix, or say that the column is all nulls."""

    def stats(column: str, low: object = None, high: object = None, nulls: int = 0) -> str:
        bounds = {} if low is None else {"minValues": {column: low}, "maxValues": {column: high}}
        return json.dumps({"numRecords": 2, "nullCount": {column: nulls}, **bounds})

    cut = "a" * 32  # what Delta keeps of a longer text
    keys = Listed(
        ["m", "cut", "nulls", "bare"],
        StructType(),
        [stats("k", "m", "n"), stats("k", cut, cut), stats("k", nulls=2), None],
    )
    assert keys.holding("k", ["a" * 40]) == ["cut", "bare"]
    assert keys.holding("k", ["b", "0"]) == ["bare"]
    numbers = [stats("n", 1, 5), stats("n", nulls=2)]
    assert Listed(["one", "nulls"], StructType(), numbers).maximum("n") == (5,)
    assert Listed(["nulls"], StructType(), numbers[1:]).maximum("n") == (None,)
    assert Listed(["one", "bare"], StructType(), [numbers[0], None]).maximum("n") is None  # a Spark job must say


def test_the_greatest_value_after_commits_comes_from_their_added_files_until_one_deletes_rows():
    def add(high: int | None) -> dict:
        return {
            "add": {
                "stats": None
                if high is None
                else json.dumps({"numRecords": 1, "maxValues": {"n": high}, "nullCount": {"n": 0}})
            }
        }

    compaction = [{"remove": {"path": "old", "dataChange": False}}, add(3)]
    assert greatest_after(5, [[add(4)], compaction, [{"commitInfo": {}}]], "n") == (5,)
    assert greatest_after(5, [[add(9)]], "n") == (9,) and greatest_after(None, [[add(2)]], "n") == (2,)
    assert (
        greatest_after(5, [[add(6)], [{"remove": {"path": "x", "dataChange": True}}]], "n") is None
    )  # the greatest may be gone
    assert greatest_after(5, [[add(None)]], "n") is None  # a Spark job must say


def test_a_source_snapshot_lists_every_file_the_table_holds_past_a_checkpoint_and_a_compaction(engine, spark, tmp_path):
    """What a source table's first ingest reads: each live data file once, as an append (a checkpoint's and a
    compaction's adds say dataChange = false; the snapshot holds them all the same)."""
    path = str(tmp_path / "t")
    for n in range(11):  # Delta on Spark checkpoints every 10 commits
        engine.append(path, frame(spark, [(f"a{n}", n)]))
    engine.optimize(path)
    engine.append(path, frame(spark, [("b", 99)]))
    version, actions = engine.source_snapshot(path)
    snapshot = SourceCommit.of(version, actions, "snapshot")
    live = {row[0] for row in engine.read(path).select(F.input_file_name()).collect()}
    assert snapshot.kind == APPEND and {add["path"].rsplit("/", 1)[-1] for add in snapshot.files} == {
        file.rsplit("/", 1)[-1] for file in live
    }


def test_where_filters_rows_and_skips_files_by_their_statistics(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.append(path, frame(spark, [("a", 1), ("b", 2)]).coalesce(1))
    engine.append(path, frame(spark, [("c", 10), ("d", 11)]).coalesce(1))
    sliced = engine.read(path, where="ts > 2 AND ts <= 10")
    assert [row.id for row in sliced.collect()] == ["c"]
    assert len(sliced.inputFiles()) == 1


def test_rows_is_read_on_the_driver_as_arrow(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    assert engine.rows(path) is None
    engine.append(path, frame(spark, [("a", 1), ("b", 2)]))
    first = engine.version(path)
    engine.append(path, spark.createDataFrame([("c", 10, {"r": 3})], "id string, ts bigint, marks map<string, bigint>"))
    rows = engine.rows(path, where="ts >= 2")
    assert isinstance(rows, pa.Table)
    assert sorted(rows.to_pylist(), key=lambda row: row["id"]) == [
        {"id": "b", "ts": 2, "marks": None},
        {"id": "c", "ts": 10, "marks": [("r", 3)]},
    ]
    assert sorted(engine.rows(path, first).column("id").to_pylist()) == ["a", "b"]
    assert engine.rows(path, where="ts > 99").num_rows == 0


def test_info_is_version_schema_and_transaction_from_one_look_at_the_table(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    assert engine.info(path, "pipe:t") is None
    engine.append(path, frame(spark, [("a", 1)]), commit=Commit("pipe:t", 4))
    info = engine.info(path, "pipe:t")
    assert (info.version, info.schema.fieldNames(), info.txn_version) == (engine.version(path), ["id", "ts"], 4)
    assert engine.info(path, "other-app").txn_version is None


@pytest.mark.spark_delta
def test_a_pin_keeps_each_table_as_first_seen_until_refresh_forgets_it_and_a_pin_within_it_forgets_nothing(
    spark, tmp_path
):
    """A run pins once for its lock; the ingest lock and each batch within it forget only what others write beside the
    run (bronze, the ingest log): every other table's look-up, a Spark job on the public reader, is made once."""
    require_spark_delta(spark)
    mine, other = (SparkDeltaEngine(spark, PublicLog(spark)) for _ in range(2))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for path in (a, b):
        other.append(path, frame(spark, [("x", 1)]))
    with mine.pinned():
        seen = (mine.version(a), mine.version(b))
        for path in (a, b):
            other.append(path, frame(spark, [("y", 2)]))
        with mine.pinned():
            assert (mine.version(a), mine.version(b)) == seen
        mine.refresh(a)
        assert (mine.version(a), mine.version(b)) == (seen[0] + 1, seen[1])
    assert mine.version(b) == seen[1] + 1  # outside any pin, the log is asked


@pytest.mark.spark_delta
@pytest.mark.parametrize("reader", [JvmLog, PublicLog], ids=["JVM log reader", "public log reader"])
def test_within_a_pin_a_read_sees_the_snapshot_first_seen_and_a_snapshot_s_rows_are_read_once(spark, tmp_path, reader):
    """A table seen within a pin is a snapshot: another writer's commit since is not read until ``refresh`` (the public
    reader read the newest), and the same snapshot's rows asked again cost no Spark job (a pipeline reads its definition
    at each call)."""
    require_spark_delta(spark)
    mine, other = SparkDeltaEngine(spark, reader(spark)), SparkDeltaEngine(spark, reader(spark))
    path = str(tmp_path / "t")
    other.append(path, frame(spark, [("x", 1)]))
    with mine.pinned():
        assert mine.rows(path)["id"].to_pylist() == ["x"]
        other.append(path, frame(spark, [("y", 2)]))
        assert [row.id for row in mine.read(path).collect()] == ["x"]
        with counted(spark, str(tmp_path)) as cost:
            assert mine.rows(path)["id"].to_pylist() == ["x"]
        assert cost.jobs == 0
        mine.refresh(path)
        assert sorted(mine.rows(path)["id"].to_pylist()) == ["x", "y"]


@pytest.mark.spark_delta
def test_a_write_on_the_public_reader_knows_the_head_it_made_as_a_look_up_would_find_it_from_threads_at_once(
    spark, tmp_path
):
    """Its commit's version as Delta reports it on the session, not a look-up (a Spark job): a head as a look-up finds
    it (its stamp keys what the engine knows of the table), and each thread's own even when both write at once."""
    require_spark_delta(spark)
    engine, looking = SparkDeltaEngine(spark, PublicLog(spark)), PublicLog(spark)
    tables = [str(tmp_path / name) for name in ("a", "b")]
    for path in tables:
        engine.append(path, frame(spark, [("x", 0)]))

    def write(path: str) -> list[tuple[int, int | None]]:
        seen = []
        for number in range(1, 5):
            rows = frame(spark, [("y", number)] * number) if number % 2 else pa.table({"id": ["y"], "ts": [number]})
            written = engine.append(path, rows, commit=Commit(f"pipe:{path}", number))
            seen.append((engine.version(path), written))
        return seen

    with engine.pinned(), ThreadPoolExecutor(max_workers=2) as pool:
        seen = dict(zip(tables, pool.map(write, tables)))
        known = {path: engine._head(path) for path in tables}
    for path in tables:
        found = looking.head(path)
        assert seen[path] == [(1, 1), (2, 1), (3, 3), (4, 1)]
        assert (known[path].version, known[path].stamp) == (found.version, found.stamp)
        assert looking.recorded(path, found, f"pipe:{path}").version == 4


def test_drop_deletes_the_table(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    engine.append(path, frame(spark, [("a", 1)]), commit=Commit("pipe:t", 1))
    engine.drop(path)
    assert engine.version(path) is None and engine.txn_version(path, "pipe:t") is None
    assert engine.append(path, frame(spark, [("b", 2)]), commit=Commit("pipe:t", 1)) == 1
    assert [row.id for row in engine.read(path).collect()] == ["b"]


def test_optimize_compacts_and_sorts_without_changing_rows_and_vacuum_keeps_history(engine, spark, tmp_path):
    path = str(tmp_path / "t")
    for chunk in ([("c", 3), ("a", 1)], [("d", 4)], [("b", 2)]):
        engine.append(path, frame(spark, chunk))
    before = engine.version(path)
    engine.optimize(path, "ts")
    assert engine.version(path) == before + 1
    assert engine.read(path).inputFiles() and len(engine.read(path).inputFiles()) == 1
    assert [row.ts for row in engine.read(path).collect()] == [1, 2, 3, 4]  # one file, rewritten in ts order
    engine.vacuum(path, 168)  # keeps every file a version of the last week needs
    assert_df_equality(engine.read(path, before), engine.read(path), ignore_row_order=True)
    engine.optimize(str(tmp_path / "missing"))  # nothing to do for a table that does not exist


def test_delta_loaded_with_spark_jars_is_detected_as_it_is_on_the_class_path(tmp_path):
    """``spark.jars`` (and ``spark.jars.packages``, which ``configure_spark_with_delta_pip`` uses) put Delta in
    Spark's class loader, not the system one: ``auto`` must still find it."""
    jars = delta_jars(os.environ.get(DELTA_JARS))
    if not jars:
        pytest.skip(SPARK_DELTA_SKIP)
    script = f"""
from pyspark.sql import SparkSession
from state.engines import make_engine, session_has_delta
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").config("spark.jars", {",".join(jars)!r})
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog").getOrCreate())
print("detected:", session_has_delta(spark), make_engine(spark).name)
"""
    env = {name: value for name, value in os.environ.items() if name != DELTA_JARS}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**env, "PYTHONPATH": REPO},
        timeout=300,
    )
    assert "detected: True spark" in done.stdout, done.stderr[-2000:]


def test_an_empty_frame_s_schema_reaches_arrow_with_timestamps_in_utc_on_either_pyspark_4_1_converter(monkeypatch):
    """pyspark's internal converter changed within 4.1: 4.1.0's, which Databricks Connect 18 (serverless environment 5)
    ships, takes the zone as ``timezone`` and fails without it. A MERGE of gold that changed nothing commits a marker of
    no rows with gold's schema (its ``produced_at`` a timestamp), which failed there."""
    from pyspark.sql.types import StructField, TimestampType

    from state.engines import spark_delta

    schema = StructType([StructField("produced_at", TimestampType())])
    expected = pa.schema([("produced_at", pa.timestamp("us", tz="UTC"))])
    assert spark_delta.arrow_schema(schema) == expected

    def converter_of_4_1_0(schema: StructType, *, timezone: str | None = None) -> pa.Schema:
        assert timezone is not None  # as pyspark 4.1.0's to_arrow_type asserts for a TimestampType
        return pa.schema([(field.name, pa.timestamp("us", tz=timezone)) for field in schema.fields])

    monkeypatch.setattr(spark_delta, "to_arrow_schema", converter_of_4_1_0)
    assert spark_delta.arrow_schema(schema) == expected
