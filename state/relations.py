"""Relations as data: a name (the alias predicates use) and a rank (the tie-breaker of the total order).

Nothing else in the code names R or S: N-way joins later add relations here, not code paths.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Relation:
    name: str  # "r": table names (bronze/r, silver/r_store) and the predicate's alias (r.key)
    rank: int  # breaks timestamp ties in the total order of docs/design.md section 2

    @property
    def label(self) -> str:
        """How gold's ``owner`` column names the relation."""
        return self.name.upper()


# The columns every record has, whatever else its source carries (README "Tables").
RECORD_SCHEMA = "id string, ts bigint, key string, payload string"

R = Relation("r", 0)
S = Relation("s", 1)
RELATIONS: tuple[Relation, ...] = (R, S)


def relation(name: str) -> Relation:
    for candidate in RELATIONS:
        if candidate.name == name.lower():
            return candidate
    raise ValueError(f"unknown relation {name!r}: use one of {', '.join(r.name for r in RELATIONS)}")


def others(of: Relation) -> tuple[Relation, ...]:
    return tuple(candidate for candidate in RELATIONS if candidate != of)
