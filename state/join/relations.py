"""Relations as data: a name (the alias predicates use) and a rank (the tie-breaker of the total order).

The config lists the relations (two or more); without one, a join has two, ``r`` and ``s``. Nothing else in
the code names a relation: a join of N relations is the same code given N of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import timedelta

from state.errors import LakejoinError
from state.names import storable
from state.settings import setting
from state.spans import describe_span, duration


@dataclass(frozen=True)
class Relation:
    name: str  # "r": table names (bronze/r, silver/r_state) and the predicate's alias (r.key)
    rank: int  # breaks timestamp ties in the total order of docs/design.md section 2

    @property
    def label(self) -> str:
        """How gold's ``owner`` column names the relation."""
        return self.name.upper()


# What lakejoin derives for every record, whatever its columns: its id as text, its event time on the integer
# axis of state/event_time.py. Everything that orders, matches or evicts records uses these two.
ID, TS = "_id", "_ts"
# What it derives for every row of a change feed (state/join/changes.py): the operation (insert, update, delete) and its
# sequence (a number: the latest per id wins).
OP, SEQ = "_op", "_seq"
INSERT, UPDATE, DELETE = "insert", "update", "delete"


@dataclass(frozen=True)
class ChangeSpec:
    """A relation whose rows are changes of its records (docs/design.md section 11), not new records: a source table's
    Change Data Feed (``changes: cdf``), or files whose rows carry an operation and a sequence column, Debezium's
    ``c``, ``r`` (insert), ``u`` (update) and ``d`` (delete) unless configured."""

    op: str | None = setting(
        None,
        doc="Files: the column holding each row's operation.",
        unset="the source table's Change Data Feed (`changes: cdf`)",
    )
    sequence_by: str | None = setting(
        None,
        doc="Files: the column ordering an id's changes (an integer or a timestamp); the latest wins, whatever the "
        "arrival order.",
        unset="a source table's commit version",
    )
    values: dict[str, tuple[str, ...]] = setting(
        doc="Files: the operation column's values for each operation; an update of an unseen id is an insert.",
        keys="insert, update, delete",
        unset="Debezium's: `c` and `r` insert, `u` update, `d` delete",
        example="{insert: [I], update: [U], delete: [D]}",
        factory=lambda: {INSERT: ("c", "r"), UPDATE: ("u",), DELETE: ("d",)},
    )

    @property
    def cdf(self) -> bool:
        return self.op is None

    @classmethod
    def parse(cls, name: str, raw: object, table: str | None) -> ChangeSpec | None:
        where = f"config: relations.{name}.changes"
        if raw is None:
            return None
        if raw == "cdf":
            if table is None:
                raise LakejoinError(
                    f"{where}: cdf reads a source table's Change Data Feed: set relations.{name}.table, or give files' "
                    "columns ({op: <column>, sequence_by: <column>})"
                )
            return cls()
        known = ("op", "sequence_by", *cls().values)  # the values' keys: insert, update, delete
        if (
            not isinstance(raw, dict)
            or set(raw) - set(known)
            or not _is_name(raw.get("op"))
            or not _is_name(raw.get("sequence_by"))
        ):
            raise LakejoinError(
                f"{where} must be cdf (a source table's Change Data Feed) or {{op: <column>, sequence_by: <column>}} "
                f"(files), got {raw!r}"
            )
        if table is not None:
            raise LakejoinError(
                f"{where}: a source table's changes are read from its Change Data Feed: use changes: cdf"
            )
        values = dict(cls().values)
        for op in values:
            given = raw.get(op, values[op])
            given = [given] if isinstance(given, str) else given
            if not isinstance(given, (list, tuple)) or not given or not all(isinstance(value, str) for value in given):
                raise LakejoinError(f"{where}.{op} must be the operation column's value(s) for an {op}, got {given!r}")
            values[op] = tuple(given)
        every = [value for group in values.values() for value in group]
        if len(every) != len(set(every)):
            raise LakejoinError(
                f"{where}: a value names two operations ({', '.join(f'{op}: {list(v)}' for op, v in values.items())})"
            )
        return cls(raw["op"], raw["sequence_by"], values)

    def settings(self) -> object:
        if self.cdf:
            return "cdf"
        return {
            "op": self.op,
            "sequence_by": self.sequence_by,
            **{op: list(group) for op, group in self.values.items()},
        }


