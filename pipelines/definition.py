"""The pipeline's definition, kept in the warehouse (``silver/definition``) so that its meaning cannot drift.

Gold is the join of bronze under one definition: the relations' columns, the predicate, the window, the
lateness, the projection, the rule policies. The first command given a config records it; later commands
without ``--config`` use the recorded one. A config that changes a setting which alters gold, on a warehouse
that already has batches, is refused before anything is written: gold would otherwise be the join of
neither definition (Structured Streaming refuses an incompatible restart from its checkpoint the same way).
``lakejoin reset`` drops gold and silver, after which a new definition rebuilds them from bronze. Settings
that only change how the work is done (batch size, engine) change freely; every change is recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from expectations.rules import check_policies
from state.clock import now
from state.config import Config
from state.engines import DeltaEngine
from state.engines.base import DeltaReader
from state.errors import LakejoinError
from state.join.relations import RELATIONS, Relation
from state.layout import Warehouse

# Settings that do not change what gold holds; every other one does, including any added later.
OPERATIONAL = frozenset({"max_batch_rows", "max_batch_files", "max_batch_bytes", "engine"})
# Per relation: how a source table's next change commit is met (refused or skipped), and where new files are looked
# for; what was joined stays.
OPERATIONAL_PER_RELATION = frozenset({"skip_change_commits", "landing"})
# What bronze was ingested under: a change would give bronze's rows another meaning, which no reset undoes
# (a relation's source table: bronze points into it; a change feed's rows are changes, not records).
INGESTED = ("id", "event_time", "table", "changes")
# Where the tables are: lakejoin makes a table where the definition says and never moves one.
PLACED = ("layers", "gold_table")

SCHEMA = pa.schema(
    [
        ("version", pa.int64()),
        ("definition", pa.string()),  # every setting, as JSON (durations as text)
        ("changed", pa.string()),  # what changed since the previous version, one "setting: old -> new" per line
        ("command", pa.string()),  # the lakejoin command that recorded it
        ("recorded_at", pa.timestamp("us", tz="UTC")),
    ]
)


@dataclass(frozen=True)
class Recorded:
    version: int
    settings: dict[str, object]
    recorded_at: datetime


def recorded(engine: DeltaReader, warehouse: Warehouse) -> Recorded | None:
    """The definition in force: the warehouse's newest recorded one, or None before any."""
    rows = engine.rows(warehouse.definition)
    if rows is None or rows.num_rows == 0:
        return None
    newest = max(rows.to_pylist(), key=lambda row: row["version"])
    return Recorded(newest["version"], _without_retired(json.loads(newest["definition"])), newest["recorded_at"])


def _without_retired(settings: dict) -> dict:
    """A definition recorded by an earlier lakejoin, less the settings it no longer has (state/config.py ``RETIRED``):
    each only said how a batch did its work, never what gold holds."""
    settings.pop("driver_rows", None)
    if isinstance(settings.get("expectations"), dict):
        settings["expectations"].pop("engine", None)
    return settings


def in_force(current: Recorded | None) -> Config:
    """The config a recorded definition says, or the defaults before any."""
    if current is None:
        return Config.of()
    config = Config.of(**current.settings)
    check_policies(config.quality)  # a rule the suites no longer have is refused, not silently skipped
    return config


@dataclass(frozen=True)
class Settled:
    """The config a command works with, and the definition version to record once the command has succeeded."""

    config: Config
    pending: dict | None = None  # the row ``record`` appends; None when there is nothing new to record


