"""Every measured figure in the README and the docs comes from a named field of a results file of committed code.

A figure is a time (``12.3 s``, ``450 ms``, ``14.5 min``) or a ratio (``1.68×``). Outside the benchmarks page, each is
followed by a Markdown comment naming where it comes from: one field of one results file
(``0.75×<!-- backlog.json: ratios.lakejoin_over_structured_streaming -->``) or the ratio of two fields, of one file or
of two (``2.31×<!-- backlog_spark.json: systems.lakejoin.total_s / systems.by-hand.total_s -->``, ``1.98×<!--
backlog_spark.json: systems.lakejoin.total_s / backlog.json: systems.lakejoin.total_s -->``); a list's field is read
as its median. The figure must equal that value at the precision it is written, and the file must record the commit
it measured, with no uncommitted change (``+changes``). The benchmarks page, which holds every table, is held to the
looser rule of its results files named beside each paragraph until it is generated from them. The changelog is exempt:
it keeps earlier figures of earlier code.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
from collections import defaultdict
from collections.abc import Iterator

import pytest

from tests.helpers import REPO

RESULTS = os.path.join(REPO, "benchmarks", "results")
BENCHMARKS_PAGE = "docs/benchmarks.md"
PAGES = [
    "README.md",
    *(
        f"docs/{name}"
        for name in sorted(os.listdir(os.path.join(REPO, "docs")))
        if name.endswith(".md") and name != "changelog.md"
    ),
]
QUOTING_PAGES = [page for page in PAGES if page != BENCHMARKS_PAGE]

# What each make target writes (the scripts' default names, both engines where the target runs both).
TARGET_FILES = {
    "bench-backlog": ("backlog.json", "backlog_spark.json", "backlog_ingest.json", "backlog_ingest_spark.json"),
    "bench-small": ("small.json", "small_spark.json"),
    "bench-history": ("history.json", "history_spark.json"),
    "bench-demo": ("demo.json",),
    "sizing-day": ("day.json",),
    "bench-suite": ("suite.json",),
    "bench-cli": ("cli_deltars.json", "cli_spark.json"),
    "bench-commit": ("delta_commit.json",),
    "bench-sizing": ("sizing.json", "sizing_spark.json"),
    "bench-changes": ("changes.json", "changes-spark.json"),
    "bench-idle": ("idle.json",),
    "bench-nway": ("nway.json",),
    "bench-final": ("final.json",),
    "bench-dq": ("expectations_cost.json",),
    "bench-engines": ("engines.json",),
    "bench-sources": ("table_sources.json", "table_sources_wide.json"),
    "bench-state": ("bounded_state.json", "unbounded_state.json"),
    "bench-memory": ("driver_memory_512m.json", "driver_memory_large_file_1g.json"),
    "bench-peers": ("peers.json", "peers_spark.json"),
    "bench-peers-bounded": ("peers_bounded.json",),
}

NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(
    rf"(?<![\w.,\-/])({NUMBER})(?:\s?[–-]\s?({NUMBER}))?(\s(?:ms|s|min)|×)(?![\w/])"
)  # 1.5× a ratio, 2 × 3 a product
NAMED_FILE = re.compile(r"([\w-]+\.json)")
NAMED_TARGET = re.compile(r"make (bench-[\w-]+)")
FOOTNOTE = re.compile(r"\[\^([\w-]+)\]")
CODE = re.compile(r"`[^`]*`")


def paragraphs(text: str) -> Iterator[tuple[str, list[str], dict[str, str]]]:
    """Each paragraph (or table row) of a page with the texts of the sections it is in (innermost first), code blocks
    left out, and the page's footnotes."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    notes = {
        match.group(1): match.group(2)
        for match in re.finditer(r"^\[\^([\w-]+)\]:(.*(?:\n(?: {4}.*|\s*$))*)", text, re.M)
    }
    parents = re.split(r"^(?=## )", text, flags=re.M)
    for parent in parents:
        for section in re.split(r"^(?=### )", parent, flags=re.M):
            for block in re.split(r"\n\s*\n", section):
                rows = block.splitlines() if block.lstrip().startswith("|") else [block]
                for row in rows:
                    if not row.startswith("[^"):
                        yield row, [section, parent], notes


def sources(paragraph: str, sections: list[str], notes: dict[str, str]) -> list[str]:
    """The results files a paragraph names (its footnotes' too), or else those of the innermost section that names any."""

    def named(text: str) -> list[str]:
        targets = [file for target in NAMED_TARGET.findall(text) for file in TARGET_FILES.get(target, ())]
        return [*NAMED_FILE.findall(text), *targets]

    own = named(paragraph + "".join(notes.get(note, "") for note in FOOTNOTE.findall(paragraph)))
    return own or next((found for found in map(named, sections) if found), [])


