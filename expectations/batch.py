"""The rules applied to one batch's rows, inside the jobs that write them, and what their policies do.

Each table a batch writes has its rules compiled (expectations/compiled.py): every row carries a flag per row rule,
the write's own job counts the flags (an observation, or the batch's measuring job for its arrivals), a ``quarantine``
rule's rows are left out of the write and kept with the rule's name in ``quarantine/expectations``, and a ``fail``
rule's first row stops the job before it commits: the batch stops, and every later run stops at it again. ``warn``
only counts. A rule's counts and a few failing rows' keys go to the batch's log row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from expectations.frames import DERIVED_PREFIX
from expectations.rules import RULES, Check, Rule
from state.config import OnAxis
from state.errors import LakejoinError
from state.frames import union_by_name
from state.log.batch_log import RuleCount
from state.names import column

EXAMPLES = 5  # failing rows' keys kept per rule in the batch log and error messages
EVALUATED = "_dq_evaluated"
BROKE = "lakejoin: a fail rule broke on "  # the text a fail rule's guard stops a write with
NULL_KEY = "<null>"
ROW_KEY = "_dq_row_key"
UNIQUE = ("expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique")
NOT_NULL = "expect_column_values_to_not_be_null"


class ExpectationFailed(LakejoinError):
    """A ``fail`` rule broke: the batch stopped before committing (exit code 1, like a failed check)."""

    exit_code = 1


def bound_rules(axis: OnAxis, target: str, relation: str | None = None) -> list[tuple[Rule, dict, str]]:
    """The rules for ``target`` (a table of ``relation``, if it has one) with their arguments bound on the event-time
    axis and their policies, skipping those not applicable."""
    parameters = axis.rule_parameters(relation)
    chosen = []
    for rule in RULES:
        kwargs = rule.bound(parameters) if rule.target == target else None
        if kwargs is not None:
            chosen.append((rule, kwargs, axis.config.quality.policy(rule.name, rule.policy)))
    return chosen


@dataclass(frozen=True)
class TableChecks:
    """The rules of one table's rows in a batch: ``table`` names the table (``bronze/r``, ``gold``), ``keys`` the
    columns that name a row in examples and in ``quarantine/expectations``."""

    table: str
    keys: tuple[str, ...]
    checks: tuple[Check, ...]

    @classmethod
    def of(cls, axis: OnAxis, target: str, table: str, keys: Sequence[str], relation: str | None = None) -> TableChecks:
        return cls(
            table,
            tuple(keys),
            tuple(Check(rule, kwargs, policy, table) for rule, kwargs, policy in bound_rules(axis, target, relation)),
        )

    @property
    def row_checks(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if check.row_level)

    def kept_unique(self, key: str, results: Sequence[RuleCount]) -> bool:
        """Whether the rows these rules keep hold each ``key`` once and never null, as their ``results`` in a batch that
        went on say: a unique and a not-null rule on ``key`` that broke on no row, or whose policy set aside (or
        stopped at) the rows they broke on; ``warn`` keeps them."""
        failed = {result.rule: result.failed for result in results}
        guards = [
            check
            for check in self.row_checks
            if check.columns == (key,) and (check.rule.expectation in UNIQUE or check.rule.expectation == NOT_NULL)
        ]
        kinds = {check.rule.expectation in UNIQUE for check in guards}
        return kinds == {True, False} and all(
            check.policy != "warn" or not failed.get(check.rule.name) for check in guards
        )

    def stops_repeats(self, key: str) -> bool:
        """Whether a ``fail`` rule keeps ``key`` unique among the rows written."""
        return any(
            check.policy == "fail" and check.rule.expectation in UNIQUE and check.columns == (key,)
            for check in self.row_checks
        )

    def proven_unique(self, columns: Sequence[str]) -> TableChecks:
        """These rules with the one that ``columns`` are unique together taken as proven for the batch's rows, so not
        recounted: the count is a window that shuffles every column of the rows (all of gold's), where what proves it
        is already counted (pipelines/batch/emit.py)."""
        proven = tuple(
            replace(check, proven=True)
            if check.rule.expectation in UNIQUE and set(check.columns) == set(columns)
            else check
            for check in self.checks
        )
        return replace(self, checks=proven)

    def flagged(self, rows: DataFrame) -> DataFrame:
        """``rows`` with each row rule's flag."""
        return (
            rows.selectExpr("*", *[f"{check.fails()} AS {check.flag}" for check in self.row_checks])
            if self.row_checks
            else rows
        )

    def metrics(self) -> list[Column]:
        """The aggregates a job over ``flagged`` rows computes for the rules, each named as ``results`` reads it: the
        rows, and each row rule's failures (each one SQL expression: a call to Spark, where columns built in Python
        take several)."""
        return [
            F.expr(f"count(1) AS {EVALUATED}"),
            *[F.expr(f"count(CASE WHEN {check.flag} THEN 1 END) AS {check.flag}") for check in self.row_checks],
        ]

    def written(self, flagged: DataFrame) -> DataFrame:
        """What the table gets of ``flagged``: a ``fail`` rule's row stops the job, a ``quarantine`` rule's rows are
        left out, and the rules' columns (and every derived ``_dq_`` one) go."""
        kept = flagged
        failing = [check.flag for check in self.row_checks if check.policy == "fail"]
        if failing:
            kept = kept.where(f"CASE WHEN {' OR '.join(failing)} THEN raise_error('{BROKE}{self.table}') END IS NULL")
        quarantining = [check.flag for check in self.row_checks if check.policy == "quarantine"]
        if quarantining:
            kept = kept.where(f"NOT ({' OR '.join(quarantining)})")
        return kept.drop(*[name for name in kept.columns if name.startswith(DERIVED_PREFIX)])

    def results(self, flagged: DataFrame, counts: dict[str, int]) -> list[RuleCount]:
        """Each rule's result from the job's ``counts`` (``metrics``), with a few failing rows' keys (a small job for
        each rule that broke; a table rule reads the schema)."""
        evaluated = counts.get(EVALUATED) or 0
        results = []
        for check in self.checks:
            if check.row_level:
                failed = counts.get(check.flag) or 0
                keys = self._examples(flagged, check) if failed else []
            else:
                failed = evaluated if evaluated and check.fails_on(flagged.schema) else 0
                keys = []
            results.append(RuleCount(check.rule.name, self.table, check.policy, evaluated, failed, json.dumps(keys)))
        return results

    def set_aside(self, flagged: DataFrame, results: Sequence[RuleCount], batch_id: int) -> DataFrame | None:
        """The rows quarantine rules take out, as ``quarantine/expectations`` keeps them; None when none broke."""
        broke = {result.rule for result in results if result.failed and result.policy == "quarantine"}
        parts = [
            flagged.where(F.col(check.flag)).select(
                F.lit(batch_id).cast("bigint").alias("batch_id"),
                F.lit(check.rule.name).alias("rule"),
                F.lit(self.table).alias("table"),
                row_key(self.keys).alias("row_key"),
                F.to_json(
                    F.struct(*[column(name) for name in sorted(flagged.columns) if not name.startswith(DERIVED_PREFIX)])
                ).alias("row"),
            )
            for check in self.row_checks
            if check.rule.name in broke
        ]
        return union_by_name(parts) if parts else None

    def failure(self, flagged: DataFrame, batch_id: int, written: bool) -> ExpectationFailed | None:
        """The error a batch stops with when a ``fail`` rule breaks on ``flagged`` (one job, on the way out)."""
        fail = TableChecks(self.table, self.keys, tuple(check for check in self.checks if check.policy == "fail"))
        return stopped(batch_id, fail.results(flagged, fail._counts(flagged)), written)

    def broke(self, error: BaseException) -> bool:
        """Whether ``error`` is this table's fail rule stopping its write."""
        return BROKE + self.table in str(error)

    def _counts(self, flagged: DataFrame) -> dict[str, int]:
        return flagged.agg(*self.metrics()).first().asDict()

    def _examples(self, flagged: DataFrame, check: Check) -> list[str]:
        rows = flagged.where(F.col(check.flag)).select(*[column(key) for key in self.keys]).limit(EXAMPLES).collect()
        return [", ".join(f"{key}={row[key]}" for key in self.keys) for row in rows]


def stopped(batch_id: int, results: Sequence[RuleCount], written: bool) -> ExpectationFailed | None:
    """The error of a batch whose ``fail`` rules broke, naming the first; None when none did. ``written``: some of the
    batch's writes are done (it stops uncommitted, and the next run resumes it)."""
    broken = [result for result in results if result.policy == "fail" and result.failed]
    if not broken:
        return None
    first = broken[0]
    examples = "; ".join(json.loads(first.examples)) or "the table as a whole"
    more = f" (and {len(broken) - 1} more failing rules)" if len(broken) > 1 else ""
    return ExpectationFailed(
        f"batch {batch_id} stopped, {'not committed' if written else 'nothing written'}: rule {first.rule} "
        f"({_expectation(first.rule)}) failed on {first.failed} of {first.evaluated} rows of {first.table}, e.g. "
        f"{examples}{more}; fix the data, or set expectations.policies.{first.rule} to warn or quarantine in the config"
    )


def _expectation(name: str) -> str:
    return next(rule.expectation for rule in RULES if rule.name == name)


def row_key(keys: Sequence[str]) -> Column:
    """A row's key columns as one string (``quarantine/expectations.row_key``): ``a|b``, a null as ``<null>``."""
    return F.concat_ws("|", *[F.coalesce(column(key).cast("string"), F.lit(NULL_KEY)) for key in keys])