@dataclass(frozen=True)
class RelationSpec:
    """Which of a relation's columns identify its records and carry their event time (config ``relations``)."""

    id: tuple[str, ...] = setting(
        ("id",),
        doc="The column identifying a record, or a list of them whose values together do.",
        example="[region, order_no]",
    )
    event_time: str = setting(
        "ts",
        doc="The record's event time: a TIMESTAMP, DATE or integer column (ISO-8601 text reads as a timestamp).",
        example="order_time",
    )
    columns: dict[str, str] = setting(
        doc="Spark SQL types for columns of text files (CSV, JSON); a CSV column is a string otherwise.",
        example="{amount: double, placed: timestamp}",
        factory=dict,
    )
    required: tuple[str, ...] = setting(
        (),
        doc="Further columns a record must have (not null, not empty); rows without them are quarantined.",
        example="[customer]",
    )
    table: str | None = setting(
        None,
        doc="A Delta table (a path, or `catalog.schema.table`) read in place, version by version, instead of files.",
        unset="files, given to `lakejoin ingest`",
        example="/data/raw/orders",
    )
    skip_change_commits: bool = setting(
        False,
        doc="With a `table`: skip its commits that remove or rewrite rows (DELETE, UPDATE, MERGE, overwrite) instead "
        "of refusing them.",
    )
    changes: ChangeSpec | None = setting(
        None,
        doc="The rows are changes of records, not new records: `cdf` for a table's Change Data Feed, or the "
        "`changes.*` settings below for files. Inner and synchronized joins only.",
        unset="new records only",
        example="{op: op, sequence_by: lsn}",
    )
    idle_after: float | None = setting(
        None,
        doc="Processing time without an arrival after which the relation counts as idle, so the others' rows and "
        "eviction stop waiting on its watermark: a duration, or an integer number of seconds.",
        unset="never idle",
        example="15 minutes",
    )
    landing: str | None = setting(
        None,
        doc="A folder where the relation's raw files land (a Unity Catalog Volume on Databricks). Every `lakejoin run` "
        "first ingests the files new there, as `lakejoin ingest --landing` does: Auto Loader on Databricks, with its "
        "checkpoint in the folder's `_lakejoin_checkpoint`, one per warehouse; a listing elsewhere.",
        unset="files are given to `lakejoin ingest`",
        example="/Volumes/main/lakejoin/landing/orders",
    )

    @classmethod
    def default(cls) -> RelationSpec:
        """Records with ``id``, ``ts`` and ``key``: the mapping when ``relations`` is not configured."""
        return cls(required=("key",))

    @classmethod
    def parse(cls, name: str, raw: object) -> RelationSpec:
        if isinstance(raw, RelationSpec):
            return raw
        known = [each.name for each in fields(cls)]
        if not isinstance(raw, dict) or set(raw) - set(known):
            extra = sorted(set(raw) - set(known)) if isinstance(raw, dict) else [raw]
            raise LakejoinError(f"config: relations.{name} has unknown setting {extra[0]!r}; known: {', '.join(known)}")
        ids = raw.get("id", "id")
        ids = (ids,) if isinstance(ids, str) else ids
        required = raw.get("required", [])
        columns = raw.get("columns", {})
        if not isinstance(ids, (list, tuple)) or not ids or not all(_is_name(column) for column in ids):
            raise LakejoinError(
                f"config: relations.{name}.id must be a column name or a list of them, got {raw.get('id')!r}"
            )
        if not _is_name(raw.get("event_time", "ts")):
            raise LakejoinError(
                f"config: relations.{name}.event_time must be a column name, got {raw.get('event_time')!r}"
            )
        if not isinstance(required, list) or not all(_is_name(column) for column in required):
            raise LakejoinError(f"config: relations.{name}.required must be a list of column names, got {required!r}")
        if not isinstance(columns, dict) or not all(_is_name(k) and isinstance(v, str) for k, v in columns.items()):
            raise LakejoinError(
                f"config: relations.{name}.columns must map column names to Spark SQL types (e.g. amount: double), got "
                f"{columns!r}"
            )
        table, skip = raw.get("table"), raw.get("skip_change_commits", False)
        if table is not None and (not isinstance(table, str) or not table.strip()):
            raise LakejoinError(
                f"config: relations.{name}.table must be a Delta table's path or catalog name, got {table!r}"
            )
        if table is not None and columns:
            raise LakejoinError(
                f"config: relations.{name}.columns types the columns of text files; table {table} declares its own "
                "types: remove it"
            )
        if not isinstance(skip, bool) or (skip and table is None):
            raise LakejoinError(
                f"config: relations.{name}.skip_change_commits must be true or false, and only with a table, got "
                f"{skip!r}"
            )
        changes = ChangeSpec.parse(name, raw.get("changes"), table)
        if changes is not None and skip:
            raise LakejoinError(
                f"config: relations.{name}: a change feed applies a source table's updates and deletes; "
                "skip_change_commits would drop them: remove it"
            )
        followed = [] if changes is None or changes.cdf else [changes.op, changes.sequence_by]
        for key, names in (
            ("id", ids),
            ("event_time", [raw.get("event_time", "ts")]),
            ("required", required),
            ("columns", list(columns)),
            ("changes", followed),
        ):
            for column in names:
                if storable(column, 0) != column:
                    raise LakejoinError(
                        f"config: relations.{name}.{key} names {column!r}, which bronze stores as "
                        f"{storable(column, 0)!r} (Delta cannot store whitespace or ' ,;{{}}()=' in a name): use "
                        f"{storable(column, 0)!r}"
                    )
        idle = None if raw.get("idle_after") is None else _seconds(raw["idle_after"], f"relations.{name}.idle_after")
        landing = raw.get("landing")
        if landing is not None and (not isinstance(landing, str) or not landing.strip()):
            raise LakejoinError(f"config: relations.{name}.landing must be a folder's path, got {landing!r}")
        if landing is not None and table is not None:
            raise LakejoinError(
                f"config: relations.{name} reads table {table} in place and takes no files: remove its landing or its "
                "table"
            )
        return cls(
            tuple(ids), raw.get("event_time", "ts"), dict(columns), tuple(required), table, skip, changes, idle, landing
        )

    @property
    def record_columns(self) -> list[str]:
        """The columns every record of the relation has: its id, its event time, the required ones (and a change
        file's operation and sequence)."""
        changes = [] if self.changes is None or self.changes.cdf else [self.changes.op, self.changes.sequence_by]
        return list(dict.fromkeys([*self.id, self.event_time, *self.required, *changes]))

    def settings(self) -> dict[str, object]:
        settings = {
            "id": list(self.id),
            "event_time": self.event_time,
            "columns": dict(self.columns),
            "required": list(self.required),
        }
        if self.changes is not None:
            settings["changes"] = self.changes.settings()
        if self.idle_after is not None:
            settings["idle_after"] = describe_span(timedelta(seconds=self.idle_after))
        if self.landing is not None:
            settings["landing"] = self.landing
        return (
            settings
            if self.table is None
            else {**settings, "table": self.table, "skip_change_commits": self.skip_change_commits}
        )