def values(node: object, place: tuple = ()) -> Iterator[tuple[tuple, float]]:
    """Every number of a results file with its place; a list of numbers also gives its median."""
    if isinstance(node, bool):
        return
    if isinstance(node, (int, float)):
        yield place, float(node)
    elif isinstance(node, dict):
        for key, child in node.items():
            yield from values(child, (*place, key))
    elif isinstance(node, list):
        numbers = [each for each in node if isinstance(each, (int, float)) and not isinstance(each, bool)]
        if numbers:
            yield (*place, "median"), statistics.median(numbers)
        for index, child in enumerate(node):
            yield from values(child, (*place, index))


def results(name: str) -> object:
    with open(os.path.join(RESULTS, name), encoding="utf-8") as handle:
        return json.load(handle)


def candidates(files: list[str]) -> tuple[list[float], list[float]]:
    """The times and the ratios the named files hold."""
    held = {name: list(values(results(name))) for name in files}
    times = [value for each in held.values() for _, value in each]
    ratios = []
    for each in held.values():
        for position in range(max((len(place) for place, _ in each), default=0)):
            groups = defaultdict(list)
            for place, value in each:
                if len(place) > position and not isinstance(place[-1], int):
                    groups[place[:position] + place[position + 1 :]].append(value)
            ratios += [a / b for group in groups.values() for a, b in itertools.permutations(group, 2) if b]
    by_place = defaultdict(list)
    for each in held.values():
        for place, value in each:
            if not isinstance(place[-1], int):
                by_place[place].append(value)
    ratios += [a / b for group in by_place.values() for a, b in itertools.permutations(group, 2) if b]
    return times, ratios


def holds(figure: str, unit: str, times: list[float], ratios: list[float]) -> bool:
    written = float(figure.replace(",", ""))
    tolerance = 0.5 * 10 ** -len(figure.partition(".")[2]) + 1e-9
    pool = ratios if unit == "×" else [value * (1000 if unit == "ms" else 1) for value in times]
    return any(abs(value - written) <= tolerance for value in pool)


def unsourced(text: str) -> list[str]:
    """The figures of a page's ``text`` that no results file named beside them holds, each with its paragraph."""
    missing = []
    for paragraph, sections, notes in paragraphs(text):
        figures = list(FIGURE.finditer(CODE.sub("", paragraph)))
        if not figures:
            continue
        files = list(dict.fromkeys(sources(paragraph, sections, notes)))
        absent = [name for name in files if not os.path.isfile(os.path.join(RESULTS, name))]
        times, ratios = candidates([name for name in files if name not in absent])
        for match in figures:
            low, high, unit = match.group(1), match.group(2), match.group(3).strip()
            for figure in filter(None, (low, high)):
                if absent or not holds(figure, unit, times, ratios):
                    where = f"{' '.join(paragraph.split())[:90]}…"
                    missing.append(
                        f"{figure} {unit} in “{where}” ({', '.join(files) or 'no results file named'}{'; missing: ' + ', '.join(absent) if absent else ''})"
                    )
    return missing


def test_every_figure_of_the_benchmarks_page_is_held_by_a_results_file_named_beside_it() -> None:
    with open(os.path.join(REPO, BENCHMARKS_PAGE), encoding="utf-8") as text:
        assert unsourced(text.read()) == []


def test_a_figure_that_drifts_from_its_file_or_names_none_is_found() -> None:
    with open(os.path.join(RESULTS, "backlog.json"), encoding="utf-8") as results:
        backlog = json.load(results)
    took, ratio = (
        f"{backlog['systems']['lakejoin']['total_s']:.1f} s",
        f"{backlog['ratios']['lakejoin_over_structured_streaming']:.2f}×",
    )
    drifted = f"{float(took.split()[0]) + 1:.1f} s"
    held = f"A backlog took {took} on delta-rs, {ratio} Structured Streaming (`backlog.json`)."
    assert unsourced(held) == []
    assert len(unsourced(held.replace(took, drifted))) == 1
    assert len(unsourced(held.replace(ratio, "123.45×"))) == 1
    assert len(unsourced(f"A backlog took {took} on delta-rs.")) == 1
    assert len(unsourced(f"A backlog took {took} (`no_such_file.json`).")) == 1
    assert (
        unsourced(
            f"## A section (`make bench-backlog`)\n\nIt took {took}.\n\nA product: 3 × 4, a window of 60 seconds."
        )
        == []
    )


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
