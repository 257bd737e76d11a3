"""Typing and classifying parsed rows: each data column gets the type bronze established for it, else the
configured one, else the file's own; the event time gets its kind's type (state/event_time.py); every row is
accepted, a duplicate (skipped) or quarantined with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pipelines.bronze.parse import Parsed
from state.engines import DeltaEngine
from state.errors import FileRefused, LakejoinError
from state.event_time import INTEGER, INTEGER_TEXT, STORED_TYPE, TIMESTAMP, as_event_time, kind_of, on_axis
from state.frames import union_by_name
from state.join.relations import DELETE, ID, INSERT, OP, SEQ, TS, UPDATE, ChangeSpec, Relation, RelationSpec, others
from state.layout import Warehouse
from state.names import column, literal, quoted


def typed(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    specs: dict[str, RelationSpec],
    parsed: Parsed,
    configured: dict[str, DataType],
    settled: dict[str, DataType],
) -> tuple[DataFrame, dict[str, DataType]]:
    """``parsed``'s rows typed, with ``_id``, ``_ts`` and the reason for what fails; and the type each column got.
    ``settled``: the types already established (bronze's, those earlier files of a batch gave), which win over the
    configured ones, which win over the file's own. Raises ``FileRefused`` when a column does not widen to its type."""
    spelled = _in_bronze_spelling(parsed, StructType([StructField(name, kind) for name, kind in settled.items()]))
    layout = _layout(engine, warehouse, rel, specs, spelled, {**configured, **settled})
    return _normalize(spelled, layout), layout.types


# Typing: each data column gets the type bronze established for it, else the configured one, else the file's own;
# the event time gets its kind's type (state/event_time.py). A value that fits no type is named in a reason.

# Parquet types that convert to an established type without losing anything.
_WIDENS = {
    (ByteType, ShortType),
    (ByteType, IntegerType),
    (ByteType, LongType),
    (ShortType, IntegerType),
    (ShortType, LongType),
    (IntegerType, LongType),
    (FloatType, DoubleType),
    (ByteType, DoubleType),
    (ShortType, DoubleType),
    (IntegerType, DoubleType),
    (DateType, TimestampType),
    (TimestampNTZType, TimestampType),
}


@dataclass(frozen=True)
class _Layout:
    """What a file's rows must become: the relation's column mapping, the event time's kind, each column's type."""

    spec: RelationSpec
    kind: str
    types: dict[str, DataType]


def configured_types(rel: Relation, spec: RelationSpec) -> dict[str, DataType]:
    try:
        return {name: DataType.fromDDL(ddl) for name, ddl in spec.columns.items()}
    except Exception as exc:  # noqa: BLE001 - Spark's parse errors have many types; the message names the setting
        raise LakejoinError(
            f"config: relations.{rel.name}.columns has a type Spark does not know ({spec.columns}): "
            f"{str(exc).splitlines()[0]}"
        ) from exc


def _in_bronze_spelling(parsed: Parsed, bronze_schema: StructType) -> Parsed:
    """The file's columns under bronze's spelling where they differ only in case: Delta holds one column per
    name whatever its case, so ``Amount`` lands in bronze's ``amount``."""
    spelling = {f.name.lower(): f.name for f in bronze_schema.fields}
    renames = {name: spelling[name.lower()] for name in parsed.types if spelling.get(name.lower(), name) != name}
    if not renames:
        return parsed
    return Parsed(
        parsed.frame.withColumnsRenamed(renames), {renames.get(n, n): t for n, t in parsed.types.items()}, parsed.text
    )


def _layout(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    specs: dict[str, RelationSpec],
    parsed: Parsed,
    settled: dict[str, DataType],
) -> _Layout:
    """``settled``: the types the config and bronze give (bronze's win)."""
    spec = specs[rel.name]
    kind = _event_time_kind(engine, warehouse, rel, specs, parsed, settled)
    types = {**_nested_that_fit(parsed, settled), **settled, spec.event_time: STORED_TYPE[kind]}
    for name, given in ({} if parsed.text else parsed.types).items():
        wanted = types[name]
        text_time = name == spec.event_time and isinstance(given, StringType)
        if given != wanted and not text_time and (type(given), type(wanted)) not in _WIDENS:
            raise FileRefused(
                f"column {name} is {given.simpleString()} there but {wanted.simpleString()} in bronze/{rel.name} (or "
                "the config), and does not widen to it: convert it, or land it under another name"
            )
    return _Layout(spec, kind, types)


def _nested_that_fit(parsed: Parsed, settled: dict[str, DataType]) -> dict[str, DataType]:
    """The file's own types, with a nested type JSON inferred kept only where every value parses into it, else
    the column kept as its JSON text. Spark infers an empty string as null, so ``["", []]`` is inferred as an
    array of arrays that its own ``""`` does not fit: no row is quarantined for what the file's inference got wrong."""
    inferred = [
        name
        for name, given in parsed.types.items()
        if parsed.text and name not in settled and isinstance(given, (StructType, ArrayType, MapType))
    ]
    if not inferred:
        return parsed.types
    misfit = [
        F.max((column(name).isNotNull() & F.from_json(column(name), parsed.types[name]).isNull()).cast("int"))
        for name in inferred
    ]
    fits = parsed.frame.where(~F.col("_unparsable")).agg(*misfit).first()
    return {**parsed.types, **{name: StringType() for name, broken in zip(inferred, fits) if broken}}


def _event_time_kind(
    engine: DeltaEngine,
    warehouse: Warehouse,
    rel: Relation,
    specs: dict[str, RelationSpec],
    parsed: Parsed,
    settled: dict[str, DataType],
) -> str:
    """The kind of ``rel``'s event time: as bronze or the config has it, else as the other relations' (all share one
    axis), else as the file gives it — text is timestamps when some value reads as one, else integers."""
    event_time = specs[rel.name].event_time
    ours = kind_of(settled[event_time]) if event_time in settled else None
    if event_time in settled and ours is None:
        raise LakejoinError(
            f"event time {event_time} of {rel.name} is {settled[event_time].simpleString()}: use a timestamp, a date "
            "or an integer column"
        )
    for other in others(rel, warehouse.relations):
        schema, theirs_column = engine.schema(warehouse.bronze(other)), specs[other.name].event_time
        theirs = (
            kind_of(schema[theirs_column].dataType)
            if schema is not None and theirs_column in schema.fieldNames()
            else None
        )
        if ours is not None and theirs is not None and ours != theirs:
            raise LakejoinError(
                f"event time {event_time} of {rel.name} is a {ours} but {theirs_column} of {other.name} is a {theirs}: "
                "both relations' event times must be of one kind"
            )
        ours = ours or theirs
    if ours is not None or event_time not in parsed.types:
        return ours or INTEGER
    given = parsed.types[event_time]
    if not parsed.text and not isinstance(given, StringType):
        if kind_of(given) is None:
            raise FileRefused(
                f"event time {event_time} of {rel.name} is {given.simpleString()} there: use a timestamp, a date or an "
                "integer column"
            )
        return kind_of(given)  # type: ignore[return-value]
    text = F.trim(column(event_time).cast("string"))
    looks_like_time = ~F.col("_unparsable") & ~text.rlike(INTEGER_TEXT) & text.try_cast(TimestampType()).isNotNull()
    return TIMESTAMP if parsed.frame.where(looks_like_time).limit(1).count() else INTEGER


def _typed(parsed: Parsed, layout: _Layout) -> list[tuple[str, str, str | None]]:
    """Each data column as (name, its typed value, the reason when its value fits no type), in SQL."""
    typed = []
    for name, declared in parsed.types.items():
        given = StringType() if parsed.text else declared  # text formats hold every value as its text until here
        value, wanted = quoted(name), layout.types[name]
        if name == layout.spec.event_time and kind_of(given) == layout.kind:  # of its kind already: nothing to parse
            typed.append((name, f"CAST({value} AS {STORED_TYPE[layout.kind].simpleString()})", None))
            continue
        if name == layout.spec.event_time:
            converted = as_event_time(value, layout.kind)
            description = f"{'an' if layout.kind == INTEGER else 'a'} {layout.kind}"
        elif given == wanted:
            typed.append((name, value, None))
            continue
        elif parsed.text and isinstance(wanted, (StructType, ArrayType, MapType)):
            converted, description = f"from_json({value}, {literal(wanted.json())})", wanted.simpleString()
        else:
            converted, description = f"try_cast({value} AS {sql_type(wanted)})", wanted.simpleString()
        text = f"trim(CAST({value} AS STRING))"
        misfit = (
            f"CASE WHEN {value} IS NOT NULL AND {text} != '' AND ({converted}) IS NULL THEN "
            f"concat({literal(f'{name} is not {description}: ')}, {text}) END"
        )
        typed.append((name, converted, misfit))
    return typed


def sql_type(data_type: DataType) -> str:
    """``data_type`` as SQL spells it, a nested field's name quoted whatever characters it holds."""
    if isinstance(data_type, StructType):
        return f"STRUCT<{', '.join(f'{quoted(field.name)}: {sql_type(field.dataType)}' for field in data_type.fields)}>"
    if isinstance(data_type, ArrayType):
        return f"ARRAY<{sql_type(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"MAP<{sql_type(data_type.keyType)}, {sql_type(data_type.valueType)}>"
    return data_type.simpleString()


# Classification: every parsed row is accepted, a duplicate (skipped) or quarantined with a reason.


def _normalize(parsed: Parsed, layout: _Layout) -> DataFrame:
    """Data columns typed, plus ``_id`` and ``_ts`` (state/join/relations.py), and the reason for what fails: one
    projection of SQL text (built as Column objects it was ~200 calls to the JVM a file)."""
    spec = layout.spec
    present = set(parsed.types)
    typed = _typed(parsed, layout)
    values = {name: value for name, value, _ in typed}
    present_ids = [f"CAST({values[c]} AS STRING)" for c in spec.id if c in present]
    if len(present_ids) < len(spec.id):  # a file without an id column: every row is quarantined for it
        record_id = "CAST(NULL AS STRING)"
    else:
        record_id = present_ids[0] if len(spec.id) == 1 else f"to_json(array({', '.join(present_ids)}))"
    reasons = [
        "CASE WHEN _unparsable THEN 'unparsable line' END",
        *[_missing(name, parsed) for name in spec.record_columns],
        *[misfit for name, _, misfit in typed if misfit is not None and name == spec.event_time],
        *[misfit for name, _, misfit in typed if misfit is not None and name != spec.event_time],
    ]
    if spec.changes is not None and spec.changes.cdf:
        changes = _feed_columns()
    elif spec.changes is not None and present >= set(spec.record_columns):
        changes = _change_columns(spec.changes, values, layout.types)
    else:
        changes = {}
    reasons += [misfit for _, misfit in changes.values()]
    axis = on_axis(values[spec.event_time], layout.kind) if spec.event_time in present else "NULL"
    whence = [
        name for name in parsed.frame.columns if name.startswith("_source_") or name == "_arrival_seq"
    ]  # a line; a file, a table's version, a place
    return parsed.frame.selectExpr(
        *whence,
        "_raw",
        f"coalesce({', '.join(reasons)}) AS _reason",
        *[f"{value} AS {quoted(name)}" for name, value in values.items()],
        f"{record_id} AS {ID}",
        f"CAST({axis} AS BIGINT) AS {TS}",
        *[f"{value} AS {name}" for name, (value, _) in changes.items()],
    )


def _feed_columns() -> dict[str, tuple[str, str]]:
    """A Change Data Feed's ``_op`` and ``_seq`` (its commit version), as ``_change_columns`` gives a file's
    (pipelines/bronze/sources.py reads the feed; an update comes as its new version), each with the reason it fails
    (SQL)."""
    op = (
        f"CASE _change_type WHEN 'insert' THEN {literal(INSERT)} WHEN 'update_postimage' THEN {literal(UPDATE)} WHEN "
        f"'delete' THEN {literal(DELETE)} END"
    )
    return {
        OP: (op, f"CASE WHEN ({op}) IS NULL THEN concat('not a change: ', _change_type) END"),
        SEQ: ("CAST(_commit_version AS BIGINT)", "CAST(NULL AS STRING)"),
    }


def _change_columns(
    changes: ChangeSpec, values: dict[str, str], types: dict[str, DataType]
) -> dict[str, tuple[str, str]]:
    """A change file's ``_op`` (insert, update or delete, from the operation column's configured values) and ``_seq``
    (the sequence column as a number: an integer, or a timestamp's microseconds), each with the reason it fails
    (SQL)."""
    given = f"trim(CAST({values[changes.op]} AS STRING))"  # type: ignore[index] - a change file names its op column
    whens = [
        f"WHEN {given} IN ({', '.join(map(literal, group))}) THEN {literal(name)}"
        for name, group in changes.values.items()
        if group
    ]
    op = f"CASE {' '.join(whens)} END"
    named = "; ".join(f"{name}: {', '.join(group)}" for name, group in changes.values.items())
    sequence = values[changes.sequence_by]  # type: ignore[index]
    sequence_type = types.get(changes.sequence_by)  # type: ignore[arg-type]
    if isinstance(sequence_type, (TimestampType, TimestampNTZType, DateType)):
        seq = f"unix_micros(CAST({sequence} AS TIMESTAMP))"
    else:
        seq = f"try_cast(CAST({sequence} AS STRING) AS BIGINT)"
    return {
        OP: (
            op,
            f"CASE WHEN ({op}) IS NULL THEN concat({literal(f'{changes.op} is not a change operation ({named}): ')}, "
            f"{given}) END",
        ),
        SEQ: (
            seq,
            f"CASE WHEN ({seq}) IS NULL THEN "
            f"concat({literal(f'{changes.sequence_by} is not an integer or a timestamp: ')}, CAST({sequence} AS "
            "STRING)) END",
        ),
    }


def _missing(name: str, parsed: Parsed) -> str:
    """Why a record column's value is missing (SQL): absent from the input, null, or (held as text) blank."""
    if name not in parsed.types:
        return literal(f"missing column {name}")
    value = quoted(name)
    blank = (
        f"trim(CAST({value} AS STRING)) = ''" if parsed.text or isinstance(parsed.types[name], StringType) else "false"
    )
    return f"CASE WHEN {value} IS NULL OR {blank} THEN {literal(f'missing {name}')} END"


DIGEST = "_digest"  # a record's content as one number (``digest``), kept in bronze and state to find copies by
EARLIER_DIGEST = "_content_hash"  # what warehouses landed before ``_digest`` kept: SHA-256 of the content as JSON


def content_columns(frame: DataFrame) -> list[str]:
    """What a record's content is: its data columns in name order, then a change's ``_op`` and ``_seq``."""
    return sorted(name for name in frame.columns if not name.startswith("_")) + [
        name for name in (OP, SEQ) if name in frame.columns
    ]


def digest(frame: DataFrame, columns: list[str]) -> str:
    """``columns`` as xxhash64 (SQL), each value followed by whether it is null: Spark's hash skips a null, so without
    the marker ``(a, null)`` and ``(null, a)`` would hash alike. A value holding a map (which Spark does not hash) is
    hashed as its JSON. Only rows of one id are ever compared, so a 64-bit digest is as good as a cryptographic one."""
    parts = []
    for name in columns:
        value = quoted(name)
        parts += [f"to_json({value})" if _holds_map(frame.schema[name].dataType) else value, f"{value} IS NULL"]
    return (
        f"xxhash64({', '.join(parts)})" if parts else "CAST(42 AS BIGINT)"
    )  # no column: xxhash64's seed, the digest of nothing


def _holds_map(data_type: DataType) -> bool:
    if isinstance(data_type, MapType):
        return True
    if isinstance(data_type, StructType):
        return any(_holds_map(field.dataType) for field in data_type.fields)
    return isinstance(data_type, ArrayType) and _holds_map(data_type.elementType)


def earlier_digest(columns: list[str]) -> str:
    """The digest (SQL) warehouses landed before ``_digest`` kept (``_content_hash``): compared with their rows only."""
    return f"sha2(to_json(struct({', '.join(quoted(name) for name in columns)})), 256)"


def holds_digests(table: DataFrame) -> bool:
    """Whether ``table``'s rows carry a digest, so arrivals are checked against them (``held_digests``)."""
    return bool({DIGEST, EARLIER_DIGEST} & set(table.columns))


def held_digests(*tables: DataFrame | None) -> DataFrame | None:
    """The records ``tables`` hold (a state table, bronze's pending rows) as ``outcomes`` checks arrivals against
    them: ``_id`` and its digests, the tables together (None when none holds any)."""
    holding = [table for table in tables if table is not None and holds_digests(table)]
    parts = [
        table.select(ID, *[name for name in (DIGEST, EARLIER_DIGEST) if name in table.columns]) for table in holding
    ]
    return union_by_name(parts, allow_missing=True) if parts else None


def outcomes(normalized: DataFrame, known: DataFrame | None, changes: bool) -> DataFrame:
    """Each row's outcome. A record's id names it once, so an id seen before with other content is a conflict; in a
    change feed an id names every change of its record, and only a row seen before whole (same content) is skipped.
    ``known``: the records held already (``held_digests``); rows come in the order of ``_arrival_seq`` where they have
    one (a batch's landed files), else of ``_source_line``. Projections of SQL text: built as Column objects they took
    ~380 calls to the JVM, a step of the few-row ingest's fixed cost."""
    content = content_columns(normalized)
    identity = ", ".join([ID, DIGEST] if changes else [ID])
    order = "_arrival_seq" if "_arrival_seq" in normalized.columns else "_source_line"
    files = "_source_file" in normalized.columns
    by_id = f"OVER (PARTITION BY _reason IS NULL, {identity} ORDER BY {order})"
    firsts = {
        "_first_hash": DIGEST,
        "_first_line": "_source_line",
        **({"_first_file": "_source_file"} if files else {}),
    }
    ranked = normalized.selectExpr("*", f"{digest(normalized, content)} AS {DIGEST}").selectExpr(
        "*",
        f"CASE WHEN _reason IS NULL THEN row_number() {by_id} END AS _nth",
        *[f"CASE WHEN _reason IS NULL THEN first({value}) {by_id} END AS {name}" for name, value in firsts.items()],
    )
    if known is None:
        held = ranked.selectExpr("*", "false AS _held", "CAST(NULL AS BOOLEAN) AS _same")
    else:
        # What is held outgrows any input: find the input's ids in it with the ids broadcast (a scan, no shuffle of
        # what is held), then join back the few it holds. A row of an earlier layout has only its SHA-256: the
        # arrival's is computed for it alone.
        ids = normalized.selectExpr(f"{ID} AS _arriving").where("_arriving IS NOT NULL").distinct()
        existing = known.selectExpr(
            f"{ID} AS _held_id",
            *[
                f"{name if name in known.columns else f'CAST(NULL AS {kind})'} AS _held{name}"
                for name, kind in ((DIGEST, "BIGINT"), (EARLIER_DIGEST, "STRING"))
            ],
        ).join(F.broadcast(ids), F.expr("_held_id = _arriving"), "left_semi")
        same = f"CASE WHEN _held{DIGEST} IS NOT NULL THEN _held{DIGEST} = {DIGEST}"
        if EARLIER_DIGEST in known.columns:
            same += f" WHEN _held{EARLIER_DIGEST} IS NOT NULL THEN _held{EARLIER_DIGEST} = {earlier_digest(content)}"
        same += " END"
        matches = f"_reason IS NULL AND {ID} = _held_id" + (f" AND {same}" if changes else "")
        held = ranked.join(F.broadcast(existing), F.expr(matches), "left").selectExpr(
            "*", "_held_id IS NOT NULL AS _held", f"{same} AS _same"
        )
    elsewhere = "CASE WHEN _first_file != _source_file THEN concat(' of ', _first_file) ELSE '' END" if files else "''"
    reason = (
        f"""coalesce(
        _reason,
        CASE WHEN _nth > 1 AND {DIGEST} != _first_hash
            THEN concat('id conflict: same id with other content at line ', """
        f"""CAST(_first_line AS STRING), {elsewhere}) END,
        CASE WHEN _held AND NOT _same THEN 'id conflict: id already in bronze with other content' END)"""
    )
    kept = [quoted(name) for name in [*normalized.columns, DIGEST] if name != "_reason"]
    return held.selectExpr("*", f"{reason} AS _why").selectExpr(
        *kept,
        "_why AS _reason",
        "CASE WHEN _why IS NOT NULL THEN 'quarantined' WHEN _nth > 1 OR (_held AND _same) THEN 'duplicate' ELSE "
        "'accepted' END AS _outcome",
    )
