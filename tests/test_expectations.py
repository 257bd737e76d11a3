"""Data-quality rules: each one passing and failing on purpose-built rows, the suites as data, the config."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame

from expectations.batch import EVALUATED, TableChecks, bound_rules
from expectations.frames import with_pair_checks, with_state_checks
from expectations.rules import RULES, check_policies
from expectations.runner import Validator
from state.config import Config
from state.engines import Eviction, Memberships, as_frame
from state.errors import LakejoinError
from state.join.joiner import Projection
from state.join.relations import RELATIONS

CONFIG = Config.of(window=5, expectations={"ts_min": 0, "ts_max": 1_000}).on_axis("integer")
# A bronze row: what ingest derives (_id, _ts), then the record's own columns.
RECORD = {"_id": "x1", "_ts": 10, "id": "x1", "ts": 10, "key": "a", "payload": "p"}
KEYS = ["_id"]
PAIR_KEYS = ["_r_id", "_s_id"]
CARRIED = Projection({"r": ("key",), "s": ("key",)})


def bronze(*changes: dict, schema: pa.Schema | None = None) -> pa.Table:
    """Two good records, then one per change applied to a good record (the rows a rule should catch)."""
    rows = [RECORD, {**RECORD, "_id": "x2"}] + [
        {**RECORD, "_id": f"bad{n}", **change} for n, change in enumerate(changes)
    ]
    return pa.Table.from_pylist(rows, schema)


def state(spark, rows: pa.Table, late_ids: list[str] = (), watermark: int | None = None) -> DataFrame:
    """A state table's rows, each in its store (no cutoff) and in R's probe buffer (cutoff ``watermark``)."""
    in_buffers = rows.append_column("_in_store", pa.array([True] * rows.num_rows)).append_column(
        "_in_r_probes", pa.array([True] * rows.num_rows)
    )
    cutoffs = Memberships(
        {"_in_store": None, "_in_r_probes": None if watermark is None else Eviction("_ts", watermark)}
    )
    late = " OR ".join(f"_id = '{late}'" for late in late_ids) or "false"
    return with_state_checks(as_frame(spark, in_buffers), late, cutoffs)


def gold(spark, *changes: dict) -> DataFrame:
    good = {"_r_id": "r1", "_r_ts": 1, "_s_id": "s1", "_s_ts": 2, "r_key": "a", "s_key": "a", "owner": "R"}
    rows = [good, {**good, "_s_id": "s2", "_s_ts": 3}] + [
        {**good, "_s_id": f"bad{n}", "_s_ts": 4, **change} for n, change in enumerate(changes)
    ]
    frame = spark.createDataFrame(
        rows, "_r_id string, _r_ts bigint, _s_id string, _s_ts bigint, r_key string, s_key string, owner string"
    )
    empty = spark.createDataFrame([], "_id string, _ts bigint, key string, payload string")
    return with_pair_checks(frame, CONFIG.join_condition, CARRIED, RELATIONS, lambda: dict.fromkeys(RELATIONS, empty))


def frame(spark, rows: pa.Table | DataFrame) -> DataFrame:
    return rows if isinstance(rows, DataFrame) else as_frame(spark, rows)


STRING_TS = pa.schema([("_id", pa.string()), ("_ts", pa.string())])
INT_ID = pa.schema([("_id", pa.int64()), ("_ts", pa.int64())])

# rule -> (target, key columns, rows that pass it, rows that break it, how many rows break it)
CASES = {
    "bronze_columns_present": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze().drop_columns(["key"]), 2),
    "bronze_id_is_string": (
        "bronze",
        KEYS,
        lambda s: bronze(),
        lambda s: pa.table({"_id": [1, 2], "_ts": [1, 2]}, INT_ID),
        2,
    ),
    "bronze_ts_is_integer": (
        "bronze",
        KEYS,
        lambda s: bronze(),
        lambda s: pa.table({"_id": ["x1", "x2"], "_ts": ["1", "soon"]}, STRING_TS),
        2,
    ),
    "bronze_id_not_null": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze({"_id": None}), 1),
    "bronze_ts_not_null": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze({"_ts": None}), 1),
    "bronze_id_unique": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze({"_id": "x1"}), 2),
    "bronze_ts_plausible": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze({"_ts": -5}, {"_ts": 5_000}), 2),
    "state_id_unique": ("state", KEYS, lambda s: state(s, bronze()), lambda s: state(s, bronze({"_id": "x2"})), 2),
    "state_not_late": (
        "state",
        KEYS,
        lambda s: state(s, bronze(), ["elsewhere"]),
        lambda s: state(s, bronze(), ["x2"]),
        1,
    ),
    "state_above_cutoff": (
        "state",
        KEYS,
        lambda s: state(s, bronze(), watermark=10),
        lambda s: state(s, bronze({"_ts": 9}), watermark=10),
        1,
    ),
    "gold_pair_unique": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"_s_id": "s1", "_s_ts": 2}), 2),
    "gold_predicate_true": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"s_key": "b"}), 1),
    "gold_owner_consistent": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"owner": "S"}), 1),
    "gold_within_window": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"_s_ts": 7}), 1),
    "gold_unmatched_preserved": (
        "gold",
        PAIR_KEYS,
        lambda s: gold(s),
        lambda s: gold(s, {"_s_id": None, "_s_ts": None}),
        1,
    ),
}


@pytest.fixture(scope="module")
def validator(spark) -> Validator:
    return Validator(spark)


def test_every_rule_of_every_suite_has_a_case():
    assert sorted(CASES) == sorted(rule.name for rule in RULES)


def checked(
    rows: DataFrame, target: str, keys: list[str], name: str, policy: str | None = None
) -> tuple[TableChecks, DataFrame, dict]:
    """One rule compiled as a batch checks it: its checks, the rows flagged, and what the rows' job counts."""
    config = (
        CONFIG.config
        if policy is None
        else Config.of(window=5, expectations={"ts_min": 0, "ts_max": 1_000, "policies": {name: policy}})
    )
    checks = TableChecks.of(config.on_axis("integer"), target, "t", keys, "r")
    checks = TableChecks("t", tuple(keys), tuple(check for check in checks.checks if check.rule.name == name))
    flagged = checks.flagged(rows)
    return checks, flagged, flagged.agg(*checks.metrics()).first().asDict()


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rule_passes_on_good_rows_and_fails_on_the_rows_that_break_it_as_great_expectations_says(
    spark, validator, name
):
    """A batch's compiled rule against Great Expectations (validate's) on the same rows: same verdict, same count."""
    target, keys, good, bad, failing = CASES[name]
    rules = bound_rules(
        CONFIG, target, "r"
    )  # all of the target's, as validate checks them (a table rule alone counts no rows)
    for rows, expected in ((frame(spark, good(spark)), 0), (frame(spark, bad(spark)), failing)):
        (by_ge,) = [result for result in validator.check("t", rows, keys, rules) if result.rule.name == name]
        checks, flagged, counts = checked(rows, target, keys, name)
        (compiled,) = checks.results(flagged, counts)
        assert (compiled.failed, by_ge.failed) == (expected, expected)
        assert compiled.evaluated == by_ge.evaluated >= 2
    if by_ge.rule.row_level:
        assert len(json.loads(compiled.examples)) == failing and all(
            example.startswith(keys[0]) for example in json.loads(compiled.examples)
        )


