"""Every measured figure in the README and the docs comes from a named field of a results file of committed code.

The benchmarks page is generated from the results files (``make bench-report``, ``benchmarks/page.py``): it must be
what they render, age marks aside, and the results folder holds each make target's current run and nothing else.
Elsewhere a figure is a time (``12.3 s``, ``450 ms``, ``14.5 min``) or a ratio (``1.68×``), followed by a Markdown
comment naming where it comes from: one field of one results file
(``0.75×<!-- backlog.json: ratios.lakejoin_over_structured_streaming -->``) or the ratio of two fields, of one file or
of two (``2.31×<!-- backlog_spark.json: systems.lakejoin.total_s / systems.by-hand.total_s -->``); a list's field is
read as its median. The figure must equal that value at the precision it is written, and the file must record the
commit it measured, with no uncommitted change (``+changes``). The changelog is exempt: it keeps earlier figures of
earlier code.
"""

from __future__ import annotations

import copy
import json
import os
import re
import statistics

import pytest

from benchmarks import page
from tests.helpers import REPO

RESULTS = os.path.join(REPO, "benchmarks", "results")
BENCHMARKS_PAGE = "docs/benchmarks.md"
QUOTING_PAGES = [
    "README.md",
    *(
        f"docs/{name}"
        for name in sorted(os.listdir(os.path.join(REPO, "docs")))
        if name.endswith(".md") and name not in ("changelog.md", "benchmarks.md")
    ),
]
RESULTS_FILES = [file for section in page.SECTIONS for file in section.files]

NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?<![\w.,\-/])({NUMBER})(?:\s?[–-]\s?({NUMBER}))?(\s(?:ms|s|min)|×)(?![\w/])"
)  # 1.5× a ratio, 2 × 3 a product
CODE = re.compile(r"`[^`]*`")


def results(name: str) -> object:
    with open(os.path.join(RESULTS, name), encoding="utf-8") as handle:
        return json.load(handle)


def test_the_benchmarks_page_is_what_make_bench_report_renders_from_the_results_files() -> None:
    with open(os.path.join(REPO, BENCHMARKS_PAGE), encoding="utf-8") as text:
        written = page.AGE_MARK.sub("", text.read())
    rendered = page.render(page.load(RESULTS_FILES), age=lambda commit: None)
    assert written == rendered, f"{BENCHMARKS_PAGE} is not what the results files render: run `make bench-report`"


def test_the_results_folder_holds_each_make_targets_current_run_and_nothing_else() -> None:
    held = sorted(name for name in os.listdir(RESULTS) if name.endswith(".json"))
    assert held == sorted(RESULTS_FILES), "a results file no make target writes, or a target's file missing"
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as makefile:
        targets = set(re.findall(r"^([\w-]+):", makefile.read(), re.M))
    assert {section.target for section in page.SECTIONS} <= targets


def test_a_results_file_that_changes_changes_the_page_and_old_or_uncommitted_runs_are_marked() -> None:
    measured = page.load(RESULTS_FILES)
    fresh = page.render(measured, age=lambda commit: 0)
    drifted = copy.deepcopy(measured)
    drifted["backlog.json"]["systems"]["lakejoin"]["total_s"] += 1
    assert page.render(drifted, age=lambda commit: 0) != fresh
    aged = page.render(measured, age=lambda commit: 3)
    assert "3 code commits ago: run `make bench-backlog` again" in aged
    assert page.AGE_MARK.sub("", aged) == fresh
    drifted["backlog.json"]["commit"] += "+changes"
    assert "not measured on committed code: run `make bench-backlog` again" in page.render(drifted, age=lambda c: 0)


SOURCE = re.compile(r"\s*<!--(.*?)-->", re.S)
FIELD = re.compile(r"^\s*(?:([\w.-]+\.json)\s*:)?\s*(.+?)\s*$", re.S)
COMMITTED = re.compile(r"^[0-9a-f]{7,40}$")


def field_value(document: object, path: str) -> float:
    """The number at ``path`` (keys joined by dots) of a results document; a list's ``median`` is its median."""
    node = document
    for key in path.split("."):
        if key == "median" and isinstance(node, list):
            node = statistics.median(node)
        elif isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            raise KeyError(f"no field {path}")
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise KeyError(f"{path} is not a number")
    return float(node)


