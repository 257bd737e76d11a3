"""A step takes the tables and writers it uses (state/engines/table.py), not the whole warehouse or engine. The stages'
functions that still take either, or read an attribute so named (``run.engine``), are counted, and the count only
falls: one that adds a function reaching for them fails here."""

from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = (
    "pipelines/bronze",
    "pipelines/batch",
    "pipelines/silver.py",
    "pipelines/definition.py",
    "state/join",
    "state/config.py",
    "expectations",
)
WHOLE = ("warehouse", "engine")
MOST = 60  # at 1d2406d


def reaching() -> list[str]:
    """``file:function`` for each function of the stages that takes or reads ``warehouse`` or ``engine``."""
    files = []
    for stage in STAGES:
        path = os.path.join(REPO, stage)
        if os.path.isfile(path):
            files.append(path)
        for folder, _, names in os.walk(path):
            files += [os.path.join(folder, name) for name in sorted(names) if name.endswith(".py")]
    found = []
    for path in files:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            takes = any(argument.arg in WHOLE for argument in arguments)
            reads = any(isinstance(inner, ast.Attribute) and inner.attr in WHOLE for inner in ast.walk(node))
            if takes or reads:
                found.append(f"{os.path.relpath(path, REPO)}:{node.name}")
    return found


def test_no_more_functions_of_the_stages_take_the_whole_warehouse_or_engine():
    found = reaching()
    assert len(found) <= MOST, f"{len(found)} functions take the warehouse or engine (at most {MOST}): {found}"


def test_the_count_reads_what_it_names():
    assert "pipelines/silver.py:look_again" in reaching()
