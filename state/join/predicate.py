"""A join condition as its conjuncts, each with the relations it reads: what lets a join of N relations add one
relation at a time, each linked to the ones already joined (docs/design.md section 2.8).

Only the text is read, not parsed: ``AND`` splits at the top level (outside parentheses, quotes, ``CASE … END``
and ``BETWEEN … AND …``), and a conjunct reads relation ``x`` when it names ``x.`` outside a quoted string.
Spark parses and checks every conjunct itself when the join is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_TOKEN = re.compile(
    r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`]|``)*`|[()]|\b(?:and|between|case|end)\b", re.IGNORECASE
)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_EQUALITY = re.compile(r"(?<![<>!=])==?(?![=>])|<=>")


@dataclass(frozen=True)
class Conjunct:
    text: str
    reads: frozenset[str]  # the relation aliases it names
    equality: bool  # it compares with '=' (a hash join can use it): preferred to link the next relation


def conjuncts(condition: str, aliases: Iterable[str]) -> list[Conjunct]:
    """The top-level conjuncts of ``condition``, each with the aliases it reads."""
    names = list(aliases)
    return [_conjunct(text, names) for text in _split(condition)]


def _split(condition: str) -> list[str]:
    parts, depth, cases, betweens, start = [], 0, 0, 0, 0
    for token in _TOKEN.finditer(condition):
        word = token.group().lower()
        if word == "(":
            depth += 1
        elif word == ")":
            depth -= 1
        elif depth == 0 and word == "case":
            cases += 1
        elif depth == 0 and word == "end" and cases:
            cases -= 1
        elif depth == 0 and cases == 0 and word == "between":
            betweens += 1
        elif depth == 0 and cases == 0 and word == "and":
            if betweens:
                betweens -= 1
            else:
                parts.append(condition[start : token.start()])
                start = token.end()
    parts.append(condition[start:])
    split = []
    for part in (part.strip() for part in parts):
        inner = _unwrapped(part)
        split += _split(inner) if inner != part else [part]
    return split


def _unwrapped(text: str) -> str:
    """``(a AND b)`` as ``a AND b`` when the outer parentheses enclose the whole text."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for token in _TOKEN.finditer(text):
        depth += {"(": 1, ")": -1}.get(token.group(), 0)
        if depth == 0 and token.end() < len(text):
            return text
    return text[1:-1].strip()


def _conjunct(text: str, names: list[str]) -> Conjunct:
    bare = _STRING.sub("''", text)
    reads = frozenset(name for name in names if re.search(rf"(?<![\w.`]){re.escape(name)}\s*\.", bare, re.IGNORECASE))
    return Conjunct(text, reads, bool(_EQUALITY.search(bare)))


_MASKED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`]|``)*`")


def equality_sides(text: str, aliases: Iterable[str]) -> dict[str, str] | None:
    """``{alias: its side}`` of a conjunct that is one equality (``=``, ``==`` or ``<=>``) between an expression of
    one alias and an expression of another, each side reading only its own; None for anything else."""
    masked = _MASKED.sub(lambda found: "_" * len(found.group()), text)  # quoted text and names cannot split it
    depth, found = 0, []
    for i, char in enumerate(masked):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in "=<>!":
            found.append(i)
    equality = [match for match in _EQUALITY.finditer(masked) if match.start() in found]
    if len(equality) != 1 or len(found) != len(equality[0].group()):  # one operator, and no other comparison
        return None
    names = list(aliases)
    sides = (text[: equality[0].start()].strip(), text[equality[0].end() :].strip())
    reads = [_conjunct(side, names).reads for side in sides]
    if any(len(read) != 1 for read in reads) or reads[0] == reads[1]:
        return None
    return {next(iter(read)): side for read, side in zip(reads, sides)}