def settle(engine: DeltaReader, warehouse: Warehouse, given: Config | None, command: str) -> Settled:
    """``given``, checked against the recorded definition (a gold-altering change is refused here, before the
    command writes anything), else the recorded one, else the defaults."""
    current = recorded(engine, warehouse)
    if given is None:
        return Settled(in_force(current))
    check_policies(given.quality)
    settings = given.settings()
    # A warehouse that has data but no recorded definition was built under the defaults.
    # A setting added to lakejoin after a definition was recorded reads as its default there.
    defaults = _plain(Config.of().settings())
    baseline = (
        {**defaults, **current.settings}
        if current is not None
        else (defaults if _has_data(engine, warehouse) else None)
    )
    changes = [] if baseline is None else differences(baseline, _plain(settings))
    ranks = list(settings["relations"])  # type: ignore[call-overload]
    order = (list(baseline.get("relations", {})), ranks) if baseline is not None else None
    if order is not None and sorted(order[0]) == sorted(order[1]) and order[0] != order[1]:  # the ranks change
        changes.append(("relations (order)", order[0], order[1]))
    _refuse_gold_changes(engine, warehouse, changes)
    if current is not None and not changes:
        return Settled(given)
    row = {
        "version": 0 if current is None else current.version + 1,
        "definition": json.dumps(settings),  # in the config's order: the relations' order is their rank
        "changed": "\n".join(f"{name}: {_show(old)} -> {_show(new)}" for name, old, new in changes),
        "command": command,
        "recorded_at": now(),
    }
    return Settled(given, row)


def record(engine: DeltaEngine, warehouse: Warehouse, settled: Settled) -> None:
    """Append the definition ``settle`` found new, after the command that was given it succeeded (a command that
    fails or refuses leaves the warehouse as it was)."""
    if settled.pending is not None:
        engine.append(warehouse.definition, pa.Table.from_pylist([settled.pending], SCHEMA))


def recorder(engine: DeltaEngine, warehouse: Warehouse, settled: Settled) -> Callable[[], None]:
    """``record`` on the first call only: a run calls it before each batch's first write, so the batches it commits
    are under the definition recorded, and a run stopped by a rule before writing leaves the warehouse as it was."""
    pending = [settled]

    def record_once() -> None:
        if pending:
            record(engine, warehouse, pending.pop())

    return record_once


def differences(old: dict, new: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """Every setting whose value differs, as (dotted name, old, new); nested mappings are compared key by key."""
    changes = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if isinstance(before, dict) and isinstance(after, dict):
            changes += differences(before, after, f"{prefix}{name}.")
        elif before != after:
            changes.append((f"{prefix}{name}", before, after))
    return changes


def _refuse_gold_changes(engine: DeltaReader, warehouse: Warehouse, changes: list[tuple[str, object, object]]) -> None:
    for name, old, new in changes:
        parts = name.split(".")
        if parts[0] in PLACED:
            raise LakejoinError(
                f"config changes {name} from {_show(old)} to {_show(new)}, but {warehouse.root}'s tables are made "
                f"where its definition says and lakejoin does not move them: keep {_show(old)}, or start a new "
                "warehouse"
            )
        if name in OPERATIONAL or (
            parts[0] == "relations" and len(parts) == 3 and parts[2] in OPERATIONAL_PER_RELATION
        ):
            continue
        if (
            parts[0] == "relations"
            and len(parts) >= 3
            and parts[2] in INGESTED
            and engine.version(warehouse.bronze(_relation(parts[1]))) is not None
        ):
            raise LakejoinError(
                f"config changes {name} from {_show(old)} to {_show(new)}, but bronze/{parts[1]} was ingested with "
                f"{_show(old)} and keeps that meaning: keep {_show(old)}, or ingest into a new warehouse"
            )
        if _has_batches(engine, warehouse):
            raise LakejoinError(
                f"config changes {name} from {_show(old)} to {_show(new)}, which alters gold, and {warehouse.root} has "
                f"joined batches under {_show(old)}: keep it, or run 'lakejoin reset --warehouse {warehouse.root} "
                "--yes' so the new definition rebuilds gold from bronze"
            )


def _relation(name: str) -> Relation:
    """The relation called ``name``, for its bronze table's path (which depends on the name alone)."""
    return Relation(name, 0)


def _has_batches(engine: DeltaReader, warehouse: Warehouse) -> bool:
    return engine.max_value(warehouse.batches, "batch_id") is not None


def _has_data(engine: DeltaReader, warehouse: Warehouse) -> bool:
    return any(engine.version(warehouse.bronze(rel)) is not None for rel in RELATIONS) or _has_batches(
        engine, warehouse
    )


def _plain(settings: dict) -> dict:
    """Settings as they read back from JSON (tuples become lists), so equal settings compare equal."""
    return json.loads(json.dumps(settings))


def _show(value: object) -> str:
    return "unset" if value is None else json.dumps(value)
