"""Evaluate the suites' rules on a table's rows with Great Expectations 1.x, one validation per table, on Spark:
what ``lakejoin validate`` runs over whole tables (a batch checks its own rows with the rules compiled into its jobs:
expectations/compiled.py). The same suite objects serve every table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import great_expectations as gx
from great_expectations.core.result_format import ResultFormat
from great_expectations.data_context.types.base import ProgressBarsConfig
from great_expectations.expectations.expectation_configuration import ExpectationConfiguration
from pyspark.sql import DataFrame, SparkSession

from expectations.rules import Rule
from state.engines.delta_log import is_restricted

EXAMPLES = 5  # failing row keys kept per rule in the audit's results


@dataclass(frozen=True)
class RuleResult:
    rule: Rule
    table: str  # the table the rows belong to, e.g. bronze/r
    policy: str
    evaluated: int  # rows the rule looked at
    failed: int  # rows that broke it (a table-level rule fails all of them or none)
    failing: tuple[dict[str, Any], ...]  # keys of failing rows: all of them per batch, examples in an audit
    error: str | None = None  # set when Great Expectations could not evaluate the rule

    @property
    def passed(self) -> bool:
        return self.failed == 0 and self.error is None

    def examples(self) -> str:
        shown = [", ".join(f"{k}={v}" for k, v in keys.items()) for keys in self.failing[:EXAMPLES]]
        return json.dumps(shown)

    def describe(self) -> str:
        if self.error:
            return f"rule {self.rule.name} on {self.table} could not be evaluated: {self.error}"
        examples = "; ".join(json.loads(self.examples())) or "the table as a whole"
        return (
            f"rule {self.rule.name} ({self.rule.expectation}) failed on {self.failed} of {self.evaluated} rows of "
            f"{self.table}, e.g. {examples}"
        )


def suite_of(name: str, rules: list[tuple[Rule, dict[str, Any]]]) -> gx.ExpectationSuite:
    """A Great Expectations suite of ``rules`` with their arguments bound; each expectation remembers its rule."""
    suite = gx.ExpectationSuite(name=name)
    for rule, kwargs in rules:
        configuration = ExpectationConfiguration(type=rule.expectation, kwargs=kwargs, meta={"rule": rule.name})
        suite.add_expectation(configuration.to_domain_obj())
    return suite


class Validator:
    """An ephemeral Great Expectations context with one dataframe asset per engine (no files, no cloud)."""

    def __init__(self, spark: SparkSession, context: Any | None = None) -> None:
        self.spark = spark
        self.context = context or gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        self._batches: dict[str, Any] = {}

    def batch_definition(self) -> Any:
        if not self._batches:
            # Great Expectations caches each batch's rows unless told not to; a session that caches nothing
            # (Databricks serverless) refuses that.
            source = self.context.data_sources.add_or_update_spark(
                name="lakejoin_spark", persist=not is_restricted(self.spark)
            )
            asset = source.add_dataframe_asset(name="rows")
            self._batches["spark"] = asset.add_batch_definition_whole_dataframe("whole")
        return self._batches["spark"]

    def check(
        self,
        table: str,
        rows: DataFrame,
        keys: list[str],
        rules: list[tuple[Rule, dict[str, Any], str]],
        complete: bool = True,
        persist: bool = False,
    ) -> list[RuleResult]:
        """Each rule's counts on ``rows``. ``complete`` names every failing row, else a few examples; ``persist``
        stores the result in the context, for Data Docs."""
        if not rules:
            return []
        parameters = {"dataframe": rows}
        suite = suite_of(table.replace("/", "_"), [(rule, kwargs) for rule, kwargs, _ in rules])
        # No query text for the failing rows: Great Expectations renders it by analysing a filter of the rule's
        # condition, which for a unique rule holds a window function, fails analysis and logs an ERROR in the
        # session's listener.
        fmt = {
            "result_format": ResultFormat.COMPLETE if complete else ResultFormat.SUMMARY,
            "unexpected_index_column_names": keys,
            "return_unexpected_index_query": False,
        }
        if persist:
            definition = gx.ValidationDefinition(
                name=suite.name, data=self.batch_definition(), suite=self.context.suites.add_or_update(suite)
            )
            outcome = self.context.validation_definitions.add_or_update(definition).run(
                batch_parameters=parameters, result_format=fmt
            )
        else:
            outcome = self.batch_definition().get_batch(batch_parameters=parameters).validate(suite, result_format=fmt)
        by_rule = {result.expectation_config.meta["rule"]: result for result in outcome.results}
        # Table-level rules report no row count; the row-level ones in the same validation do.
        counted = [result.result.get("element_count", 0) for result in outcome.results if result.result]
        total = max(counted, default=0)
        return [_result(rule, table, policy, by_rule[rule.name], keys, total) for rule, _, policy in rules]


def _result(rule: Rule, table: str, policy: str, result: Any, keys: list[str], total: int) -> RuleResult:
    details = result.result or {}
    evaluated = details.get("element_count", total)
    if result.exception_info and result.exception_info.get("raised_exception"):
        message = str(result.exception_info.get("exception_message", "")).splitlines()[0]
        return RuleResult(rule, table, policy, evaluated, evaluated, (), message)
    if "unexpected_count" not in details:  # table-level: all rows or none
        return RuleResult(rule, table, policy, evaluated, 0 if result.success else evaluated, ())
    listed = details.get("unexpected_index_list") or details.get("partial_unexpected_index_list") or []
    failing = tuple({key: row.get(key) for key in keys} for row in listed)
    return RuleResult(rule, table, policy, evaluated, details["unexpected_count"], failing)
