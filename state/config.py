"""The YAML config: the relations' columns, what to join on, how late records may be, what gold keeps, how big a
batch may be, which Delta engine to use."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from datetime import timedelta

from state.engines import ENGINE_NAMES
from state.errors import LakejoinError
from state.event_time import INTEGER, TIMESTAMP, span_on_axis
from state.join.asof import backward
from state.join.final import JOIN_KINDS, JoinKind, JoinSpec
from state.join.relations import RELATIONS, Relation, RelationSpec, default_specs, relations_named
from state.layout import GOLD_TABLE, LAYERS, Warehouse, is_name
from state.settings import setting
from state.spans import describe_span, duration

Span = int | timedelta  # an integer (integer event time) or a duration (timestamps, dates)


@dataclass(frozen=True)
class Expectations:
    """The ``expectations`` section: the plausible ts range, per-rule policies."""

    ts_min: int | None = setting(
        0,
        doc="`bronze_ts_plausible`: an event time below this is implausible, on the event-time axis (microseconds "
        "since 1970 for timestamps); null: no lower bound.",
    )
    ts_max: int | None = setting(None, doc="And above this; null: no upper bound.")
    policies: dict[str, str] = setting(
        doc="Per rule (by name): `warn`, `quarantine` (row rules only) or `fail`.",
        unset="each rule's own policy (the table of rules below)",
        example="{bronze_ts_plausible: quarantine}",
        factory=dict,
    )

    def policy(self, rule: str, default: str) -> str:
        """The policy of the rule named ``rule``: the config's, else the rule's own ``default``."""
        return self.policies.get(rule, default)


@dataclass(frozen=True, kw_only=True)
class Config:
    """A pipeline's definition, valid once built: what is joined and how. ``Config.of(**settings)`` (or
    ``config_from``) builds it from the settings as written, each optional; its fields hold them as the join uses
    them (relations with their columns, spans parsed, the default predicate filled in). Its reference (docs/config.md)
    is generated from the fields below."""

    relations: dict[str, RelationSpec] = setting(
        doc="The relations joined, in rank order (the rank breaks event-time ties), each mapped to its settings "
        "(below). Two or more names of your own; a mapping naming only `r` and/or `s` keeps the other's defaults.",
        unset="`r` and `s`, each with `id`, `ts` and a required `key`",
        example="{orders: {id: order_id, event_time: order_time}, payments: {id: payment_id, event_time: paid_at}}",
    )
    predicate: str = setting(
        doc="What joins: any Spark SQL boolean expression over the relations' aliases (`r.*`, `s.*`, or the names "
        "you gave). Columns whose names need it are written with backticks (``r.`c.d` ``).",
        unset="equal `key` along the relations (`r.key = s.key`); a synchronized join: none (time alone)",
        example='"orders.customer = payments.customer"',
    )
    join: str = setting(
        "inner",
        doc="`inner`: every tuple the predicate (and window) accepts. `synchronized`: tuples of records at one event "
        "time. `left`, `right`, `full`, `semi`, `anti` (two relations, the first is left): each unmatched row once "
        "final. `asof`, `asof_left`: each left record with the latest right record at or before it.",
    )
    select: list[str] | None = setting(
        None,
        doc="Gold's columns: Spark SQL expressions over the relations' aliases.",
        unset="every column of every member, prefixed with its relation's name",
        example='["r.order_id", "s.amount - r.amount AS difference"]',
    )
    max_batch_rows: int = setting(
        1_000_000,
        doc="Arrivals per batch, every relation's together (a landing file's rows count whole: a batch takes at least "
        "one file).",
    )
    max_batch_files: int = setting(1_000, doc="Landing files per batch.")
    max_batch_bytes: int = setting(
        1 << 30, doc="Bytes of landing files per batch (a batch takes at least one file).", unset="1 GiB"
    )
    engine: str = setting(
        "auto",
        doc="The Delta engine: `delta-rs` (embedded), `spark` (Delta on Spark, needs Delta's jars or a Databricks "
        "runtime), or `auto`: Delta on Spark when the session has it, else delta-rs.",
    )
    pipeline: str = setting("lakejoin", doc="Names the Delta application transactions of this pipeline's writes.")
    layers: dict[str, str] = setting(
        doc="Where a layer's tables live when not under the warehouse: `bronze`, `silver` (state, batch log), `gold`, "
        "`quarantine`, each a folder or a Unity Catalog schema of its own, its tables named without the layer "
        "(`main.silver.orders_state`). The definition stays at the warehouse. Fixed once the warehouse has one.",
        unset="every layer under the warehouse (`WAREHOUSE/silver/orders_state`; in a schema, `silver_orders_state`)",
        example="{bronze: main.raw, silver: main.silver, gold: main.analytics}",
        factory=dict,
    )
    gold_table: str = setting(
        GOLD_TABLE,
        doc="Gold's name within its layer. Fixed once the warehouse has a definition.",
        example="orders_payments",
    )
    allowed_lateness: dict[str, Span] = setting(
        doc="How far below the newest event time seen a record may still arrive: a duration (`10 minutes`) for "
        "timestamps and dates, an integer for integer event times; one value for every relation, or one per "
        "relation. A record below its relation's watermark is late: set aside, not joined.",
        unset="no watermarks: nothing is late, and stores keep full history",
        example="{r: 10 minutes, s: 2 minutes}",
        factory=dict,
    )
    window: Span | None = setting(
        None,
        doc="A band: every two members of a tuple within this much event time of each other. With "
        "`allowed_lateness`, stores evict what the band leaves behind.",
        unset="no band",
        example="1 hour",
    )
    tolerance: Span | None = setting(
        None,
        doc="As-of joins only, instead of `window`: no match older than this before the left record.",
        unset="a match of any age",
        example="5 minutes",
    )
    direction: str = setting(
        "backward",
        doc="As-of joins: which way the match looks. Only `backward` is built (the latest right record at or before "
        "the left's time); `forward` and `nearest` are refused.",
    )
    expectations: Expectations = setting(
        doc="Data-quality settings: the `expectations.*` settings below.",
        unset="every rule at its default policy",
        factory=Expectations,
    )

    def __post_init__(self) -> None:
        """Refuse a definition that cannot join: each check names the setting and what to do."""
        self._check_as_of()
        self._check_finality(list(self.relations))
        self._check_changes()
        if not isinstance(self.predicate, str) or not self.predicate.strip():
            raise LakejoinError(
                "config: 'predicate' must be a non-empty Spark SQL expression over "
                f"{', '.join(f'{name}.*' for name in self.relations)}"
            )
        for name in ("max_batch_rows", "max_batch_files", "max_batch_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LakejoinError(f"config: '{name}' must be a positive integer, got {value!r}")
        if self.engine not in ENGINE_NAMES:
            raise LakejoinError(f"config: 'engine' must be one of {', '.join(ENGINE_NAMES)}, got {self.engine!r}")
        if not isinstance(self.gold_table, str) or not is_name(self.gold_table):
            raise LakejoinError(
                "config: 'gold_table' must be a name of letters, digits and _ (not starting with a digit), got "
                f"{self.gold_table!r}"
            )

    @classmethod
    def of(cls, **settings: object) -> Config:
        """The definition the settings give, as a YAML file would write them (``window="1 hour"``)."""
        return config_from(settings)

    def _check_as_of(self) -> None:
        """``tolerance`` and ``direction`` are an as-of join's, which bounds a match's age by its tolerance only."""
        as_of = self.join_kind.as_of
        if as_of and self.window is not None:
            raise LakejoinError(
                f"config: join: {self.join} bounds a match's age with 'tolerance' (no match older than that), not "
                "'window': rename it"
            )
        if not as_of and self.tolerance is not None:
            raise LakejoinError(
                f"config: 'tolerance' bounds an as-of join's match (join: asof | asof_left); join: {self.join} takes "
                "'window'"
            )
        if self.direction == "backward":
            return
        if not as_of:
            raise LakejoinError(
                f"config: 'direction' is an as-of join's (join: asof | asof_left), not join: {self.join}'s: remove it"
            )
        if self.direction in ("forward", "nearest"):
            raise LakejoinError(
                f"config: direction: {self.direction} is not built: an as-of join takes the latest right record at or "
                "before the left's time (direction: backward)"
            )
        raise LakejoinError(f"config: 'direction' must be backward, got {self.direction!r}")

    @property
    def reads_changes(self) -> bool:
        """Some relation is a change feed (state/join/changes.py)."""
        return any(spec.changes is not None for spec in self.relations.values())

    def _check_changes(self) -> None:
        changing = [name for name, spec in self.relations.items() if spec.changes is not None]
        if changing and self.join not in ("inner", "synchronized"):
            raise LakejoinError(
                f"config: relations.{changing[0]}.changes: join: {self.join} over change feeds is not built (a change "
                "would retract rows already final); change feeds join with join: inner or synchronized"
            )

    def _check_finality(self, names: list[str]) -> None:
        """A join emitting rows once final takes two relations, and the other relation's lateness for each waiting
        one (with a window too for unmatched rows): without them no record is ever final, and its row never comes."""
        if self.join in ("inner", "synchronized"):
            return
        if len(names) != 2:
            raise LakejoinError(
                f"config: join: {self.join} joins two relations (the first is left), got {len(names)}: "
                f"{', '.join(names)}"
            )
        kind = self.join_kind
        for rel in kind.waiting(self.joined):
            other = next(name for name in names if name != rel.name)
            if kind.as_of and self.lateness(other) is None:
                raise LakejoinError(
                    f"config: join: {self.join} emits each {rel.name} record once no {other} record at or before its "
                    f"time can still arrive, which takes an 'allowed_lateness' for {other}: set it (without it that "
                    "row is never final)"
                )
            if not kind.as_of and (self.window is None or self.lateness(other) is None):
                raise LakejoinError(
                    f"config: join: {self.join} emits each {rel.name} record that never matches once no {other} record "
                    f"can still match it, which takes a 'window' and an 'allowed_lateness' for {other}: set both "
                    "(without them that row is never final)"
                )

    @property
    def join_kind(self) -> JoinKind:
        """What gold holds for this join (state/join/final.py); a synchronized join is an inner join of equal times."""
        return JOIN_KINDS["inner" if self.join == "synchronized" else self.join]

    @property
    def event_times(self) -> dict[str, str]:
        """Each relation's event-time column, by relation: what tells the warehouse's event-time axis."""
        return {rel.name: self.spec(rel.name).event_time for rel in self.joined}

    @property
    def joined(self) -> tuple[Relation, ...]:
        """The relations the join takes, ranked in the order the config lists them."""
        return relations_named(list(self.relations))

    def lateness(self, rel: str) -> Span | None:
        """The allowed lateness of relation ``rel``, or None when it has no watermark."""
        return self.allowed_lateness.get(rel)

    def spec(self, rel: str) -> RelationSpec:
        """Which of ``rel``'s columns are its records' id and event time."""
        return self.relations[rel]

    @property
    def reads_tables(self) -> bool:
        """Some relation is read in place from a Delta table the user has (pipelines/bronze/sources.py)."""
        return any(spec.table is not None for spec in self.relations.values())

    @property
    def landings(self) -> dict[str, str]:
        """Each relation with a landing folder, by name: ``run`` ingests what landed there before it joins."""
        return {name: spec.landing for name, spec in self.relations.items() if spec.landing is not None}

    @property
    def quality(self) -> Expectations:
        return self.expectations

    def placed(self, warehouse: Warehouse) -> Warehouse:
        """``warehouse``'s tables as this config places and names them."""
        return replace(
            warehouse,
            relations=self.joined,
            pipeline=self.pipeline,
            layers=tuple(self.layers.items()),
            gold_table=self.gold_table,
        )

    def on_axis(self, kind: str | None) -> OnAxis:
        """This definition on the event-time axis of ``kind`` (state/event_time.py; None before anything landed: each
        span on its own kind's axis, an integer as given and a duration in microseconds); a duration for integer
        time, or an integer for timestamps, is a config error."""

        def axis_of(span: Span) -> str:
            return kind or (TIMESTAMP if isinstance(span, timedelta) else INTEGER)

        def placed(span: Span | None, setting: str) -> int | None:
            return None if span is None else span_on_axis(span, axis_of(span), setting)

        lateness = {
            rel: span_on_axis(span, axis_of(span), "allowed_lateness") for rel, span in self.allowed_lateness.items()
        }
        return OnAxis(self, kind, lateness, placed(self.window, "window"), placed(self.tolerance, "tolerance"))

    def settings(self) -> dict[str, object]:
        """Every setting as the YAML would give it (durations as text), for the warehouse's definition."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["relations"] = {name: spec.settings() for name, spec in self.relations.items()}
        values["allowed_lateness"] = {rel: _span_text(span) for rel, span in self.allowed_lateness.items()}
        for name in ("window", "tolerance"):
            values[name] = None if values[name] is None else _span_text(values[name])
        values["expectations"] = {f.name: getattr(self.quality, f.name) for f in fields(Expectations)}
        return values

    def with_overrides(self, **overrides: object) -> Config:
        """This definition with the settings given a value (a command's ``--max-batch-rows``) replaced."""
        return replace(self, **{name: value for name, value in overrides.items() if value is not None})


JOINS = ("inner", "synchronized", *(kind for kind in JOIN_KINDS if kind != "inner"))


@dataclass(frozen=True)
class OnAxis:
    """A definition on the warehouse's event-time axis: its spans as numbers in the axis's units (microseconds for
    timestamps, days for dates), what a batch compares event times with. ``Config.on_axis`` builds it."""

    config: Config
    kind: str | None  # the axis (state/event_time.py); None before anything landed
    allowed_lateness: dict[str, int]
    window: int | None
    tolerance: int | None

    @property
    def reach(self) -> int | None:
        """How far apart in event time a row's members may be: the window, or an as-of join's tolerance."""
        return self.tolerance if self.config.join_kind.as_of else self.window

    def lateness(self, rel: str) -> int | None:
        """The allowed lateness of relation ``rel``, or None when it has no watermark."""
        return self.allowed_lateness.get(rel)

    @property
    def join_condition(self) -> str:
        """The predicate, with the band window (or tolerance) on every two relations when one is set."""
        predicate, joined = self.config.predicate, self.config.joined
        bounds = [backward(*joined)] if self.config.join_kind.as_of else []
        if self.reach is None:
            return " AND ".join([f"({predicate})", *bounds]) if bounds else predicate
        band = (
            "{a}._ts = {b}._ts" if self.reach == 0 else f"abs({{a}}._ts - {{b}}._ts) <= {self.reach}"
        )  # =: a hash join
        names = [rel.name for rel in joined]
        bands = [band.format(a=a, b=b) for i, a in enumerate(names) for b in names[i + 1 :]]
        return " AND ".join([f"({predicate})", *bands, *bounds])

    @property
    def join_spec(self) -> JoinSpec:
        """The join as a batch computes it."""
        return JoinSpec(self.config.join_kind, self.config.predicate, self.join_condition, self.reach)

    def rule_parameters(self, rel: str | None = None) -> dict[str, object]:
        """What ``${name}`` stands for in the suites (``record_columns``: those of relation ``rel``; ``members``: gold's
        member id columns)."""
        config = self.config
        return {
            "ts_min": config.quality.ts_min,
            "ts_max": config.quality.ts_max,
            "window": self.reach,
            "record_columns": None if rel is None else config.spec(rel).record_columns,
            "members": config.join_kind.row_keys(config.joined),
        }


def _expectations(value: object) -> Expectations:
    if isinstance(value, Expectations):
        return value
    if value is None:
        return Expectations()
    known = {f.name for f in fields(Expectations)}
    if isinstance(value, dict) and "engine" in value:
        raise LakejoinError(f"config: {RETIRED['expectations.engine']}")
    if not isinstance(value, dict) or set(value) - known:
        unknown = sorted(set(value) - known) if isinstance(value, dict) else [value]
        raise LakejoinError(
            f"config: 'expectations' has unknown setting {unknown[0]!r}; known: {', '.join(sorted(known))}"
        )
    settings = Expectations(**value)
    for bound in ("ts_min", "ts_max"):
        given = getattr(settings, bound)
        if given is not None and (not isinstance(given, int) or isinstance(given, bool)):
            raise LakejoinError(
                f"config: 'expectations.{bound}' must be an integer (on the event-time axis) or null, got {given!r}"
            )
    if not isinstance(
        settings.policies, dict
    ):  # which rules there are, and the policies each may take: expectations/rules.py
        raise LakejoinError("config: 'expectations.policies' must map rule names to warn, quarantine or fail")
    return settings


# Settings lakejoin no longer has, each with what to do instead.
RETIRED = {
    "driver_rows": "'driver_rows' is retired: a batch's rows stay in Spark whatever their number; remove it",
    "expectations.engine": (
        "'expectations.engine' is retired: a batch checks its rules in Spark, inside the jobs that write its rows; "
        "remove it"
    ),
}


def _span_text(span: Span) -> int | str:
    return span if isinstance(span, int) else describe_span(span)


def _lateness(value: object, names: list[str]) -> dict[str, Span]:
    """``allowed_lateness`` as relation name -> span: one value for all, a mapping per relation, or none."""
    if value is None:
        return {}
    if isinstance(value, dict):
        if not set(value) <= set(names):
            raise LakejoinError(f"config: 'allowed_lateness' maps relations {', '.join(names)}, got {sorted(value)!r}")
        return {rel: duration(span, f"allowed_lateness.{rel}") for rel, span in value.items()}
    return dict.fromkeys(names, duration(value, "allowed_lateness"))


def _relations(value: object) -> dict[str, RelationSpec]:
    """The relations in rank order, each with its columns: as configured (a relation given no settings has the
    default mapping: ``id``, ``ts``, and ``key`` required), or r and s."""
    if value is None:
        value = {}
    if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
        raise LakejoinError(
            "config: 'relations' maps each relation's name to its columns (e.g. trades: {id: trade_id, event_time: "
            f"t}}), got {value!r}"
        )
    given = {
        name: RelationSpec.default() if spec is None else RelationSpec.parse(name, spec) for name, spec in value.items()
    }
    two_way = {rel.name for rel in RELATIONS}
    specs = {**default_specs(), **given} if set(given) <= two_way else given
    relations_named(list(specs))
    return specs


def _layers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or any(layer not in LAYERS for layer in value):
        raise LakejoinError(
            f"config: 'layers' must map some of {', '.join(LAYERS)} to a folder or a catalog schema, got {value!r}"
        )
    for layer, where in value.items():
        if not isinstance(where, str) or not where.strip():
            raise LakejoinError(
                f"config: 'layers.{layer}' must be a folder or a catalog schema (catalog.schema), got {where!r}"
            )
    return {layer: value[layer] for layer in LAYERS if layer in value}


def _select(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(item, str) and item.strip() for item in value):
        raise LakejoinError(
            "config: 'select' must be a non-empty list of Spark SQL expressions over r.* and s.*, e.g. ['r.order_id', "
            "'s.amount AS paid']"
        )
    return list(value)


def config_from(raw: object, where: str = "config") -> Config:
    """The definition a document of settings gives (a YAML file's mapping, a caller's dict); ``where`` names it in
    errors."""
    if not isinstance(raw, dict):
        raise LakejoinError(f"{where} must be a mapping of settings")
    known = {f.name for f in fields(Config)}
    if "driver_rows" in raw:
        raise LakejoinError(f"{where}: {RETIRED['driver_rows']}")
    unknown = sorted(set(raw) - known)
    if unknown:
        raise LakejoinError(f"{where}: unknown setting {unknown[0]!r}; known settings: {', '.join(sorted(known))}")
    return Config(**_defined(raw))


def _defined(written: dict[str, object]) -> dict[str, object]:
    """The settings as the definition holds them: relations with their columns, the default predicate filled in,
    spans parsed (a synchronized join: the band window 0, in-order streams by default), the sections checked."""
    relations = _relations(written.get("relations"))
    names = list(relations)
    join = written.get("join", "inner")
    if join not in JOINS:
        raise LakejoinError(f"config: 'join' must be one of {', '.join(JOINS)}, got {join!r}")
    synchronized = join == "synchronized"
    predicate = written.get("predicate")
    if predicate is None:
        predicate = "true" if synchronized else " AND ".join(f"{a}.key = {b}.key" for a, b in zip(names, names[1:]))
    window = _span(written.get("window"), "window")
    lateness = _lateness(written.get("allowed_lateness"), names)
    if synchronized:  # every member at one event time: the band window 0; in-order streams by default
        if window:
            raise LakejoinError(
                "config: a synchronized join joins records of equal event time and takes no 'window' (got "
                f"{_span_text(window)}): remove it"
            )
        window, lateness = 0, lateness or dict.fromkeys(names, 0)
    return written | {
        "relations": relations,
        "predicate": predicate,
        "select": _select(written.get("select")),
        "allowed_lateness": lateness,
        "window": window,
        "tolerance": _span(written.get("tolerance"), "tolerance"),
        "expectations": _expectations(written.get("expectations")),
        "layers": _layers(written.get("layers")),
    }


def _span(value: object, setting: str) -> Span | None:
    return None if value is None else duration(value, setting)


def reference() -> str:
    """The config reference in Markdown, from the settings' own definitions (docs/config.md is built from it): every
    setting with what leaving it out means and what it does."""
    from state.join.relations import ChangeSpec
    from state.settings import documented

    lines = []
    for title, prefix, cls in (
        ("Settings", "", Config),
        ("Per relation", "relations.NAME.", RelationSpec),
        ("A change feed of files", "relations.NAME.changes.", ChangeSpec),
        ("Data quality", "expectations.", Expectations),
    ):
        lines += [f"### {title}", "", "| setting | unset | what it does |", "|---|---|---|"]
        for each in documented(cls):
            keys = ", ".join(f"`{prefix}{key.strip()}`" for key in each.name.split(","))
            example = "" if each.example is None else f" Example: `{each.example}`."
            lines.append(f"| {keys} | {_cell(each.default)} | {_cell(each.doc + example)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """``text`` inside a Markdown table cell: code spans for values written as YAML, pipes escaped."""
    shown = text if "`" in text or " " in text else f"`{text}`"
    return shown.replace("|", "\\|")
