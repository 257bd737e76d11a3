"""Small DataFrame helpers every stage uses."""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce

from pyspark.sql import DataFrame


def union_by_name(frames: Iterable[DataFrame], *, allow_missing: bool = False) -> DataFrame:
    """The rows of every frame (at least one), matched by column name; ``allow_missing``: a column some frames lack is
    null in their rows, else such frames are an error (Spark's ``unionByName``)."""
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=allow_missing), frames)
