"""Bronze ingest: formats, provenance, arrival order, quarantine reasons, idempotency, conflicts."""

from __future__ import annotations

import hashlib
import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from deltalake import write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from state.errors import LakejoinError
from state.faults import CRASH_AT, InjectedCrash
from tests.helpers import Pipeline


@pytest.fixture
def pipeline(deltars, tmp_path) -> Pipeline:
    return Pipeline(deltars, str(tmp_path))


def bronze(pipeline: Pipeline, side: str):
    return pipeline.engine.read(pipeline.warehouse.bronze(pipeline_relation(side)))


def pipeline_relation(side: str):
    from state.join.relations import relation

    return relation(side)


def quarantined(pipeline: Pipeline) -> list[tuple[int, str]]:
    rows = pipeline.engine.read(pipeline.warehouse.quarantine).collect()
    return sorted((row.source_line, row.reason) for row in rows)


def test_each_malformed_row_is_quarantined_with_its_reason_and_the_good_rows_land(pipeline):
    path = pipeline.write_file(
        [
            {"id": "ok1", "ts": 1, "key": "a", "payload": "p"},
            "this is not json",
            {"ts": 2, "key": "a"},
            {"id": "x3", "key": "a"},
            {"id": "x4", "ts": 4},
            {"id": None, "ts": 5, "key": "a"},
            {"id": "x6", "ts": "soon", "key": "a"},
            {"id": "x7", "ts": 7.5, "key": "a"},
            "",
            {"id": "ok2", "ts": "10", "key": "b"},
        ]
    )
    result = pipeline.ingest("r", path)
    assert (result.landed, result.quarantined, result.duplicates) == (2, 7, 0)
    assert quarantined(pipeline) == [
        (2, "unparsable line"),
        (3, "missing id"),
        (4, "missing ts"),
        (5, "missing key"),
        (6, "missing id"),
        (7, "ts is not an integer: soon"),
        (8, "ts is not an integer: 7.5"),
    ]
    rows = bronze(pipeline, "r").orderBy("_arrival_seq").collect()
    assert [(row.id, row.ts, row.key, row.payload, row._source_line) for row in rows] == [
        ("ok1", 1, "a", "p", 1),
        ("ok2", 10, "b", None, 10),
    ]
    assert all(row._source_file == path for row in rows)


def test_a_file_read_in_many_pieces_keeps_its_line_order_and_no_task_holds_all_of_it(pipeline, spark, monkeypatch):
    """A file larger than memory must not pass through one task: it is read in pieces (here every file is read in
    blocks, of ~100 bytes), and each row still takes the place its line gives it in the arrival order."""
    from pipelines.bronze import parse

    lines = [
        "garbage" if n % 7 == 0 else "" if n % 11 == 0 else {"id": f"r{n}", "ts": n, "key": "k"} for n in range(1, 41)
    ]
    path = pipeline.write_file(lines)
    plans = []
    append = pipeline.engine.append

    def recording_append(table, df, *, commit=None, properties=None):
        if isinstance(df, DataFrame):
            plans.append(df._jdf.queryExecution().executedPlan().toString())
        return append(table, df, commit=commit, properties=properties)

    monkeypatch.setattr(pipeline.engine, "append", recording_append)
    monkeypatch.setattr(parse, "WHOLE_FILE_BYTES", 0)
    spark.conf.set("spark.sql.files.maxPartitionBytes", "100")
    try:
        pipeline.ingest("r", path)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    landed = [n for n, line in enumerate(lines, start=1) if isinstance(line, dict)]
    rows = bronze(pipeline, "r").orderBy("_arrival_seq").collect()
    assert [(row._source_line, row._arrival_seq) for row in rows] == [(n, n) for n in landed]
    assert quarantined(pipeline) == [(n, "unparsable line") for n in (7, 14, 21, 28, 35)]
    assert plans and not any("SinglePartition" in plan for plan in plans)


def test_a_file_without_a_required_column_is_quarantined_whole(pipeline):
    result = pipeline.ingest("s", pipeline.write_file([{"id": "a", "key": "k"}, {"id": "b", "key": "k"}]))
    assert (result.landed, result.quarantined) == (0, 2)
    assert quarantined(pipeline) == [(1, "missing column ts"), (2, "missing column ts")]


def test_arrival_order_is_global_across_relations_and_files(pipeline):
    pipeline.ingest("r", pipeline.write_file([{"id": "r1", "ts": 5, "key": "k"}, {"id": "r2", "ts": 1, "key": "k"}]))
    pipeline.ingest("s", pipeline.write_file([{"id": "s1", "ts": 3, "key": "k"}]))
    pipeline.ingest("r", pipeline.write_file([{"id": "r3", "ts": 0, "key": "k"}]))
    seqs = {row.id: row._arrival_seq for side in "rs" for row in bronze(pipeline, side).collect()}
    assert seqs == {"r1": 1, "r2": 2, "s1": 3, "r3": 4}


