"""What every benchmark does with its figures at the end."""

from __future__ import annotations

import json
import os
import statistics


def write_json(path: str, figures: dict) -> None:
    """``figures`` as indented JSON at ``path``, creating its folder (``benchmarks/results`` by default)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(figures, handle, indent=2)


def tenths(seconds: list[float]) -> tuple[float, float]:
    """The median seconds of the first and of the last tenth of the micro-batches (one batch at least): equal when a
    batch costs the same late in the stream as early, as bounded state should make it."""
    tenth = max(1, len(seconds) // 10)
    return statistics.median(seconds[:tenth]), statistics.median(seconds[-tenth:])
