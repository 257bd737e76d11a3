"""Ingest on what a landing zone really receives: every row lands or is quarantined, or the file is refused in
one line with nothing of it written; never a traceback, and a bad file does not stop the others."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipelines.bronze.ingest import ingest_files, ingest_landing
from state.config import Config
from state.errors import FileRefused, LakejoinError
from state.join.relations import R, S
from state.names import storable, stored_names
from tests.helpers import Pipeline, damaged_parquet

FUZZ = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@pytest.fixture
def pipeline(deltars, tmp_path) -> Pipeline:
    return Pipeline(deltars, str(tmp_path))


def write(path: str, content: str | bytes) -> str:
    with open(path, "wb") as handle:
        handle.write(content.encode() if isinstance(content, str) else content)
    return path


def bronze_rows(pipeline: Pipeline, rel=R) -> list[dict]:
    frame = pipeline.engine.read(pipeline.warehouse.bronze(rel))
    return [] if frame is None else [row.asDict() for row in frame.orderBy("_arrival_seq").collect()]


def test_names_delta_cannot_store_are_mapped_by_one_rule_and_the_rest_are_kept():
    assert [storable(name, 3) for name in ("c.d", "a:b", "é", " id ", "a b", "x=y;z", "", "  ")] == [
        "c.d",
        "a:b",
        "é",
        "id",
        "a_b",
        "x_y_z",
        "unnamed_3",
        "unnamed_3",
    ]
    assert stored_names(["id", "a b", "c.d", ""]) == {"id": "id", "a b": "a_b", "c.d": "c.d", "": "unnamed_4"}
    for names, reason in (
        (["id", "key", "key"], "column 'key' appears twice"),
        (["a b", "a_b"], "columns 'a b' and 'a_b' would both be stored as 'a_b'"),
        (["Key", "key"], "columns 'Key' and 'key' differ only in case"),
    ):
        with pytest.raises(ValueError, match=reason):
            stored_names(names)


def test_keys_with_dots_and_spaces_land_and_a_predicate_names_them_with_backticks(engine, tmp_path):
    """Flattened JSON keys are kept (``c.d``) or stored by the rule (``a b`` as ``a_b``), and joined on either engine."""
    pipeline = Pipeline(engine, str(tmp_path), Config.of(predicate="r.`c.d` = s.`c.d` AND r.a_b = s.a_b"))
    r_file = pipeline.write_file(
        [{"id": "w1", "ts": 1, "key": "k", "a b": 1, "c.d": 2}, {"id": "w2", "ts": 2, "key": "k", "a b": 3, "c.d": 4}]
    )
    s_file = pipeline.write_file(
        [{"id": "v1", "ts": 3, "key": "k", "a b": 3, "c.d": 4}, {"id": "v2", "ts": 4, "key": "k", "a b": 1, "c.d": 9}]
    )
    assert (pipeline.ingest("r", r_file).landed, pipeline.ingest("s", s_file).landed) == (2, 2)
    assert [(row["id"], row["a_b"], row["c.d"]) for row in bronze_rows(pipeline)] == [("w1", 1, 2), ("w2", 3, 4)]
    pipeline.run()
    assert [(row["r_id"], row["s_id"], row["r_c.d"], row["s_a_b"]) for row in pipeline.gold_rows()] == [
        ("w2", "v1", 4, 3)
    ]


def test_parquet_fields_delta_cannot_store_are_mapped_and_such_nested_fields_kept_as_json(pipeline, tmp_path):
    path = str(tmp_path / "fields.parquet")
    point = pa.array([{"x y": 1, "z": 2}], pa.struct([("x y", pa.int64()), ("z", pa.int64())]))
    pq.write_table(
        pa.table({"id": ["p"], "ts": [1], "key": ["k"], " unit price ": [2.5], "": ["blank"], "point": point}), path
    )
    assert pipeline.ingest("r", path).landed == 1
    [row] = bronze_rows(pipeline)
    assert (row["unit_price"], row["unnamed_5"], row["point"]) == (2.5, "blank", '{"x y":1,"z":2}')


def test_a_file_that_cannot_be_read_as_a_whole_is_refused_in_one_line_and_the_other_files_land(
    pipeline, spark, tmp_path
):
    """The issue's other two files, and the rest of a landing zone's unreadable kinds, each between good files."""
    good = [pipeline.write_file([{"id": f"g{n}", "ts": n, "key": "k"}]) for n in range(2)]
    bad = {
        write(
            str(tmp_path / "repeats.csv"), "id,ts,key,key\na,1,k,k2\n"
        ): "column 'key' appears twice: rename one of them",
        write(
            str(tmp_path / "truncated.parquet"), b"PAR1\x00\x01garbage"
        ): "not a readable Parquet file (Parquet magic bytes not found",
        write(
            str(tmp_path / "zipped.jsonl"), gzip.compress(b'{"id": "z", "ts": 1, "key": "k"}\n')
        ): "it is gzip-compressed: decompress it first",
        write(
            str(tmp_path / "wide.csv"), "id,ts,key\n".encode("utf-16")
        ): "it is UTF-16 text, and lakejoin reads UTF-8: convert it",
        write(
            str(tmp_path / "cases.jsonl"),
            '{"id": "a", "ts": 1, "key": "k", "Amount": 1}\n{"id": "b", "ts": 2, "key": "k", "amount": 2}\n',
        ): ("columns 'Amount' and 'amount' differ only in case"),
        write(
            str(tmp_path / "reserved.jsonl"), '{"id": "a", "ts": 1, "key": "k", " _x": 1}\n'
        ): "column '_x' starts with '_'",
    }
    pq.write_table(pa.table({"id": ["p"], "ts": [1], "key": ["k"]}), str(tmp_path / "data.parquet"))
    bad[write(str(tmp_path / "misnamed.csv"), (tmp_path / "data.parquet").read_bytes())] = (
        "it is a Parquet file: name it .parquet"
    )
    results = ingest_files(pipeline.engine, pipeline.warehouse, R, [good[0], *bad, good[1]], pipeline.config.relations)
    assert [result.landed for result in (results[0], results[-1])] == [1, 1]
    for result, (file, reason) in zip(results[1:-1], bad.items()):
        assert (
            result.refused is not None
            and result.refused.startswith(f"cannot ingest {file}: ")
            and reason in result.refused
        )
        assert "\n" not in result.describe() and result.describe().endswith("nothing of it was written")
    assert [row["id"] for row in bronze_rows(pipeline)] == ["g0", "g1"]
    assert pipeline.engine.version(pipeline.warehouse.quarantine) is None
    with pytest.raises(FileRefused, match="appears twice"):
        pipeline.ingest("r", list(bad)[0])


def test_a_file_spark_fails_to_read_in_the_write_under_an_error_naming_no_file_is_found_and_refused_alone(
    engine, tmp_path, monkeypatch
):
    """Spark's failure inside the write's job need not name its file: each file is then read alone, the one at fault
    refused in one line, and the call's other files land in the same call, in one commit."""
    from pipelines.bronze import write as bronze

    pipeline = Pipeline(engine, str(tmp_path))
    good = [pipeline.write_file([{"id": f"g{n}", "ts": n, "key": "k"}]) for n in range(2)]
    damaged = damaged_parquet(str(tmp_path / "damaged.parquet"))
    monkeypatch.setattr(bronze, "_names", lambda error, path: False)  # as an error that names no file
    results = ingest_files(engine, pipeline.warehouse, R, [good[0], damaged, good[1]])
    assert [result.landed for result in results] == [1, 0, 1]
    assert results[1].refused.startswith(
        f"cannot ingest {damaged}: a Parquet data page cannot be read, the file is damaged ("
    )
    assert "\n" not in results[1].describe()
    assert [row["id"] for row in bronze_rows(pipeline)] == ["g0", "g1"] and engine.version(
        pipeline.warehouse.bronze(R)
    ) == 0


