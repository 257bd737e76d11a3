"""The rules applied to one batch's new rows, and what their policies do with the rows that break them.

Every check runs before the batch writes anything: a ``fail`` rule stops it with nothing changed; a
``quarantine`` rule takes its failing rows out of what the batch writes and keeps them, with the rule's
name, in ``quarantine/expectations``; ``warn`` only counts. Counts per rule go to ``quality/dq_results``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import reduce

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from expectations.frames import DERIVED_PREFIX, without_checks
from expectations.rules import RULES, Rule
from expectations.runner import RuleResult, Validator
from state.config import Config
from state.engines import Data, as_frame
from state.errors import LakejoinError
from state.names import column
from state.phases import timed

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


class ExpectationFailed(LakejoinError):
    """A ``fail`` rule broke: the batch stopped before writing anything (exit code 1, like a failed check)."""

    exit_code = 1


def bound_rules(config: Config, target: str, relation: str | None = None) -> list[tuple[Rule, dict, str]]:
    """The rules for ``target`` (a table of ``relation``, if it has one) with their arguments bound and their
    policies, skipping those not applicable."""
    parameters = config.rule_parameters(relation)
    chosen = []
    for rule in RULES:
        kwargs = rule.bound(parameters) if rule.target == target else None
        if kwargs is not None:
            chosen.append((rule, kwargs, config.quality.policy(rule.name, rule.policy)))
    return chosen


@dataclass
class BatchChecks:
    validator: Validator
    config: Config
    batch_id: int
    results: list[RuleResult] = field(default_factory=list)
    quarantined: list[DataFrame] = field(default_factory=list)
    _persisted: list[DataFrame] = field(default_factory=list)

    def screen(self, table: str, target: str, rows: Data, keys: list[str], relation: str | None = None) -> Data:
        """``rows`` minus those a quarantine rule takes out, without the derived ``_dq_`` columns.

        Rows on the driver (Arrow) are checked there, on the configured engine; a DataFrame (a batch's pairs
        too many for the driver) is checked where it is, on Spark, kept in Spark's storage until ``release``
        so the rules and the write compute it once."""
        with timed("rules"):  # the batch's time checking rules and applying their policies
            spread = isinstance(rows, DataFrame)
            if spread:
                rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
                self._persisted.append(rows)
            rules = bound_rules(self.config, target, relation)
            results = []
            if rules and (spread or rows.num_rows):
                engine = "spark" if spread else self.config.quality.engine
                complete = not spread or any(policy == "quarantine" for _, _, policy in rules)
                results = self.validator.check(table, rows, keys, rules, engine, complete=complete)
            self.results += results
            kept = without_checks(rows) if spread else _without_derived(rows)
            for result in results:
                if result.policy == "quarantine" and result.failed:
                    kept, taken = self._set_aside(kept, keys, result)
                    self.quarantined.append(taken)
            return kept

    def _set_aside(self, rows: Data, keys: list[str], result: RuleResult) -> tuple[Data, DataFrame]:
        """``rows`` without those ``result`` names, and those rows as ``quarantine/expectations`` keeps them.
        Done in Spark whatever ``rows`` are: it only happens when a rule breaks."""
        spark = self.validator.spark
        frame = as_frame(spark, rows)
        keyed = frame.withColumn(ROW_KEY, row_key(keys))
        failing = [("|".join(NULL_KEY if row[key] is None else str(row[key]) for key in keys),) for row in result.failing]
        wanted = F.broadcast(spark.createDataFrame(failing, f"{ROW_KEY} string"))
        taken = keyed.join(wanted, ROW_KEY, "left_semi").select(
            F.lit(self.batch_id).cast("bigint").alias("batch_id"),
            F.lit(result.rule.name).alias("rule"),
            F.lit(result.table).alias("table"),
            F.col(ROW_KEY).alias("row_key"),
            F.to_json(F.struct(*[column(name) for name in sorted(frame.columns)])).alias("row"),
        )
        kept = keyed.join(wanted, ROW_KEY, "left_anti").drop(ROW_KEY)
        return (kept if isinstance(rows, DataFrame) else kept.toArrow()), taken

    def release(self) -> None:
        """Free what ``screen`` kept in Spark's storage, once the batch has written it."""
        for frame in self._persisted:
            frame.unpersist()
        self._persisted.clear()

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

    def quarantine_rows(self) -> DataFrame | None:
        return reduce(DataFrame.unionByName, self.quarantined) if self.quarantined else None

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
ROW_KEY = "_dq_row_key"


def row_key(keys: list[str]) -> Column:
    """A row's key columns as one string (``quarantine/expectations.row_key``): ``a|b``, a null as ``<null>``."""
    return F.concat_ws("|", *[F.coalesce(F.col(key).cast("string"), F.lit(NULL_KEY)) for key in keys])