def test_bookkeeping_columns_have_their_documented_types(pipeline):
    pipeline.ingest("r", pipeline.write_file([{"id": "r1", "ts": 5, "key": "k"}, "garbage"]))
    types = {
        field.name: field.dataType.simpleString()
        for field in pipeline.engine.schema(pipeline.warehouse.bronze(pipeline_relation("r")))
    }
    assert (
        types["_arrival_seq"] == "bigint" and types["_source_line"] == "bigint"
    )  # a place in the order can pass 2**31
    assert types["_ingested_at"] == "timestamp" and types["_digest"] == "bigint"
    quarantine = {
        field.name: field.dataType.simpleString() for field in pipeline.engine.schema(pipeline.warehouse.quarantine)
    }
    assert quarantine["source_line"] == "bigint" and quarantine["ingested_at"] == "timestamp"


def test_ingesting_the_same_file_twice_adds_nothing(pipeline):
    path = pipeline.write_file([{"id": "a", "ts": 1, "key": "k"}, "garbage"])
    first = pipeline.ingest("r", path)
    versions = {
        p: pipeline.engine.version(p)
        for p in (pipeline.warehouse.bronze(pipeline_relation("r")), pipeline.warehouse.quarantine)
    }
    second = pipeline.ingest("r", path)
    assert (first.landed, first.quarantined) == (1, 1)
    assert second.already_ingested and "nothing added" in second.describe()
    assert {p: pipeline.engine.version(p) for p in versions} == versions


def test_an_ingest_that_died_before_its_log_row_lands_what_is_missing_when_tried_again(pipeline, monkeypatch):
    """Bronze and the quarantine are written before the ingest log: a retry skips the rows bronze has as duplicates
    and finds its quarantine write recorded, so each row is kept once."""
    path = pipeline.write_file([{"id": "a", "ts": 1, "key": "k"}, "garbage", {"id": "b", "ts": 2, "key": "k"}])
    monkeypatch.setenv(CRASH_AT, "before:ingest_log")
    with pytest.raises(InjectedCrash):
        pipeline.ingest("r", path)
    monkeypatch.delenv(CRASH_AT)
    again = pipeline.ingest("r", path)

    assert (again.landed, again.quarantined, again.duplicates) == (0, 1, 2)
    assert sorted(row.id for row in bronze(pipeline, "r").collect()) == ["a", "b"]
    assert quarantined(pipeline) == [(2, "unparsable line")]
    (logged,) = pipeline.engine.read(pipeline.warehouse.ingest_log).collect()
    assert (logged.seq_from, logged.seq_to) == (4, 6)  # after the places its first try took (1 to 3): pending runs to 6


def test_repeated_records_are_skipped_and_conflicting_ids_quarantined(pipeline):
    pipeline.ingest("r", pipeline.write_file([{"id": "a", "ts": 1, "key": "k"}, {"id": "b", "ts": 2, "key": "k"}]))
    result = pipeline.ingest(
        "r",
        pipeline.write_file(
            [
                {"id": "a", "ts": 1, "key": "k"},  # the same record again: a duplicate, skipped
                {"id": "b", "ts": 99, "key": "k"},  # an existing id with other content: a conflict
                {"id": "c", "ts": 3, "key": "k"},
                {"id": "c", "ts": 3, "key": "k"},  # repeated within the file
                {"id": "c", "ts": 4, "key": "k"},  # same id, other content, within the file
            ]
        ),
    )
    assert (result.landed, result.quarantined, result.duplicates) == (1, 2, 2)
    assert quarantined(pipeline) == [
        (2, "id conflict: id already in bronze with other content"),
        (5, "id conflict: same id with other content at line 3"),
    ]
    assert sorted(row.id for row in bronze(pipeline, "r").collect()) == ["a", "b", "c"]


def test_a_value_moved_to_another_column_is_other_content(pipeline):
    """The digest marks each null: a record whose one value moves from one column to another is not its copy."""
    result = pipeline.ingest(
        "r",
        pipeline.write_file(
            [
                {"id": "a", "ts": 1, "key": "k", "p": None, "q": "v"},
                {"id": "a", "ts": 1, "key": "k", "p": "v", "q": None},
            ]
        ),
    )
    assert (result.landed, result.quarantined, result.duplicates) == (1, 1, 0)


