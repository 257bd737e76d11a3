"""Config settings that document themselves: each field of a config dataclass carries the text the reference prints
for it (docs/config.md is generated from these, so the reference and the code cannot disagree)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING
from typing import Any


@dataclasses.dataclass(frozen=True)
class Documented:
    """One setting as the reference shows it."""

    name: str  # the YAML key(s)
    default: str  # what an unset setting means, as text
    doc: str
    example: str | None  # a YAML value to show, when the default alone does not say what the setting takes


def setting(
    default: Any = MISSING,
    *,
    doc: str,
    unset: str | None = None,
    example: str | None = None,
    keys: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass field with its reference: ``doc`` says what it does and why, ``unset`` what leaving it out means
    (else the default is shown), ``example`` a value worth showing, ``keys`` the YAML keys when they are not the
    field's name."""
    metadata = {"doc": doc, "unset": unset, "example": example, "keys": keys}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def documented(cls: type) -> list[Documented]:
    """Every setting of the config dataclass ``cls``, in definition order. A field without its reference is an error:
    the test of the generated reference fails on it."""
    found = []
    for field in dataclasses.fields(cls):
        if "doc" not in field.metadata:
            raise ValueError(f"{cls.__name__}.{field.name} has no reference text: define it with setting(doc=...)")
        meta = field.metadata
        default = field.default_factory() if field.default_factory is not MISSING else field.default
        shown = meta["unset"] if meta["unset"] is not None else _yaml(default)
        found.append(Documented(meta["keys"] or field.name, shown, meta["doc"], meta["example"]))
    return found


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return _yaml(list(value))
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_yaml(item)}" for key, item in value.items()) + "}"
    return str(value)
