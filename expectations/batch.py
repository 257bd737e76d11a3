"""The rules applied to one batch's new rows, and what their policies do with the rows that break them.

Every check runs before the batch writes anything: a ``fail`` rule stops it with nothing changed; a
``quarantine`` rule takes its failing rows out of what the batch writes and keeps them, with the rule's
name, in ``quarantine/expectations``; ``warn`` only counts. Counts per rule go to ``quality/dq_results``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from expectations.frames import DERIVED_PREFIX
from expectations.rules import RULES, Rule
from expectations.runner import RuleResult, Validator
from pipelines.config import Config
from state.errors import LakejoinError

RESULT_SCHEMA = pa.schema(
    [
        ("batch_id", pa.int64()),
        ("suite", pa.string()),
        ("rule", pa.string()),
        ("table", pa.string()),
        ("policy", pa.string()),
        ("evaluated", pa.int64()),
        ("failed", pa.int64()),
        ("examples", pa.string()),
        ("checked_at", pa.timestamp("us", tz="UTC")),
    ]
)
QUARANTINE_SCHEMA = pa.schema(
    [("batch_id", pa.int64()), ("rule", pa.string()), ("table", pa.string()), ("row_key", pa.string()), ("row", pa.string())]
)


class ExpectationFailed(LakejoinError):
    """A ``fail`` rule broke: the batch stopped before writing anything (exit code 1, like a failed check)."""

    exit_code = 1


def bound_rules(config: Config, target: str) -> list[tuple[Rule, dict, str]]:
    """The rules for ``target`` with their arguments bound and their policies, skipping those not applicable."""
    parameters = config.rule_parameters()
    chosen = []
    for rule in RULES:
        kwargs = rule.bound(parameters) if rule.target == target else None
        if kwargs is not None:
            chosen.append((rule, kwargs, config.quality.policy(rule)))
    return chosen


@dataclass
class BatchChecks:
    validator: Validator
    config: Config
    batch_id: int
    results: list[RuleResult] = field(default_factory=list)
    quarantined: list[pa.Table] = field(default_factory=list)
    seconds: float = 0.0  # time spent evaluating rules and applying policies

    def screen(self, table: str, target: str, rows: pa.Table | DataFrame, keys: list[str]) -> pa.Table:
        """``rows`` minus those a quarantine rule takes out, without the derived ``_dq_`` columns. Rows given
        as a DataFrame are computed here, their cost counted as the checks'."""
        started = time.perf_counter()
        rows = rows if isinstance(rows, pa.Table) else rows.toArrow()
        results = []
        if rows.num_rows:
            rules = bound_rules(self.config, target)
            results = self.validator.check(table, rows, keys, rules, self.config.quality.engine)
        self.results += results
        taken = [result for result in results if result.policy == "quarantine" and result.failed]
        kept = _without_derived(rows)
        for result in taken:
            failing = _matches(kept, keys, result.failing)
            self.quarantined.append(_quarantine_rows(self.batch_id, result, kept.filter(failing), keys))
            kept = kept.filter(pc.invert(failing))
        self.seconds += time.perf_counter() - started
        return kept

    def raise_if_failed(self) -> None:
        broken = [result for result in self.results if result.policy == "fail" and not result.passed]
        if broken:
            rule = broken[0].rule.name
            raise ExpectationFailed(
                f"batch {self.batch_id} stopped, nothing written: {broken[0].describe()}"
                + (f" (and {len(broken) - 1} more failing rules)" if len(broken) > 1 else "")
                + f"; fix the data, or set expectations.policies.{rule} to warn or quarantine in the config"
            )

    def result_rows(self) -> pa.Table:
        now = datetime.now(timezone.utc)
        rows = [
            {
                "batch_id": self.batch_id,
                "suite": result.rule.suite,
                "rule": result.rule.name,
                "table": result.table,
                "policy": result.policy,
                "evaluated": result.evaluated,
                "failed": result.failed,
                "examples": result.examples(),
                "checked_at": now,
            }
            for result in self.results
        ]
        return pa.Table.from_pylist(rows, RESULT_SCHEMA)

    def quarantine_rows(self) -> pa.Table | None:
        return pa.concat_tables(self.quarantined) if self.quarantined else None

    def summary(self) -> dict[str, int]:
        """Failing rows per rule that broke this batch (warned or quarantined)."""
        failed: dict[str, int] = {}
        for result in self.results:
            if result.failed:
                failed[result.rule.name] = failed.get(result.rule.name, 0) + result.failed
        return failed


def _without_derived(rows: pa.Table) -> pa.Table:
    return rows.drop_columns([name for name in rows.column_names if name.startswith(DERIVED_PREFIX)])


NULL_KEY = "<null>"


def _row_key(rows: pa.Table, keys: list[str]) -> pa.Array:
    columns = [pc.fill_null(pc.cast(rows[key], pa.string()), NULL_KEY) for key in keys]
    return columns[0] if len(columns) == 1 else pc.binary_join_element_wise(*columns, "|")


def _matches(rows: pa.Table, keys: list[str], failing: tuple[dict, ...]) -> pa.Array:
    wanted = pa.array(["|".join(NULL_KEY if row[key] is None else str(row[key]) for key in keys) for row in failing], pa.string())
    return pc.is_in(_row_key(rows, keys), value_set=wanted)


def _quarantine_rows(batch_id: int, result: RuleResult, rows: pa.Table, keys: list[str]) -> pa.Table:
    records = rows.to_pylist()
    return pa.table(
        {
            "batch_id": pa.array([batch_id] * rows.num_rows, pa.int64()),
            "rule": pa.array([result.rule.name] * rows.num_rows, pa.string()),
            "table": pa.array([result.table] * rows.num_rows, pa.string()),
            "row_key": _row_key(rows, keys),
            "row": pa.array([json.dumps(record, default=str, sort_keys=True) for record in records], pa.string()),
        },
        schema=QUARANTINE_SCHEMA,
    )