def landed_before_the_digest(pipeline: Pipeline, table: str) -> None:
    """``table`` rewritten as warehouses kept it before ``_digest``: each row's SHA-256 of its content as JSON (what
    Spark's ``to_json`` gives for its columns in name order), computed here by hashlib."""
    held = pipeline.engine.rows(table)
    digests = []
    for row in held.to_pylist():
        content = {name: row[name] for name in sorted(row) if not name.startswith("_") and row[name] is not None}
        digests.append(hashlib.sha256(json.dumps(content, separators=(",", ":")).encode()).hexdigest())
    earlier = held.drop_columns(["_digest"]).append_column("_content_hash", pa.array(digests, pa.string()))
    write_deltalake(table, earlier, mode="overwrite", schema_mode="overwrite")
    pipeline.engine.refresh()


def test_a_warehouse_landed_before_the_digest_finds_copies_and_conflicts_of_its_records(engine, tmp_path):
    """Rows kept before ``_digest`` hold only their SHA-256: an arrival of one of their ids is compared by it, in state
    and in what is pending, and rows landed since sit beside them (the state's MERGE adds their column)."""
    pipeline = Pipeline(engine, str(tmp_path))
    pipeline.ingest("r", pipeline.write_file([{"id": "a", "ts": 1, "key": "k"}, {"id": "b", "ts": 2, "key": "k"}]))
    pipeline.run()
    pipeline.ingest("r", pipeline.write_file([{"id": "c", "ts": 3, "key": "k"}]))
    rel = pipeline_relation("r")
    for table in (pipeline.warehouse.bronze(rel), pipeline.warehouse.state(rel)):
        landed_before_the_digest(pipeline, table)

    again = pipeline.ingest(
        "r",
        pipeline.write_file(
            [
                {"id": "a", "ts": 1, "key": "k"},  # held in state, the same: a duplicate
                {"id": "b", "ts": 99, "key": "k"},  # held in state, other content: a conflict
                {"id": "c", "ts": 4, "key": "k"},  # pending, other content: a conflict
                {"id": "d", "ts": 5, "key": "k"},
            ]
        ),
    )
    last = pipeline.ingest(
        "r", pipeline.write_file([{"id": "c", "ts": 3, "key": "k"}, {"id": "d", "ts": 5, "key": "k"}])
    )

    assert (again.landed, again.quarantined, again.duplicates) == (1, 2, 1)
    assert (last.landed, last.duplicates) == (0, 2)  # c by its SHA-256, d by its digest
    pipeline.run()
    assert sorted(
        (row.id, row._content_hash is None, row._digest is None)
        for row in pipeline.engine.read(pipeline.warehouse.state(rel)).collect()
    ) == [("a", False, True), ("b", False, True), ("c", False, True), ("d", True, False)]


def test_csv_and_parquet_land_like_json_and_keep_other_columns(pipeline, spark, tmp_path):
    csv_path = pipeline.write_file(["id,ts,key,region", "c1,1,k,eu", "c2,x,k,us", "c3,3,k"], suffix=".csv")
    parquet_path = str(tmp_path / "arrivals.parquet")
    pq.write_table(
        pa.table({"id": ["p1", "p2"], "ts": [4, None], "key": ["k", "k"], "region": ["us", "eu"]}), parquet_path
    )
    csv_result, parquet_result = pipeline.ingest("s", csv_path), pipeline.ingest("s", parquet_path)
    assert (csv_result.landed, csv_result.quarantined) == (1, 2)
    assert (parquet_result.landed, parquet_result.quarantined) == (1, 1)
    assert quarantined(pipeline) == [(2, "missing ts"), (3, "ts is not an integer: x"), (4, "unparsable line")]
    expected = spark.createDataFrame(
        [("c1", 1, "k", "eu"), ("p1", 4, "k", "us")], "id string, ts bigint, key string, region string"
    )
    assert_df_equality(
        bronze(pipeline, "s").select("id", "ts", "key", "region"), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_unknown_extensions_and_missing_files_are_refused_before_anything_lands(pipeline, spark, tmp_path):
    from pipelines.bronze.ingest import ingest_files
    from state.join.relations import R

    good = pipeline.write_file([{"id": "a", "ts": 1, "key": "k"}])
    with pytest.raises(LakejoinError, match="unknown extension '.txt'"):
        ingest_files(pipeline.engine, pipeline.warehouse, R, [good, str(tmp_path / "notes.txt")])
    with pytest.raises(LakejoinError, match="no such file"):
        ingest_files(pipeline.engine, pipeline.warehouse, R, [good, str(tmp_path / "gone.jsonl")])
    assert pipeline.engine.version(pipeline.warehouse.bronze(R)) is None


def test_reserved_column_names_are_refused(pipeline):
    with pytest.raises(LakejoinError, match="'_arrival_seq' starts with '_'"):
        pipeline.ingest("r", pipeline.write_file([{"id": "a", "ts": 1, "key": "k", "_arrival_seq": 9}]))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "é", "\n", "\r", "\r\n", " ", "\ufeff"]), max_size=40),
    st.integers(min_value=1, max_value=8),
)
def test_a_text_file_s_places_are_its_lines_as_spark_splits_them_whatever_the_blocks_it_is_read_in(pieces, block):
    """A file's places are counted on the driver before Spark reads it: as many as the lines Spark's text reader gives
    (split at \\r\\n, \\r or \\n, nothing after a last separator), read in blocks that may split a \\r\\n."""
    from pipelines.bronze.landing import Lines

    text = "".join(pieces)
    content, lines = text.encode(), Lines()
    for start in range(0, len(content), block):
        lines.add(content[start : start + block])
    split = re.split("\r\n|\r|\n", text)
    assert lines.count == len(split) - (split[-1] == "")