def test_a_refused_landing_file_is_recorded_once_and_not_tried_again(pipeline, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    write(str(landing / "1.jsonl"), '{"id": "a", "ts": 1, "key": "k"}\n')
    write(str(landing / "2.parquet"), b"not parquet at all")
    write(str(landing / "3.csv"), "id,ts,key\nb,2,k\n")
    reports = []
    for _ in range(2):
        ingest_landing(pipeline.engine, pipeline.warehouse, R, str(landing), None, reports.append)
    first, again = reports[:3], reports[3:]
    assert [(r.landed, r.refused is not None, r.recorded) for r in first] == [
        (1, False, False),
        (0, True, True),
        (1, False, False),
    ]
    assert "recorded in quarantine/ingest and not tried again" in first[1].describe()
    assert [(r.already_ingested, r.already_refused) for r in again] == [(True, False), (False, True), (True, False)]
    quarantine = pipeline.engine.read(pipeline.warehouse.quarantine).collect()
    assert [(row.source_file, row.source_line) for row in quarantine] == [(str(landing / "2.parquet"), None)]
    assert quarantine[0].reason.startswith(f"cannot ingest {landing / '2.parquet'}: not a readable Parquet file")
    assert [row["id"] for row in bronze_rows(pipeline)] == ["a", "b"]
    with pytest.raises(FileRefused):  # given by hand, a refused file is tried again (and refused again)
        pipeline.ingest("r", str(landing / "2.parquet"))


def test_a_landing_file_that_cannot_be_read_is_refused_unrecorded_and_ingested_once_it_can_be(pipeline, tmp_path):
    """A file listed but gone before it is read (here a link to nothing): reported, not recorded, tried again."""
    landing, target = tmp_path / "landing", tmp_path / "later.jsonl"
    landing.mkdir()
    os.symlink(target, landing / "vanished.jsonl")
    reports = []
    ingest_landing(pipeline.engine, pipeline.warehouse, R, str(landing), None, reports.append)
    assert (
        reports[0].describe()
        == f"cannot ingest {landing / 'vanished.jsonl'}: cannot read it (No such file or directory); nothing of it was written"
    )
    assert pipeline.versions() == {name: None for name in pipeline.versions()}
    write(str(target), '{"id": "a", "ts": 1, "key": "k"}\n')
    ingest_landing(pipeline.engine, pipeline.warehouse, R, str(landing), None, reports.append)
    assert reports[1].landed == 1


def test_a_landing_file_spark_fails_to_read_is_refused_unrecorded_and_a_config_error_stops_the_command(
    pipeline, tmp_path
):
    """A Parquet file whose footer reads but whose pages do not: Spark's failure may be passing, so the file is
    tried again. A config error is nobody's file: the command stops, and no landing file is marked refused."""
    landing = tmp_path / "landing"
    landing.mkdir()
    pq.write_table(
        pa.table({"id": [f"p{n}" for n in range(200)], "ts": list(range(200)), "key": ["k"] * 200}),
        str(landing / "pages.parquet"),
        compression="none",
    )
    damaged = bytearray((landing / "pages.parquet").read_bytes())
    damaged[4:64] = b"\xff" * 60  # the first page's header
    (landing / "pages.parquet").write_bytes(bytes(damaged))
    reports = []
    ingest_landing(pipeline.engine, pipeline.warehouse, R, str(landing), None, reports.append)
    [refused] = reports
    assert (
        refused.refused.startswith(f"cannot ingest {landing / 'pages.parquet'}: ")
        and not refused.recorded
        and "\n" not in refused.describe()
    )
    assert pipeline.versions() == {name: None for name in pipeline.versions()}
    typo = {"r": {"id": "id", "event_time": "ts", "columns": {"amount": "dubble"}}, "s": {}}
    with pytest.raises(LakejoinError, match="relations.r.columns has a type Spark does not know") as stopped:
        ingest_landing(
            pipeline.engine,
            pipeline.warehouse,
            R,
            str(landing),
            None,
            reports.append,
            Config.of(relations=typo).relations,
        )
    assert not isinstance(stopped.value, FileRefused) and pipeline.versions() == {
        name: None for name in pipeline.versions()
    }


def test_a_column_bronze_has_under_another_case_lands_in_it(pipeline, tmp_path):
    """Delta holds one column per name whatever its case: ``Amount`` goes to bronze's ``amount``."""
    pipeline.ingest("r", pipeline.write_file([{"id": "a", "ts": 1, "key": "k", "amount": 1}]))
    pipeline.ingest("r", pipeline.write_file([{"id": "b", "ts": 2, "key": "k", "Amount": 2}]))
    assert [(row["id"], row["amount"]) for row in bronze_rows(pipeline)] == [("a", 1), ("b", 2)]
    assert "Amount" not in pipeline.engine.schema(pipeline.warehouse.bronze(R)).fieldNames()


def test_values_nested_deeper_than_python_recurses_are_refused_in_one_line(pipeline, tmp_path):
    path = write(
        str(tmp_path / "deep.jsonl"), '{"id": "a", "ts": 1, "key": "k", "deep": ' + "[" * 600 + "]" * 600 + "}\n"
    )
    with pytest.raises(FileRefused, match="nested too deeply to read") as refused:
        pipeline.ingest("r", path)
    assert refused.value.lasting and pipeline.engine.version(pipeline.warehouse.bronze(R)) is None


def test_a_config_naming_a_column_delta_cannot_store_says_what_bronze_calls_it():
    with pytest.raises(LakejoinError, match="relations.r.id names 'order id', which bronze stores as 'order_id'"):
        Config.of(relations={"r": {"id": "order id", "event_time": "ts"}, "s": {}})


def test_a_byte_order_mark_and_crlf_line_ends_do_not_cost_the_first_row(pipeline, tmp_path):
    json_file = write(
        str(tmp_path / "bom.jsonl"),
        "\ufeff" + '{"id": "a", "ts": 1, "key": "k"}\r\n{"id": "b", "ts": 2, "key": "k"}\r\n',
    )
    csv_file = write(
        str(tmp_path / "bom.csv"), "\ufeff\r\n\r\nid,ts,key\r\nc,3,k\r\n"
    )  # blank lines before the header too
    assert [
        (result.landed, result.quarantined)
        for result in (pipeline.ingest("r", json_file), pipeline.ingest("r", csv_file))
    ] == [(2, 0), (1, 0)]
    assert [(row["id"], row["key"]) for row in bronze_rows(pipeline)] == [("a", "k"), ("b", "k"), ("c", "k")]


def test_a_key_only_a_latin_1_line_has_lands_with_the_line(pipeline, tmp_path):
    """Spark's JSON reader gives up on a line that is not UTF-8; lakejoin reads it as text (U+FFFD for the byte),
    so the row and its key land. A NUL inside a string is no JSON: that line is quarantined."""
    path = write(
        str(tmp_path / "latin.jsonl"),
        b'{"id": "a", "ts": 1, "key": "k", "note": "caf\xe9"}\n{"id": "b", "ts": 2, "key": "k", "x": "\x00"}\n',
    )
    result = pipeline.ingest("r", path)
    assert (result.landed, result.quarantined) == (1, 1)
    assert [(row["id"], row["note"]) for row in bronze_rows(pipeline)] == [("a", "caf\ufffd")]


def test_a_nested_value_its_own_inferred_type_does_not_fit_is_kept_as_json_text(pipeline, tmp_path):
    """Spark infers ``""`` as null, so ``["", []]`` reads as an array of arrays its ``""`` does not fit: the column
    is kept as JSON text rather than the row quarantined (found by the fuzz test below)."""
    mixed = pipeline.write_file([{"id": "a", "ts": 1, "key": "k", "tags": ["", []], "point": {"x": 1}}])
    assert (
        pipeline.ingest("r", mixed).landed,
        pipeline.engine.schema(pipeline.warehouse.bronze(R))["tags"].dataType.simpleString(),
    ) == (1, "string")
    [row] = bronze_rows(pipeline)
    assert (row["tags"], row["point"].x) == ('["",[]]', 1)


# Fuzz: whatever a file holds, its ingest lands and quarantines every row, or refuses it in one line.

NAME_CHARACTERS = st.sampled_from(list("abAB_ .,;:{}()=`'\"\t-é1"))
NAMES = st.text(NAME_CHARACTERS, max_size=4)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(NAMES, inner, max_size=2),
    max_leaves=4,
)
BAD_LINES = st.sampled_from(
    ["not json", "{", "[1, 2]", "42", '{"id": null}', '"text"', "\x00\x01", "é\udcff"]
) | st.text(max_size=12)


