"""The YAML config: what to join on, how big a batch may be, which Delta engine to use."""

from __future__ import annotations

from dataclasses import dataclass, fields

import yaml

from state.engines import ENGINE_NAMES
from state.errors import LakejoinError
from state.joiner import DEFAULT_PREDICATE


@dataclass(frozen=True)
class Config:
    predicate: str = DEFAULT_PREDICATE  # Spark SQL boolean expression over r.* and s.*
    max_batch_rows: int = 10_000  # arrivals (both relations together) per micro-batch
    engine: str = "auto"  # auto | delta-rs | spark
    pipeline: str = "lakejoin"  # names the Delta application transactions of this pipeline's writes

    def __post_init__(self) -> None:
        if not isinstance(self.predicate, str) or not self.predicate.strip():
            raise LakejoinError("config: 'predicate' must be a non-empty Spark SQL expression over r.* and s.*")
        if not isinstance(self.max_batch_rows, int) or self.max_batch_rows < 1:
            raise LakejoinError(f"config: 'max_batch_rows' must be a positive integer, got {self.max_batch_rows!r}")
        if self.engine not in ENGINE_NAMES:
            raise LakejoinError(f"config: 'engine' must be one of {', '.join(ENGINE_NAMES)}, got {self.engine!r}")

    def with_overrides(self, **overrides: object) -> Config:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update({name: value for name, value in overrides.items() if value is not None})
        return Config(**values)


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