def test_spark_numbers_a_text_file_s_lines_within_the_places_counted_for_it(spark, tmp_path, monkeypatch):
    """Every line Spark reads of a file is numbered within the places counted for it, read whole or in blocks."""
    from pipelines.bronze import landing, parse

    texts = ["a\r\nb\rc\nd", "a\n\n\nb\n", "\ufeffa\r\r\nb\r\n", "x"]
    paths = []
    for number, text in enumerate(texts):
        paths.append(str(tmp_path / f"{number}.jsonl"))
        with open(paths[-1], "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
    counted = {path: landing.examined("r", path).rows for path in paths}
    for whole in (parse.WHOLE_FILE_BYTES, 0):
        monkeypatch.setattr(parse, "WHOLE_FILE_BYTES", whole)
        numbered = (
            parse.numbered_lines(spark, paths)
            .groupBy("_source_file")
            .agg(F.max("_source_line").alias("last"))
            .collect()
        )
        assert {row._source_file: row.last for row in numbered} == counted


def test_the_files_of_one_call_land_in_one_bronze_commit_and_one_log_commit_each_reported_alone(pipeline):
    """One road into bronze: a call's files are read, classified and appended together, then logged together; each
    file still gets its own result, and its rows the places its lines give them."""
    from pipelines.bronze.ingest import ingest_files
    from state.join.relations import R

    first = pipeline.write_file([{"id": "a", "ts": 1, "key": "k"}, {"id": "b", "ts": 2, "key": "k"}])
    second = pipeline.write_file(["garbage", {"id": "a", "ts": 1, "key": "k"}, {"id": "c", "ts": 3, "key": "k"}])
    third = pipeline.write_file([{"id": "b", "ts": 9, "key": "k"}])
    results = ingest_files(pipeline.engine, pipeline.warehouse, R, [first, second, third, first])
    assert [(result.landed, result.quarantined, result.duplicates) for result in results[:3]] == [
        (2, 0, 0),
        (1, 1, 1),
        (0, 1, 0),
    ]
    assert results[3].already_ingested
    warehouse = pipeline.warehouse
    assert pipeline.engine.version(warehouse.bronze(R)) == 0 and pipeline.engine.version(warehouse.ingest_log) == 0
    assert pipeline.engine.version(warehouse.quarantine) == 0
    rows = bronze(pipeline, "r").orderBy("_arrival_seq").collect()
    assert [(row.id, row._arrival_seq) for row in rows] == [("a", 1), ("b", 2), ("c", 5)]  # second's lines take 3 to 5
    log = sorted(
        (row.source_file, row.seq_from, row.seq_to) for row in pipeline.engine.read(warehouse.ingest_log).collect()
    )
    assert log == sorted([(first, 1, 2), (second, 3, 5), (third, 6, 6)])


def test_a_call_of_501_files_lands_them_in_two_passes_as_the_docs_say(pipeline):
    """Up to 500 files a call is one commit per table; the 501st is a second pass, in the order given."""
    from pipelines.bronze.ingest import FILES_PER_LANDING, ingest_files
    from state.join.relations import R

    files = [pipeline.write_file([{"id": f"r{n}", "ts": n, "key": "k"}]) for n in range(FILES_PER_LANDING + 1)]
    results = ingest_files(pipeline.engine, pipeline.warehouse, R, files)
    assert FILES_PER_LANDING == 500 and [result.landed for result in results] == [1] * 501
    warehouse = pipeline.warehouse
    assert pipeline.engine.version(warehouse.bronze(R)) == 1 and pipeline.engine.version(warehouse.ingest_log) == 1
    rows = bronze(pipeline, "r").orderBy("_arrival_seq").collect()
    assert [row.id for row in rows] == [f"r{n}" for n in range(501)] and rows[-1]._arrival_seq == 501
