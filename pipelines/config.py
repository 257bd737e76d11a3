"""The YAML config: what to join on, how late records may be, how big a batch may be, which Delta engine to use."""

from __future__ import annotations

from dataclasses import dataclass, fields

import yaml

from state.engines import ENGINE_NAMES
from state.errors import LakejoinError
from state.joiner import DEFAULT_PREDICATE
from state.relations import RELATIONS


@dataclass(frozen=True)
class Config:
    predicate: str = DEFAULT_PREDICATE  # Spark SQL boolean expression over r.* and s.*
    max_batch_rows: int = 10_000  # arrivals (both relations together) per micro-batch
    engine: str = "auto"  # auto | delta-rs | spark
    pipeline: str = "lakejoin"  # names the Delta application transactions of this pipeline's writes
    # Per relation, in ts units: how far below the newest ts seen a record may still arrive (DESIGN.md
    # section 4). One number applies to both relations; None keeps no watermark (nothing is late).
    allowed_lateness: int | dict[str, int] | None = None
    window: int | None = None  # band W: pairs also need |r.ts - s.ts| <= W, and stores evict what it leaves behind

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_lateness", _lateness(self.allowed_lateness))
        if self.window is not None and not _non_negative(self.window):
            raise LakejoinError(f"config: 'window' must be a non-negative integer (ts units), got {self.window!r}")
        if not isinstance(self.predicate, str) or not self.predicate.strip():
            raise LakejoinError("config: 'predicate' must be a non-empty Spark SQL expression over r.* and s.*")
        if not isinstance(self.max_batch_rows, int) or self.max_batch_rows < 1:
            raise LakejoinError(f"config: 'max_batch_rows' must be a positive integer, got {self.max_batch_rows!r}")
        if self.engine not in ENGINE_NAMES:
            raise LakejoinError(f"config: 'engine' must be one of {', '.join(ENGINE_NAMES)}, got {self.engine!r}")

    def lateness(self, rel: str) -> int | None:
        """The allowed lateness of relation ``rel``, or None when it has no watermark."""
        return self.allowed_lateness.get(rel)  # type: ignore[union-attr] - normalised to a dict

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
