"""What every benchmark does with its figures at the end."""

from __future__ import annotations

import json
import os


def write_json(path: str, figures: dict) -> None:
    """``figures`` as indented JSON at ``path``, creating its folder (``benchmarks/results`` by default)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(figures, handle, indent=2)