def sourced_value(source: str, load=results) -> float:
    """The value a figure's source names: ``file.json: field`` or a ratio of two fields (``/``), of one file or two."""
    parts = [FIELD.match(part) for part in source.split(" / ")]
    if not 1 <= len(parts) <= 2 or any(part is None for part in parts) or parts[0].group(1) is None:
        raise ValueError(f"<!--{source}--> names no results file and field")
    file = parts[0].group(1)
    value = []
    for part in parts:
        file = part.group(1) or file
        document = load(file)
        commit = str(document.get("commit", "")) if isinstance(document, dict) else ""
        if not COMMITTED.match(commit):
            raise ValueError(f"{file} records commit {commit or 'none'}: measure it again on committed code")
        value.append(field_value(document, part.group(2)))
    return value[0] if len(value) == 1 else value[0] / value[1]


def unquoted(text: str, load=results) -> list[str]:
    """The figures of a quoting page's ``text`` without a source comment, or that differ from what it names."""
    text = CODE.sub("", re.sub(r"```.*?```", "", text, flags=re.S))
    wrong = []
    for match in FIGURE.finditer(text):
        figure, unit, where = (
            match.group(1),
            match.group(3).strip(),
            " ".join(text[match.start() : match.end() + 60].split()),
        )
        source = SOURCE.match(text, match.end())
        if match.group(2) is not None:
            wrong.append(f"“{where}”: a range; write each end as a figure with its source")
        elif source is None:
            wrong.append(f"“{where}”: no <!-- file.json: field --> after it")
        else:
            try:
                value = sourced_value(source.group(1).strip(), load)
            except (OSError, KeyError, ValueError) as exc:
                wrong.append(f"“{where}”: {exc}")
                continue
            scaled = {"ms": [value * 1000, value], "min": [value, value / 60]}.get(unit, [value])
            written = float(figure.replace(",", ""))
            tolerance = 0.5 * 10 ** -len(figure.partition(".")[2]) + 1e-9
            if all(abs(each - written) > tolerance for each in scaled):
                wrong.append(f"“{where}”: {value:.4g} in {source.group(1).strip()}")
    return wrong


@pytest.mark.parametrize("page", QUOTING_PAGES)
def test_every_figure_outside_the_benchmarks_page_names_its_field_of_a_committed_results_file(page: str) -> None:
    with open(os.path.join(REPO, page), encoding="utf-8") as text:
        assert unquoted(text.read()) == []


def test_a_figure_that_differs_from_its_field_or_names_none_or_uncommitted_code_is_found() -> None:
    files = {
        "run.json": {"commit": "0123abc", "systems": {"lakejoin": {"total_s": 46.0}, "stream": {"total_s": 50.0}}},
        "dirty.json": {"commit": "0123abc+changes", "total_s": 46.0},
        "nameless.json": {"total_s": 46.0},
        "rounds.json": {"commit": "0123abc", "rounds": [3.0, 1.0, 2.0]},
    }
    quoted = "took 0.92×<!-- run.json: systems.lakejoin.total_s / systems.stream.total_s --> its time"
    assert unquoted(quoted, files.__getitem__) == []
    assert (
        unquoted(
            "46.0 s<!-- run.json: systems.lakejoin.total_s -->, 2.0 s<!-- rounds.json: rounds.median -->",
            files.__getitem__,
        )
        == []
    )
    for wrong in (
        quoted.replace("0.92×", "0.87×"),
        quoted.replace("lakejoin.total_s", "lakejoin.rows"),
        "took 0.92× its time",
        "took 0.92×<!-- systems.lakejoin.total_s / systems.stream.total_s --> its time",
        "took 46.0 s<!-- dirty.json: total_s -->",
        "took 46.0 s<!-- nameless.json: total_s -->",
        "took 46.0 s<!-- absent.json: total_s -->",
        "took 40–46.0 s<!-- run.json: systems.lakejoin.total_s -->",
    ):
        assert len(unquoted(wrong, lambda name: files[name] if name in files else results(name))) == 1, wrong
