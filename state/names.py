"""Column names are data, not SQL: whatever a JSON key, a CSV header or a Parquet field calls a column.

lakejoin refers to every column through ``column``/``quoted``, so a name such as ``c.d`` or ``a:b`` is kept as
it is (the predicate and ``select`` name it with backticks: ``r.`c.d```). Delta cannot store a few characters in
a column name (whitespace, control characters and `` ,;{}()=``), so such a name is stored under one documented rule
(``storable``).
"""

from __future__ import annotations

import re

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

# What Delta refuses in a column name (DELTA_INVALID_CHARACTERS_IN_COLUMN_NAMES), with every kind of whitespace and
# control character.
UNSTORABLE = re.compile(r"[\s\x00-\x1f\x7f,;{}()=]")


def quoted(name: str) -> str:
    """``name`` as one SQL identifier, whatever characters it holds."""
    return "`" + name.replace("`", "``") + "`"


def literal(value: object) -> str:
    """``value`` as a Spark SQL literal (a string's backslashes and quotes escaped)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def column(name: str) -> Column:
    """The column called ``name`` (``F.col`` would read a dot as a struct field)."""
    return F.col(quoted(name))


def storable(name: str, position: int) -> str:
    """``name`` as Delta can store it: surrounding whitespace dropped, each character Delta refuses replaced by
    ``_``, and an empty name called ``unnamed_<position>`` (its 1-based place among the file's columns)."""
    stripped = name.strip()
    return UNSTORABLE.sub("_", stripped) if stripped else f"unnamed_{position}"


def nested_names_storable(data_type: DataType) -> bool:
    """Whether every field name inside ``data_type`` is one Delta can store, once per name whatever its case."""
    if isinstance(data_type, StructType):
        names = [field.name for field in data_type.fields]
        return (
            all(name and not UNSTORABLE.search(name) for name in names)
            and len({name.lower() for name in names}) == len(names)
            and all(nested_names_storable(field.dataType) for field in data_type.fields)
        )
    if isinstance(data_type, ArrayType):
        return nested_names_storable(data_type.elementType)
    if isinstance(data_type, MapType):
        return nested_names_storable(data_type.keyType) and nested_names_storable(data_type.valueType)
    return True


def stored_names(names: list[str]) -> dict[str, str]:
    """Each of a file's column names mapped to the name bronze stores it under (``storable``).

    Raises ``ValueError`` naming the columns when two of them would share a stored name: Delta keeps one column
    per name whatever its case, so ``Key`` and ``key`` (or ``a b`` and ``a_b``) cannot both land."""
    stored: dict[str, str] = {}
    taken: dict[str, str] = {}
    for position, name in enumerate(names, start=1):
        target = storable(name, position)
        if target.lower() in taken:
            first = taken[target.lower()]
            if name == first:
                raise ValueError(f"column {name!r} appears twice")
            if target == stored[first]:
                raise ValueError(f"columns {first!r} and {name!r} would both be stored as {target!r}")
            raise ValueError(f"columns {first!r} and {name!r} differ only in case, which Delta does not tell apart")
        taken[target.lower()] = name
        stored[name] = target
    return stored
