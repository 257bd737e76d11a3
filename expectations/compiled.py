"""The suites' rules as Spark expressions: how a batch checks its rows inside the jobs that write them.

Great Expectations stays the rules' definition, and ``lakejoin validate`` runs it over whole tables
(expectations/runner.py). Per batch, each rule is compiled once into what its expectation means on a DataFrame, with
Great Expectations' semantics (nulls are no failure of a value rule; a unique rule fails every row of a repeated
value): a **row rule** becomes a boolean expression in Spark SQL, true on the rows that break it, which the batch's own
write computes with its rows; a **table rule** (columns present, a column's type) is a question about the schema,
answered without a Spark job. tests/test_expectations.py checks every rule against Great Expectations on the same rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql.types import StructType

from state.names import literal, quoted

RowTest = Callable[[dict[str, Any]], str]
SchemaTest = Callable[[dict[str, Any], StructType], bool]


def _between(kwargs: dict[str, Any]) -> str:
    value, low, high = quoted(kwargs["column"]), kwargs.get("min_value"), kwargs.get("max_value")
    outside = [f"{value} {'<=' if kwargs.get('strict_min') else '<'} {literal(low)}"] if low is not None else []
    outside += [f"{value} {'>=' if kwargs.get('strict_max') else '>'} {literal(high)}"] if high is not None else []
    return f"{value} IS NOT NULL AND ({' OR '.join(outside) or 'false'})"


def _repeated(names: list[str]) -> str:
    """The row's value (of ``names`` together) is held by another row too: a window over the rows' values."""
    return f"count(1) OVER (PARTITION BY {', '.join(quoted(name) for name in names)}) > 1"


def _pair_compared(kwargs: dict[str, Any]) -> str:
    a, b = quoted(kwargs["column_A"]), quoted(kwargs["column_B"])
    return f"{a} IS NOT NULL AND {b} IS NOT NULL AND NOT ({a} {'>=' if kwargs.get('or_equal') else '>'} {b})"


ROW_TESTS: dict[str, RowTest] = {
    "expect_column_values_to_not_be_null": lambda kwargs: f"{quoted(kwargs['column'])} IS NULL",
    "expect_column_values_to_be_between": _between,
    "expect_column_values_to_be_in_set": lambda kwargs: (
        f"{quoted(kwargs['column'])} IS NOT NULL AND NOT {quoted(kwargs['column'])} IN "
        f"({', '.join(literal(value) for value in kwargs['value_set'])})"
    ),
    "expect_column_values_to_be_unique": lambda kwargs: (
        f"{quoted(kwargs['column'])} IS NOT NULL AND {_repeated([kwargs['column']])}"
    ),
    "expect_compound_columns_to_be_unique": lambda kwargs: (
        f"({' OR '.join(f'{quoted(name)} IS NOT NULL' for name in kwargs['column_list'])}) AND "
        f"{_repeated(kwargs['column_list'])}"
    ),
    "expect_column_pair_values_to_be_equal": lambda kwargs: (
        f"NOT (({quoted(kwargs['column_A'])} IS NULL AND {quoted(kwargs['column_B'])} IS NULL) OR "
        f"{quoted(kwargs['column_A'])} <=> {quoted(kwargs['column_B'])})"
    ),
    "expect_column_pair_values_a_to_be_greater_than_b": _pair_compared,
}

SCHEMA_TESTS: dict[str, SchemaTest] = {
    "expect_table_columns_to_match_set": lambda kwargs, schema: (
        set(schema.fieldNames()) != set(kwargs["column_set"])
        if kwargs.get("exact_match")
        else not set(kwargs["column_set"]) <= set(schema.fieldNames())
    ),
    "expect_column_values_to_be_in_type_list": lambda kwargs, schema: (
        kwargs["column"] not in schema.fieldNames()
        or type(schema[kwargs["column"]].dataType).__name__ not in kwargs["type_list"]
    ),
}
