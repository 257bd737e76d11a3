"""Data-quality rules: each one passing and failing on purpose-built rows, the suites as data, the config."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pyspark.sql import DataFrame

from expectations.batch import BatchChecks, bound_rules
from expectations.frames import with_pair_checks, with_state_checks_local
from expectations.rules import RULES, check_policies
from expectations.runner import Validator
from state.config import Config
from state.engines import Eviction, Memberships
from state.errors import LakejoinError
from state.joiner import Projection
from state.relations import RELATIONS

CONFIG = Config(window=5, expectations={"ts_min": 0, "ts_max": 1_000})
# A bronze row: what ingest derives (_id, _ts), then the record's own columns.
RECORD = {"_id": "x1", "_ts": 10, "id": "x1", "ts": 10, "key": "a", "payload": "p"}
KEYS = ["_id"]
PAIR_KEYS = ["_r_id", "_s_id"]
CARRIED = Projection({"r": ("key",), "s": ("key",)})


def bronze(*changes: dict, schema: pa.Schema | None = None) -> pa.Table:
    """Two good records, then one per change applied to a good record (the rows a rule should catch)."""
    rows = [RECORD, {**RECORD, "_id": "x2"}] + [{**RECORD, "_id": f"bad{n}", **change} for n, change in enumerate(changes)]
    return pa.Table.from_pylist(rows, schema)


def state(rows: pa.Table, late_ids: list[str] = (), watermark: int | None = None) -> pa.Table:
    """A state table's rows, each in its store (no cutoff) and in R's probe buffer (cutoff ``watermark``)."""
    in_buffers = rows.append_column("_in_store", pa.array([True] * rows.num_rows)).append_column("_in_r_probes", pa.array([True] * rows.num_rows))
    cutoffs = Memberships({"_in_store": None, "_in_r_probes": None if watermark is None else Eviction("_ts", watermark)})
    return with_state_checks_local(in_buffers, pa.table({"_id": pa.array(list(late_ids), pa.string())}), cutoffs)


def gold(spark, *changes: dict) -> pa.Table:
    good = {"_r_id": "r1", "_r_ts": 1, "_s_id": "s1", "_s_ts": 2, "r_key": "a", "s_key": "a", "owner": "R"}
    rows = [good, {**good, "_s_id": "s2", "_s_ts": 3}] + [{**good, "_s_id": f"bad{n}", "_s_ts": 4, **change} for n, change in enumerate(changes)]
    frame = spark.createDataFrame(rows, "_r_id string, _r_ts bigint, _s_id string, _s_ts bigint, r_key string, s_key string, owner string")
    empty = spark.createDataFrame([], "_id string, _ts bigint, key string, payload string")
    return with_pair_checks(frame, CONFIG.join_condition, CARRIED, RELATIONS, lambda: dict.fromkeys(RELATIONS, empty)).toArrow()


STRING_TS = pa.schema([("_id", pa.string()), ("_ts", pa.string())])
INT_ID = pa.schema([("_id", pa.int64()), ("_ts", pa.int64())])

# rule -> (target, key columns, rows that pass it, rows that break it, how many rows break it)
CASES = {
    "bronze_columns_present": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze().drop_columns(["key"]), 2),
    "bronze_id_is_string": ("bronze", KEYS, lambda s: bronze(), lambda s: pa.table({"_id": [1, 2], "_ts": [1, 2]}, INT_ID), 2),
    "bronze_ts_is_integer": ("bronze", KEYS, lambda s: bronze(), lambda s: pa.table({"_id": ["x1", "x2"], "_ts": ["1", "soon"]}, STRING_TS), 2),
    "bronze_id_not_null": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze({"_id": None}), 1),
    "bronze_ts_not_null": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze({"_ts": None}), 1),
    "bronze_id_unique": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze({"_id": "x1"}), 2),
    "bronze_ts_plausible": ("bronze", KEYS, lambda s: bronze(), lambda s: bronze({"_ts": -5}, {"_ts": 5_000}), 2),
    "state_id_unique": ("state", KEYS, lambda s: state(bronze()), lambda s: state(bronze({"_id": "x2"})), 2),
    "state_not_late": ("state", KEYS, lambda s: state(bronze(), ["elsewhere"]), lambda s: state(bronze(), ["x2"]), 1),
    "state_above_cutoff": ("state", KEYS, lambda s: state(bronze(), watermark=10), lambda s: state(bronze({"_ts": 9}), watermark=10), 1),
    "gold_pair_unique": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"_s_id": "s1", "_s_ts": 2}), 2),
    "gold_predicate_true": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"s_key": "b"}), 1),
    "gold_owner_consistent": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"owner": "S"}), 1),
    "gold_within_window": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"_s_ts": 7}), 1),
    "gold_unmatched_preserved": ("gold", PAIR_KEYS, lambda s: gold(s), lambda s: gold(s, {"_s_id": None, "_s_ts": None}), 1),
}


@pytest.fixture(scope="module")
def validator(spark) -> Validator:
    return Validator(spark)


def test_every_rule_of_every_suite_has_a_case():
    assert sorted(CASES) == sorted(rule.name for rule in RULES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rule_passes_on_good_rows_and_fails_on_the_rows_that_break_it(spark, validator, name):
    target, keys, good, bad, failing = CASES[name]
    rules = [chosen for chosen in bound_rules(CONFIG, target, "r") if chosen[0].name == name]
    (passed,) = validator.check("t", good(spark), keys, rules, "pandas")
    assert passed.passed and passed.evaluated >= 2
    (failed,) = validator.check("t", bad(spark), keys, rules, "pandas")
    assert not failed.passed and failed.failed == failing
    if failed.rule.row_level:
        assert len(failed.failing) == failing and all(set(row) == set(keys) for row in failed.failing)


def test_the_spark_engine_reaches_the_same_verdicts(spark, validator):
    rows = bronze({"_id": None}, {"_id": "x1"}, {"_ts": 5_000})
    rules = bound_rules(CONFIG, "bronze", "r")
    on_pandas = {r.rule.name: r.failed for r in validator.check("t", rows, KEYS, rules, "pandas")}
    on_spark = {r.rule.name: r.failed for r in validator.check("t", rows, KEYS, rules, "spark")}
    assert on_spark == on_pandas
    assert {name for name, failed in on_spark.items() if failed} == {"bronze_id_not_null", "bronze_id_unique", "bronze_ts_plausible"}


def test_pairs_too_many_for_the_driver_are_screened_in_spark_with_the_same_verdicts_and_quarantine(spark, validator):
    policies = {"gold_predicate_true": "quarantine", "gold_owner_consistent": "quarantine", "gold_pair_unique": "warn"}
    config = Config(window=5, expectations={"policies": policies})
    rows = gold(spark, {"s_key": "b"}, {"owner": "S"}, {"_s_id": "s1", "_s_ts": 2})
    on_driver, in_spark = BatchChecks(validator, config, 7), BatchChecks(validator, config, 7)
    kept_on_driver = on_driver.screen("gold", "gold", rows, PAIR_KEYS)
    kept_in_spark = in_spark.screen("gold", "gold", spark.createDataFrame(rows), PAIR_KEYS)

    assert isinstance(kept_on_driver, pa.Table) and isinstance(kept_in_spark, DataFrame)
    assert kept_in_spark.columns == kept_on_driver.column_names and not any(c.startswith("_dq_") for c in kept_in_spark.columns)
    assert sorted(row["_s_id"] for row in kept_in_spark.collect()) == sorted(kept_on_driver["_s_id"].to_pylist()) == ["s1", "s1", "s2"]
    assert in_spark.summary() == on_driver.summary() == {"gold_predicate_true": 1, "gold_owner_consistent": 1, "gold_pair_unique": 2}
    taken = [{(row["rule"], row["row_key"]) for row in checks.quarantine_rows().collect()} for checks in (on_driver, in_spark)]
    assert taken[0] == taken[1] == {("gold_predicate_true", "r1|bad0"), ("gold_owner_consistent", "r1|bad1")}
    in_spark.release()


def test_a_predicate_over_columns_gold_does_not_keep_is_checked_on_the_bronze_records(spark):
    pairs = spark.createDataFrame([("r1", 1, "s1", 2, "a", "a", "R"), ("r2", 1, "s1", 2, "a", "a", "R")],
                                  "_r_id string, _r_ts bigint, _s_id string, _s_ts bigint, r_key string, s_key string, owner string")
    r = spark.createDataFrame([("r1", 1, "a", 1), ("r2", 1, "a", 9)], "_id string, _ts bigint, key string, x int")
    s = spark.createDataFrame([("s1", 2, "a", 5)], "_id string, _ts bigint, key string, y int")
    checked = with_pair_checks(pairs, "r.x < s.y", CARRIED, RELATIONS, lambda: dict(zip(RELATIONS, (r, s))))
    assert {row["_r_id"]: row["_dq_predicate"] for row in checked.collect()} == {"r1": True, "r2": False}


def test_rules_skip_when_their_parameter_is_unset():
    assert "gold_within_window" not in {rule.name for rule, _, _ in bound_rules(Config(), "gold")}
    assert "gold_within_window" in {rule.name for rule, _, _ in bound_rules(CONFIG, "gold")}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"policies": {"no_such_rule": "warn"}}, "unknown rule 'no_such_rule'"),
        ({"policies": {"gold_pair_unique": "drop"}}, "policy must be one of warn, quarantine, fail"),
        ({"policies": {"bronze_columns_present": "quarantine"}}, "cannot quarantine rows"),
        ({"engine": "dask"}, "'expectations.engine' must be one of pandas, spark"),
        ({"ts_max": "soon"}, "'expectations.ts_max' must be an integer"),
        ({"strict": True}, "unknown setting 'strict'"),
    ],
)
def test_bad_expectation_settings_are_refused_with_one_line(settings, message):
    with pytest.raises(LakejoinError, match=message) as error:
        check_policies(Config(expectations=settings).quality)  # the shape by the config, the rules named by the suites
    assert "\n" not in str(error.value)


def test_row_level_rules_get_only_the_columns_they_read_and_table_level_rules_the_whole_table():
    from expectations.runner import _needed

    rows = state(bronze().append_column("_source_file", pa.array(["f"] * 2)))
    assert _needed(rows, KEYS, bound_rules(CONFIG, "state")).column_names == ["_id", "_ts", "_dq_late", "_dq_watermark"]
    assert _needed(rows, KEYS, bound_rules(CONFIG, "bronze", "r")).column_names == rows.column_names
