"""The YAML config: what to join on, how late records may be, how big a batch may be, which Delta engine to use."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import yaml

from expectations.rules import RULES, Rule, check_policy
from state.engines import ENGINE_NAMES
from state.errors import LakejoinError
from state.joiner import DEFAULT_PREDICATE
from state.relations import RELATIONS


@dataclass(frozen=True)
class Config:
    predicate: str = DEFAULT_PREDICATE  # Spark SQL boolean expression over r.* and s.*
    max_batch_rows: int = 10_000  # arrivals (both relations together) per micro-batch
    # A batch's pairs up to this many are checked and written from the driver, the fastest way for small
    # batches; more stay in Spark, checked there and written where they are (Delta on Spark; delta-rs writes
    # from the driver whatever the size).
    driver_rows: int = 100_000
    engine: str = "auto"  # auto | delta-rs | spark
    pipeline: str = "lakejoin"  # names the Delta application transactions of this pipeline's writes
    # Per relation, in ts units: how far below the newest ts seen a record may still arrive (docs/design.md
    # section 4). One number applies to both relations; None keeps no watermark (nothing is late).
    allowed_lateness: int | dict[str, int] | None = None
    window: int | None = None  # band W: pairs also need |r.ts - s.ts| <= W, and stores evict what it leaves behind
    expectations: Expectations | dict | None = None  # data-quality settings (README "Data quality")

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_lateness", _lateness(self.allowed_lateness))
        object.__setattr__(self, "expectations", _expectations(self.expectations))
        if self.window is not None and not _non_negative(self.window):
            raise LakejoinError(f"config: 'window' must be a non-negative integer (ts units), got {self.window!r}")
        if not isinstance(self.predicate, str) or not self.predicate.strip():
            raise LakejoinError("config: 'predicate' must be a non-empty Spark SQL expression over r.* and s.*")
        if not isinstance(self.max_batch_rows, int) or self.max_batch_rows < 1:
            raise LakejoinError(f"config: 'max_batch_rows' must be a positive integer, got {self.max_batch_rows!r}")
        if not _non_negative(self.driver_rows):
            raise LakejoinError(f"config: 'driver_rows' must be a non-negative integer, got {self.driver_rows!r}")
        if self.engine not in ENGINE_NAMES:
            raise LakejoinError(f"config: 'engine' must be one of {', '.join(ENGINE_NAMES)}, got {self.engine!r}")

    def lateness(self, rel: str) -> int | None:
        """The allowed lateness of relation ``rel``, or None when it has no watermark."""
        return self.allowed_lateness.get(rel)  # type: ignore[union-attr] - normalised to a dict

    @property
    def quality(self) -> Expectations:
        return self.expectations  # type: ignore[return-value] - normalised in __post_init__

    def rule_parameters(self) -> dict[str, object]:
        """What ``${name}`` stands for in the suites."""
        return {"ts_min": self.quality.ts_min, "ts_max": self.quality.ts_max, "window": self.window}

    @property
    def join_condition(self) -> str:
        """The predicate, with the band window when one is set."""
        if self.window is None:
            return self.predicate
        return f"({self.predicate}) AND abs(r.ts - s.ts) <= {self.window}"

    def with_overrides(self, **overrides: object) -> Config:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({name: value for name, value in overrides.items() if value is not None})
        return Config(**values)


@dataclass(frozen=True)
class Expectations:
    """The ``expectations`` section: where per-batch rules run, the plausible ts range, per-rule policies."""

    engine: str = "pandas"  # pandas: a batch's rows on the driver (fast); spark: as Spark DataFrames
    ts_min: int | None = 0  # bronze_ts_plausible: ts below this is implausible (None: no lower bound)
    ts_max: int | None = None  # and above this (None: no upper bound)
    policies: dict[str, str] = field(default_factory=dict)  # rule name -> warn | quarantine | fail

    def policy(self, rule: Rule) -> str:
        return self.policies.get(rule.name, rule.policy)


EXPECTATION_ENGINES = ("pandas", "spark")


def _expectations(value: object) -> Expectations:
    if isinstance(value, Expectations):
        return value
    if value is None:
        return Expectations()
    known = {f.name for f in fields(Expectations)}
    if not isinstance(value, dict) or set(value) - known:
        unknown = sorted(set(value) - known) if isinstance(value, dict) else [value]
        raise LakejoinError(f"config: 'expectations' has unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
    settings = Expectations(**value)
    if settings.engine not in EXPECTATION_ENGINES:
        raise LakejoinError(f"config: 'expectations.engine' must be one of {', '.join(EXPECTATION_ENGINES)}, got {settings.engine!r}")
    for bound in ("ts_min", "ts_max"):
        given = getattr(settings, bound)
        if given is not None and (not isinstance(given, int) or isinstance(given, bool)):
            raise LakejoinError(f"config: 'expectations.{bound}' must be an integer (ts units) or null, got {given!r}")
    by_name = {rule.name: rule for rule in RULES}
    if not isinstance(settings.policies, dict):
        raise LakejoinError("config: 'expectations.policies' must map rule names to warn, quarantine or fail")
    for name, policy in settings.policies.items():
        if name not in by_name:
            raise LakejoinError(f"config: 'expectations.policies' names unknown rule {name!r}; rules: {', '.join(by_name)}")
        check_policy(by_name[name], policy)
    return settings


def _non_negative(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _lateness(value: object) -> dict[str, int]:
    """``allowed_lateness`` as relation name -> ts units: one number for all, a mapping per relation, or none."""
    names = [rel.name for rel in RELATIONS]
    if value is None:
        return {}
    if _non_negative(value):
        return dict.fromkeys(names, value)
    if isinstance(value, dict) and set(value) <= set(names) and all(_non_negative(v) for v in value.values()):
        return dict(value)
    raise LakejoinError(
        f"config: 'allowed_lateness' must be a non-negative integer or a mapping of {' and '.join(names)} "
        f"to non-negative integers (ts units), got {value!r}"
    )


def load_config(path: str | None) -> Config:
    """The config at ``path``, or the defaults when there is none."""
    if path is None:
        return Config()
    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise LakejoinError(f"cannot read config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise LakejoinError(f"config {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(raw, dict):
        raise LakejoinError(f"config {path} must be a mapping of settings")
    known = {f.name for f in fields(Config)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise LakejoinError(f"config {path}: unknown setting {unknown[0]!r}; known settings: {', '.join(sorted(known))}")
    return Config(**raw)