def rows_in(content: bytes, header: bool = False) -> int:
    """The rows Spark reads from a text file: non-blank lines (a byte-order mark and spaces do not count), split at
    CR, LF or CRLF; with a header, those after it, the first line with a value (blank lines before it are skipped)."""
    lines = re.split(r"\r\n|\r|\n", content.decode("utf-8", "replace"))
    if header:
        first = next((number for number, line in enumerate(lines) if re.sub(r'[\s,"\ufeff]', "", line)), len(lines))
        lines = lines[first + 1 :]
    return sum(1 for line in lines if line.removeprefix("\ufeff").strip(" "))


def check_ingest(pipeline: Pipeline, rel, path: str, lines: int, good: dict[str, dict]) -> None:
    """The file is refused in one line with nothing written, or every line is accounted for and no good row is
    lost (its extra values kept under their stored names)."""
    before = pipeline.versions()
    [result] = ingest_files(pipeline.engine, pipeline.warehouse, rel, [path])
    if result.refused is not None:
        assert "\n" not in result.describe() and result.refused.startswith(f"cannot ingest {path}: ")
        assert pipeline.versions() == before
        return
    assert result.landed + result.quarantined + result.duplicates == lines
    landed = {row["id"]: row for row in bronze_rows(pipeline, rel)}
    assert set(good) <= set(landed), result.describe()
    # Spark's JSON reader drops a key whose values are all empty objects or arrays: only scalar values are checked
    scalar = lambda value: not isinstance(value, (dict, list))  # noqa: E731
    names = stored_names(
        list({name: None for record in good.values() for name, value in record.items() if scalar(value)})
    )
    for record_id, record in good.items():
        for name, value in record.items():
            if name.strip() and scalar(value):  # a blank name's stored name depends on its place
                assert landed[record_id][names[name]] in (
                    value,
                    None if value is None else str(value).lower() if isinstance(value, bool) else str(value),
                )


