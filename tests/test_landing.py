"""Landing folders joined in one pass: the files a run finds land in bronze in the batch that joins them, every file
once, every row at a place the batch's plan gave it, whatever crashes, copies or unreadable files come along."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import silver
from pipelines.bronze.ingest import IngestResult, ingest_files
from pipelines.commands.reset import reset
from pipelines.silver import run
from state.config import Config
from state.faults import CRASH_AT, InjectedCrash
from state.join.relations import R, S
from tests.helpers import Pipeline, copied, crash_at_each
from tests.reference import Record, batch_join

RECORDS = [
    Record("r", "r1", 1, "a"),
    Record("r", "r2", 2, "b"),
    Record("s", "s3", 3, "a"),
    Record("s", "s4", 4, "b"),
    Record("r", "r5", 5, "a"),
]


def landed(engine, root, **settings) -> Pipeline:
    """A pipeline whose relations r and s land their files in ``root/landing/<name>``."""
    folders = {name: os.path.join(str(root), "landing", name) for name in ("r", "s")}
    for folder in folders.values():
        os.makedirs(folder, exist_ok=True)
    relations = {name: {"landing": folder, "required": ["key"]} for name, folder in folders.items()}
    return Pipeline(engine, str(root), Config.of(relations=relations, **settings))


def folder(pipeline: Pipeline, name: str) -> str:
    return pipeline.config.spec(name).landing  # type: ignore[return-value] - configured


def jsonl(pipeline: Pipeline, name: str, file: str, records: list[Record], *extra: str) -> str:
    path = os.path.join(folder(pipeline, name), file)
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(
            [json.dumps({"id": rec.id, "ts": rec.ts, "key": rec.key, "payload": rec.payload}) + "\n" for rec in records]
            + [line + "\n" for line in extra]
        )
    return path


def heard(pipeline: Pipeline, max_batch_rows: int | None = None) -> tuple[list, list]:
    """A run, as ``lakejoin run`` does it, with what it reported: (batches, everything else)."""
    said: list = []
    reports = run(
        pipeline.engine,
        pipeline.warehouse,
        pipeline.config.with_overrides(max_batch_rows=max_batch_rows),
        progress=said.append,
    )
    return reports, [item for item in said if item not in reports]


def bronze(pipeline: Pipeline, rel=R) -> list[dict]:
    frame = pipeline.engine.read(pipeline.warehouse.bronze(rel))
    return [] if frame is None else [row.asDict() for row in frame.orderBy("_arrival_seq").collect()]


def test_a_run_lands_the_new_files_of_every_folder_in_the_batch_that_joins_them_each_file_once(deltars, tmp_path):
    pipeline = landed(deltars, tmp_path)
    first = jsonl(
        pipeline, "r", "a.jsonl", RECORDS[:1], "", json.dumps({"id": "r2", "ts": 2, "key": "b"})
    )  # a blank line between
    with open(os.path.join(folder(pipeline, "r"), "b.csv"), "w", encoding="utf-8") as handle:
        handle.write("\nid,ts,key\nr5,5,a\n")  # a blank line before the header
    pq.write_table(
        pa.table({"id": ["s3", "s4"], "ts": [3, 4], "key": ["a", "b"]}),
        os.path.join(folder(pipeline, "s"), "c.parquet"),
    )

    (batch,), said = heard(pipeline)
    assert batch.arrivals == {"r": 3, "s": 2} and pipeline.gold_pairs() == Counter(batch_join(RECORDS))
    assert [
        (row["id"], os.path.basename(row["_source_file"]), row["_source_line"], row["_ingest_id"])
        for row in bronze(pipeline)
    ] == [("r1", "a.jsonl", 1, "batch 1"), ("r2", "a.jsonl", 3, "batch 1"), ("r5", "b.csv", 3, "batch 1")]
    assert [(row["id"], row["_source_line"]) for row in bronze(pipeline, S)] == [("s3", 1), ("s4", 2)]
    assert {landing.relation: (landing.landed, landing.quarantined, landing.duplicates) for landing in said} == {
        "r": (3, 0, 0),
        "s": (2, 0, 0),
    }
    (logged,) = pipeline.engine.read(pipeline.warehouse.batches).collect()
    assert sorted(os.path.basename(file["path"]) for file in logged["files"]) == ["a.jsonl", "b.csv", "c.parquet"]
    assert dict(logged["landed"]) == {"r": 3, "s": 2}

    assert heard(pipeline) == ([], [])  # nothing new: no file is read again, no batch
    shutil.copy(first, os.path.join(folder(pipeline, "r"), "copy-of-a.jsonl"))
    jsonl(pipeline, "s", "d.jsonl", [Record("s", "s6", 6, "a")])
    (batch,), said = heard(pipeline)
    assert batch.arrivals == {"r": 0, "s": 1}
    assert [item.describe() for item in said if isinstance(item, IngestResult)] == [
        f"{folder(pipeline, 'r')}/copy-of-a.jsonl: already ingested into bronze/r, nothing added"
    ]
    assert len(bronze(pipeline)) == 3 and pipeline.gold_pairs() == Counter(
        batch_join([*RECORDS, Record("s", "s6", 6, "a")])
    )


def test_a_landing_batch_is_measured_by_its_bronze_writes_as_a_job_reading_its_arrivals_back_would(
    deltars, tmp_path, monkeypatch
):
    """The second batch lands a late row and one a ``warn`` rule flags: what the bronze writes count for the batch
    (no measuring job runs) is what the measuring job counts when the writes do not."""
    settings = {
        "allowed_lateness": {"r": 0, "s": 0},
        "expectations": {"ts_max": 50, "policies": {"bronze_ts_plausible": "warn"}},
    }

    def logged(root, by_writes: bool) -> list[dict]:
        pipeline = landed(deltars, root, **settings)
        with monkeypatch.context() as patched:
            patched.setattr(silver, *("measure", unexpected) if by_writes else ("watched", lambda *_: None))
            jsonl(pipeline, "r", "a.jsonl", [Record("r", "r1", 10, "a"), Record("r", "r2", 20, "b")])
            jsonl(pipeline, "s", "b.jsonl", [Record("s", "s3", 15, "a")])
            pipeline.run()
            jsonl(pipeline, "r", "c.jsonl", [Record("r", "r4", 5, "a"), Record("r", "r5", 99, "a")])
            pipeline.run()
        keys = ("arrivals", "late", "watermarks", "pairs")
        rows = pipeline.engine.read(pipeline.warehouse.batches).orderBy("batch_id").collect()
        return [
            {
                **{key: row[key] for key in keys},
                "rules": sorted(row["rules"], key=lambda rule: (rule["table"], rule["rule"])),
            }
            for row in rows
        ]  # the tables' writes end in any order

    def unexpected(*_):
        raise AssertionError("a landing batch ran the measuring job")

    by_writes = logged(tmp_path / "writes", by_writes=True)
    assert by_writes == logged(tmp_path / "job", by_writes=False)
    second = by_writes[1]
    assert (dict(second["arrivals"]), dict(second["late"]), dict(second["watermarks"])) == (
        {"r": 2, "s": 0},
        {"r": 1, "s": 0},
        {"r": 99, "s": 15},
    )
    assert [
        (rule["rule"], rule["evaluated"], rule["failed"])
        for rule in second["rules"]
        if rule["table"].endswith("/r") and rule["failed"]
    ] == [("bronze_ts_plausible", 2, 1)]


def test_bad_rows_of_a_landing_file_are_quarantined_with_file_and_line_and_the_rest_joins(deltars, tmp_path):
    pipeline = landed(deltars, tmp_path)
    path = jsonl(pipeline, "r", "a.jsonl", RECORDS[:1], "{not json", json.dumps({"id": "r9", "ts": 9}))
    jsonl(pipeline, "r", "b.jsonl", RECORDS[1:2])  # no bad row: not read again for the rows set aside
    other = jsonl(pipeline, "r", "c.jsonl", [RECORDS[4]], json.dumps({"id": "r8", "key": "a"}))
    jsonl(pipeline, "s", "b.jsonl", RECORDS[2:3])
    (batch,), said = heard(pipeline)
    quarantined = sorted(
        (row["source_file"], row["source_line"], row["reason"])
        for row in pipeline.engine.read(pipeline.warehouse.quarantine).collect()
    )
    assert quarantined == [(path, 2, "unparsable line"), (path, 3, "missing key"), (other, 2, "missing ts")]
    assert [(landing.relation, landing.landed, landing.quarantined) for landing in said] == [("r", 3, 3), ("s", 1, 0)]
    assert pipeline.gold_pairs() == Counter(batch_join([RECORDS[0], RECORDS[1], RECORDS[2], RECORDS[4]]))


def test_a_file_refused_for_good_is_recorded_once_and_the_others_land(deltars, tmp_path):
    pipeline = landed(deltars, tmp_path)
    jsonl(pipeline, "r", "a.jsonl", RECORDS[:2])
    with open(os.path.join(folder(pipeline, "s"), "b.parquet"), "w", encoding="utf-8") as handle:
        handle.write("not parquet")
    jsonl(pipeline, "s", "c.jsonl", RECORDS[2:4])
    (batch,), said = heard(pipeline)
    (refused,) = [item for item in said if isinstance(item, IngestResult)]
    assert (
        refused.recorded
        and "b.parquet: not a readable Parquet file" in refused.describe()
        and refused.describe().endswith("not tried again")
    )
    assert pipeline.gold_pairs() == Counter(batch_join(RECORDS[:4]))
    (kept,) = pipeline.engine.read(pipeline.warehouse.quarantine).collect()
    assert (os.path.basename(kept["source_file"]), kept["source_line"], kept["lasting"]) == ("b.parquet", None, True)
    assert heard(pipeline) == ([], [])  # known by its path: not read, not reported again


def test_a_file_spark_cannot_read_is_left_to_a_later_batch_and_the_others_land(deltars, tmp_path):
    """A Parquet file whose footer reads but whose pages do not: refused for now (Spark's failure may pass), recorded
    as such, and tried again by the next run, which lands it once it reads."""
    pipeline = landed(deltars, tmp_path)
    good = pa.table({"id": [f"p{n}" for n in range(200)], "ts": list(range(200)), "key": ["a"] * 200})
    path = os.path.join(folder(pipeline, "r"), "pages.parquet")
    pq.write_table(good, path, compression="none")
    damaged = bytearray(open(path, "rb").read())
    damaged[4:64] = b"\xff" * 60  # the first page's header
    open(path, "wb").write(bytes(damaged))
    jsonl(pipeline, "r", "a.jsonl", RECORDS[:1])
    jsonl(pipeline, "s", "b.jsonl", RECORDS[2:3])
    (batch,), said = heard(pipeline)
    (refused,) = [item for item in said if isinstance(item, IngestResult)]
    assert (
        refused.refused.startswith(f"cannot ingest {path}: ")
        and not refused.recorded
        and "\n" not in refused.describe()
    )
    assert batch.arrivals == {"r": 1, "s": 1} and pipeline.gold_pairs() == Counter(batch_join([RECORDS[0], RECORDS[2]]))
    assert [(row["lasting"]) for row in pipeline.engine.read(pipeline.warehouse.quarantine).collect()] == [False]

    pq.write_table(good, path)  # readable now, at the same path
    (batch,), _ = heard(pipeline)
    assert batch.arrivals == {"r": 200, "s": 0} and len(bronze(pipeline)) == 201


STEPS = ["bronze_r", "bronze_s", "quarantine", "gold", "late_arrivals", "r_state", "s_state", "dq_quarantine", "commit"]


def first_landing_joined(engine, root) -> Pipeline:
    """Two landings of files, the first joined whole (with a bad line), the second (a late record, a bad line) not yet."""
    pipeline = landed(engine, root, allowed_lateness=2, window=3)
    jsonl(pipeline, "r", "1.jsonl", RECORDS[:2])
    jsonl(pipeline, "s", "1.jsonl", RECORDS[2:4], "{not json")
    pipeline.run()
    jsonl(pipeline, "r", "2.jsonl", [RECORDS[4], Record("r", "r0", 0, "a")])  # r0 is late
    jsonl(pipeline, "s", "2.jsonl", [Record("s", "s6", 6, "b")], "{bad")
    return pipeline


@pytest.fixture(scope="module")
def started(spark, tmp_path_factory) -> Pipeline:
    """Where every delta-rs crash of a landing batch starts: built once; each test copies its warehouse and reads the
    same landing folders."""
    from state.engines import make_engine

    return first_landing_joined(make_engine(spark, "delta-rs"), tmp_path_factory.mktemp("started"))


def with_bronze(pipeline: Pipeline) -> dict:
    """``snapshot`` with bronze's rows (without the time they were ingested)."""
    return {
        **pipeline.snapshot(),
        "bronze": Counter(
            tuple(sorted((k, v) for k, v in row.items() if k != "_ingested_at"))
            for rel in (R, S)
            for row in bronze(pipeline, rel)
        ),
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, started) -> dict:
    pipeline = copied(started, tmp_path_factory.mktemp("uninterrupted"))
    pipeline.run()
    return with_bronze(pipeline)


def test_runs_dying_at_each_write_of_a_landing_batch_in_turn_resume_to_the_uninterrupted_result(
    deltars, tmp_path, monkeypatch, started, uninterrupted
):
    """Each run resumes what the last left and dies at the next write, before and after each: every write's crash
    is met, from the state an earlier crash left."""
    pipeline = copied(started, tmp_path, deltars)
    crash_at_each(
        pipeline,
        monkeypatch,
        [f"{moment}:{step}" for step in STEPS for moment in ("before", "after")],
        max_batch_rows=1_000,
    )
    assert with_bronze(pipeline) == uninterrupted


def test_an_ingest_while_a_landing_batch_is_unfinished_takes_places_after_those_it_reserved(
    deltars, tmp_path, monkeypatch
):
    pipeline = landed(deltars, tmp_path)
    jsonl(pipeline, "r", "a.jsonl", RECORDS[:2])
    jsonl(pipeline, "s", "b.jsonl", RECORDS[2:4])
    monkeypatch.setenv(CRASH_AT, "after:bronze_r")
    with pytest.raises(InjectedCrash):
        pipeline.run()
    monkeypatch.delenv(CRASH_AT)
    later = Record("s", "s7", 7, "a")
    extra = os.path.join(str(tmp_path), "extra.jsonl")
    with open(extra, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": later.id, "ts": later.ts, "key": later.key}) + "\n")
    ingest_files(pipeline.engine, pipeline.warehouse, S, [extra], pipeline.config.relations)
    resumed, then = pipeline.run()
    assert (resumed.resumed, resumed.arrivals, then.arrivals) == (True, {"r": 2, "s": 2}, {"r": 0, "s": 1})
    assert pipeline.gold_pairs() == Counter(batch_join([*RECORDS[:4], later]))


def test_reset_keeps_the_landed_files_landed_and_the_rebuild_joins_them_again(deltars, tmp_path):
    pipeline = landed(deltars, tmp_path)
    jsonl(pipeline, "r", "a.jsonl", RECORDS[:2])
    jsonl(pipeline, "s", "b.jsonl", RECORDS[2:4])
    pipeline.run()
    before = pipeline.gold_pairs()
    reset(pipeline.engine, pipeline.warehouse)
    (rebuilt,) = pipeline.run()
    assert rebuilt.arrivals == {"r": 2, "s": 2} and pipeline.gold_pairs() == before
    assert len(bronze(pipeline)) == 2 and heard(pipeline) == ([], [])


@pytest.mark.spark_delta
def test_on_delta_spark_a_landing_batch_that_died_after_some_bronze_lands_the_rest_once(
    spark_engine, tmp_path, monkeypatch, uninterrupted
):
    pipeline = first_landing_joined(spark_engine, tmp_path)
    crash_at_each(pipeline, monkeypatch, ["after:bronze_r", "after:gold"], max_batch_rows=1_000)
    assert pipeline.gold_rows() and {name: rows for name, rows in pipeline.snapshot().items()} == {
        name: rows for name, rows in uninterrupted.items() if name != "bronze"
    }
