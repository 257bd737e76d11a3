"""Pipeline stages (bronze ingest, silver join, demo), the CLI and the Python API.

``from pipelines import Pipeline`` is the library's entry point (pipelines/api.py); it loads Spark only when used,
so the CLI's ``--help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from state.errors import LakejoinError

if TYPE_CHECKING:
    from pipelines.api import Pipeline

__all__ = ["LakejoinError", "Pipeline"]


def __getattr__(name: str) -> object:
    if name == "Pipeline":
        from pipelines.api import Pipeline

        return Pipeline
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")