def test_a_quarantine_rule_takes_its_rows_out_of_the_write_and_keeps_them_with_the_rule(spark):
    rows = gold(spark, {"s_key": "b"}, {"s_key": "c"})
    checks, flagged, counts = checked(rows, "gold", PAIR_KEYS, "gold_predicate_true", "quarantine")
    results = checks.results(flagged, counts)
    assert sorted(row["_s_id"] for row in checks.written(flagged).collect()) == ["s1", "s2"]
    assert not any(column.startswith("_dq_") for column in checks.written(flagged).columns)
    taken = checks.set_aside(flagged, results, 7).collect()
    assert sorted((row["batch_id"], row["rule"], row["row_key"]) for row in taken) == [
        (7, "gold_predicate_true", "r1|bad0"),
        (7, "gold_predicate_true", "r1|bad1"),
    ]
    assert json.loads(taken[0]["row"])["s_key"] in ("b", "c")


def test_a_fail_rule_stops_the_job_that_writes_its_rows_and_names_the_rule(spark):
    rows = gold(spark, {"owner": "S"})
    checks, flagged, _ = checked(rows, "gold", PAIR_KEYS, "gold_owner_consistent")
    with pytest.raises(Exception) as stopped:
        checks.written(flagged).collect()
    assert checks.broke(stopped.value)
    failure = checks.failure(flagged, 3, written=True)
    assert str(failure).startswith(
        "batch 3 stopped, not committed: rule gold_owner_consistent (expect_column_pair_values_to_be_equal) failed on 1 of 3 rows of t, e.g. _r_id=r1, _s_id=bad0"
    )
    assert EVALUATED not in str(failure)


def test_a_predicate_over_columns_gold_does_not_keep_is_checked_on_the_bronze_records(spark):
    pairs = spark.createDataFrame(
        [("r1", 1, "s1", 2, "a", "a", "R"), ("r2", 1, "s1", 2, "a", "a", "R")],
        "_r_id string, _r_ts bigint, _s_id string, _s_ts bigint, r_key string, s_key string, owner string",
    )
    r = spark.createDataFrame([("r1", 1, "a", 1), ("r2", 1, "a", 9)], "_id string, _ts bigint, key string, x int")
    s = spark.createDataFrame([("s1", 2, "a", 5)], "_id string, _ts bigint, key string, y int")
    checked = with_pair_checks(pairs, "r.x < s.y", CARRIED, RELATIONS, lambda: dict(zip(RELATIONS, (r, s))))
    assert {row["_r_id"]: row["_dq_predicate"] for row in checked.collect()} == {"r1": True, "r2": False}


def test_rules_skip_when_their_parameter_is_unset():
    assert "gold_within_window" not in {rule.name for rule, _, _ in bound_rules(Config.of().on_axis("integer"), "gold")}
    assert "gold_within_window" in {rule.name for rule, _, _ in bound_rules(CONFIG, "gold")}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"policies": {"no_such_rule": "warn"}}, "unknown rule 'no_such_rule'"),
        ({"policies": {"gold_pair_unique": "drop"}}, "policy must be one of warn, quarantine, fail"),
        ({"policies": {"bronze_columns_present": "quarantine"}}, "cannot quarantine rows"),
        ({"engine": "spark"}, "'expectations.engine' is retired"),
        ({"ts_max": "soon"}, "'expectations.ts_max' must be an integer"),
        ({"strict": True}, "unknown setting 'strict'"),
    ],
)
def test_bad_expectation_settings_are_refused_with_one_line(settings, message):
    with pytest.raises(LakejoinError, match=message) as error:
        check_policies(
            Config.of(expectations=settings).quality
        )  # the shape by the config, the rules named by the suites
    assert "\n" not in str(error.value)