def _seconds(value: object, setting: str) -> float:
    """A processing-time span: a duration text (``"15 minutes"``) or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    try:
        span = duration(value, setting) if isinstance(value, str) else None
    except LakejoinError:
        span = None
    if not isinstance(span, timedelta) or span <= timedelta(0):
        raise LakejoinError(
            f"config: {setting} must be a duration such as '15 minutes' or a number of seconds, got {value!r}"
        )
    return span.total_seconds()


def _is_name(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip()) and not value.startswith("_")


R = Relation("r", 0)
S = Relation("s", 1)
RELATIONS: tuple[Relation, ...] = (R, S)  # when the config names no relations
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def relations_named(names: Sequence[str]) -> tuple[Relation, ...]:
    """The relations of a join, ranked in the order they are listed (the order breaks event-time ties)."""
    for name in names:
        if not _NAME.match(name):
            raise LakejoinError(
                f"config: relation name {name!r} must be lower-case letters, digits and '_', starting with a letter "
                "(it names tables and is the predicate's alias)"
            )
    if len(names) < 2:
        raise LakejoinError(
            f"config: 'relations' must name at least two relations to join, got {', '.join(names) or 'none'}"
        )
    return tuple(Relation(name, rank) for rank, name in enumerate(names))


def default_specs(relations: Sequence[Relation] = RELATIONS) -> dict[str, RelationSpec]:
    """Every relation's columns when the config names none: ``id``, ``ts``, and ``key`` required."""
    return {rel.name: RelationSpec.default() for rel in relations}


def relation(name: str, relations: Sequence[Relation] = RELATIONS) -> Relation:
    for candidate in relations:
        if candidate.name == name.lower():
            return candidate
    raise LakejoinError(f"unknown relation {name!r}: the config's relations are {', '.join(r.name for r in relations)}")


def others(of: Relation, relations: Sequence[Relation] = RELATIONS) -> tuple[Relation, ...]:
    return tuple(candidate for candidate in relations if candidate != of)