def fresh(deltars) -> Pipeline:
    return Pipeline(deltars, tempfile.mkdtemp(prefix="fuzz-"))


@FUZZ
@given(
    extras=st.lists(st.dictionaries(NAMES, VALUES, max_size=3), min_size=1, max_size=4),
    bad=st.lists(BAD_LINES, max_size=3),
    data=st.data(),
)
def test_json_lines_with_any_keys_and_values(deltars, extras, bad, data):
    pipeline = fresh(deltars)
    good = {f"g{n}": {**extra, "id": f"g{n}", "ts": n, "key": "k"} for n, extra in enumerate(extras)}
    lines = [json.dumps(record) for record in good.values()] + [line for line in bad if line.strip()]
    content = "\n".join(data.draw(st.permutations(lines))).encode("utf-8", "surrogateescape")
    path = write(os.path.join(pipeline.root, "fuzz.jsonl"), content)
    check_ingest(pipeline, R, path, rows_in(content), good)


@FUZZ
@given(header=st.lists(NAMES, min_size=1, max_size=4), width=st.integers(0, 6), rows=st.integers(1, 4))
def test_csv_with_any_header(deltars, header, width, rows):
    pipeline = fresh(deltars)
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(
        [["id", "ts", "key", *header], *([f"c{n}", n, "k", *(["v"] * width)] for n in range(rows))]
    )
    path = write(os.path.join(pipeline.root, "fuzz.csv"), text.getvalue())
    good = {f"c{n}": {} for n in range(rows)} if width == len(header) else {}
    check_ingest(pipeline, S, path, rows, good)


@FUZZ
@given(content=st.binary(max_size=64), extension=st.sampled_from([".jsonl", ".csv", ".parquet"]))
@example(content=b"\n*", extension=".csv")  # a blank line before the header: its one line is the header
def test_random_bytes(deltars, content, extension):
    pipeline = fresh(deltars)
    path = write(os.path.join(pipeline.root, f"fuzz{extension}"), content)
    check_ingest(pipeline, R, path, rows_in(content, header=extension == ".csv"), {})
