"""Data-quality rules as data: the suites in ``expectations/suites/*.yml``, each rule one Great Expectations
expectation with a name, the table kind it checks, and a policy (docs/data-quality.md).

Policies: ``warn`` keeps the row and counts it, ``quarantine`` sets the row aside in
``quarantine/expectations``, ``fail`` stops the batch before it writes anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql.types import StructType

from expectations.compiled import ROW_TESTS, SCHEMA_TESTS
from state.config import Expectations
from state.errors import LakejoinError

SUITES_DIR = Path(__file__).parent / "suites"
POLICIES = ("warn", "quarantine", "fail")
TARGETS = ("bronze", "state", "gold")
# Row-level expectations name failing rows, so they can be quarantined; table-level ones (columns, and
# types, which are a column's, not a value's) cannot.
TABLE_LEVEL = frozenset(SCHEMA_TESTS)
_PARAMETER = re.compile(r"^\$\{(\w+)\}$")


@dataclass(frozen=True)
class Rule:
    name: str
    suite: str
    target: str  # which kind of table it checks: bronze, state or gold
    expectation: str  # a Great Expectations 1.x expectation type, e.g. expect_column_values_to_not_be_null
    kwargs: dict[str, Any]  # its arguments; "${name}" refers to a parameter
    policy: str  # the default policy

    @property
    def row_level(self) -> bool:
        return self.expectation not in TABLE_LEVEL

    def parameters(self) -> set[str]:
        return {
            match.group(1)
            for value in self.kwargs.values()
            if isinstance(value, str) and (match := _PARAMETER.match(value))
        }

    def bound(self, parameters: dict[str, Any]) -> dict[str, Any] | None:
        """The arguments with parameters filled in, or None when every parameter it has is unset (skipped)."""
        names = self.parameters()
        if names and all(parameters.get(name) is None for name in names):
            return None
        return {key: _fill(value, parameters) for key, value in self.kwargs.items()}


def _fill(value: Any, parameters: dict[str, Any]) -> Any:
    match = _PARAMETER.match(value) if isinstance(value, str) else None
    return parameters[match.group(1)] if match else value


def load_rules(directory: Path = SUITES_DIR) -> tuple[Rule, ...]:
    """Every rule of every suite, in file then rule order."""
    paths = sorted(directory.glob("*.yml"))
    if not paths:
        raise LakejoinError(
            f"no expectation suites in {directory}: lakejoin was installed without its data files; reinstall it"
        )
    rules: list[Rule] = []
    for path in paths:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        for raw in document["rules"]:
            rules.append(
                Rule(
                    name=raw["name"],
                    suite=document["suite"],
                    target=raw.get("target", document.get("target")),
                    expectation=raw["expectation"],
                    kwargs=dict(raw.get("kwargs", {})),
                    policy=raw["policy"],
                )
            )
    _check_suites(rules)
    return tuple(rules)


def _check_suites(rules: list[Rule]) -> None:
    names = [rule.name for rule in rules]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise LakejoinError(f"expectation suites: rule name {duplicated[0]!r} is used twice; rule names must be unique")
    for rule in rules:
        if rule.expectation not in ROW_TESTS and rule.expectation not in SCHEMA_TESTS:
            raise LakejoinError(
                f"expectation rule {rule.name}: a batch cannot check {rule.expectation}; the expectations it checks: "
                f"{', '.join(sorted({*ROW_TESTS, *SCHEMA_TESTS}))}"
            )
        if rule.target not in TARGETS:
            raise LakejoinError(
                f"expectation rule {rule.name}: target must be one of {', '.join(TARGETS)}, got {rule.target!r}"
            )
        check_policy(rule, rule.policy)


def check_policies(quality: Expectations) -> None:
    """The policies a config sets name rules of the suites, each with a policy it can take: one line naming the
    first that does not."""
    by_name = {rule.name: rule for rule in RULES}
    for name, policy in quality.policies.items():
        if name not in by_name:
            raise LakejoinError(
                f"config: 'expectations.policies' names unknown rule {name!r}; rules: {', '.join(by_name)}"
            )
        check_policy(by_name[name], policy)


def reference() -> str:
    """Every rule of the suites with what it checks and its default policy, as a Markdown table (docs/config.md)."""
    lines = ["| rule | checks | expectation | default policy |", "|---|---|---|---|"]
    lines += [f"| `{rule.name}` | {rule.target} | `{rule.expectation}` | {rule.policy} |" for rule in RULES]
    return "\n".join(lines) + "\n"


def check_policy(rule: Rule, policy: object) -> None:
    if policy not in POLICIES:
        raise LakejoinError(
            f"expectation rule {rule.name}: policy must be one of {', '.join(POLICIES)}, got {policy!r}"
        )
    if policy == "quarantine" and not rule.row_level:
        raise LakejoinError(
            f"expectation rule {rule.name} checks the whole table, so it cannot quarantine rows: use warn or fail"
        )


RULES = load_rules()


@dataclass(frozen=True)
class Check:
    """One rule bound to one table of a batch: its arguments, its policy, and the name of the column that flags the
    rows breaking it (row rules)."""

    rule: Rule
    kwargs: dict[str, Any]
    policy: str
    table: str  # e.g. bronze/r
    proven: bool = (
        False  # the batch's inputs prove the rule holds on its rows: no row is recounted (TableChecks.proven_unique)
    )

    @property
    def row_level(self) -> bool:
        return self.rule.row_level

    @property
    def flag(self) -> str:
        """The column true on the rows that break the rule."""
        return f"_dq_fails_{self.rule.name}"

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns a rule on one column or on a list of them reads (empty for the others)."""
        return tuple(self.kwargs.get("column_list") or ([self.kwargs["column"]] if "column" in self.kwargs else []))

    @property
    def reads(self) -> tuple[str, ...]:
        """Every column a row rule reads."""
        return self.columns + tuple(self.kwargs[name] for name in ("column_A", "column_B") if name in self.kwargs)

    def fails(self) -> str:
        """True on a row that breaks the rule (never null), as Spark SQL."""
        return "false" if self.proven else f"coalesce({ROW_TESTS[self.rule.expectation](self.kwargs)}, false)"

    def fails_on(self, schema: StructType) -> bool:
        """A table rule's verdict on the rows' schema."""
        return SCHEMA_TESTS[self.rule.expectation](self.kwargs, schema)
