"""The config file as written: a YAML document, read and parsed into a plain mapping, then defined (state/config.py).

The one place a config is read from disk: the definition itself does no I/O.
"""

from __future__ import annotations

import yaml

from state.config import Config, config_from
from state.errors import LakejoinError


def load_config(path: str | None) -> Config:
    """The config at ``path``, or the defaults when there is none."""
    if path is None:
        return Config.of()
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise LakejoinError(f"cannot read config {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise LakejoinError(f"config {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    return config_from(document, f"config {path}")
