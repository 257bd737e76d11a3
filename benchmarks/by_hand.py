"""The work of a lakejoin batch written by hand in plain Spark: the yardstick a batch is measured against.

What a batch must do, and nothing else: append its arrivals to bronze, join them against the state the earlier
batches left and against each other (``ΔR ⋈ (S ∪ ΔS)`` and ``R ⋈ ΔS`` on the predicate), append the pairs to gold with
what lakejoin's gold holds (both records' columns, prefixed by relation, and the owner: the relation of the older
record), and append the arrivals to state. No rules, no ids checked, no lateness, no bookkeeping: whatever lakejoin
spends above this is what it adds. Each write's seconds are kept under the name lakejoin's batch gives the step that
writes the same table (``bronze_r``, ``gold``, ``r_state``: state/phases.py), so each step is set beside its floor.
Delta tables are written as each engine writes them: Delta on Spark's writer, or Arrow committed by delta-rs.
"""

from __future__ import annotations

import os
import time
from functools import reduce

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

RELATIONS = ("r", "s")


class ByHand:
    """A warehouse written by hand under ``root``: ``bronze/<r>``, ``state/<r>``, ``gold``, on ``engine``."""

    def __init__(self, spark: SparkSession, engine: str, root: str, predicate: str = "r.key = s.key") -> None:
        self.spark, self.engine, self.root, self.predicate = spark, engine, root, predicate
        self.phases: dict[str, float] = {}  # seconds per step, summed over the batches written

    def land(self, arrivals: dict[str, DataFrame]) -> None:
        """Bronze appended: each relation's arrivals as they are."""
        for name, frame in arrivals.items():
            self._append(f"bronze/{name}", frame, f"bronze_{name}")

    def bronze_slice(self, name: str, start: int, end: int) -> DataFrame:
        """Rows ``start`` to ``end`` (exclusive) of a relation's bronze in its ``ts`` order: a batch read back from bronze."""
        return self._read(f"bronze/{name}").where(F.col("seq").between(start, end - 1)).drop("seq")

    def join(self, arrivals: dict[str, DataFrame], batch_id: int) -> None:
        """The batch's new pairs appended to gold, then its arrivals to state."""
        r, s = RELATIONS
        new = {name: arrivals[name].alias(name) for name in RELATIONS}
        state = {name: self._read(f"state/{name}") for name in RELATIONS}
        terms = [new[r].join(new[s], F.expr(self.predicate))]
        if state[s] is not None:
            terms.append(new[r].join(state[s].alias(s), F.expr(self.predicate)))
        if state[r] is not None:
            terms.append(state[r].alias(r).join(new[s], F.expr(self.predicate)))
        columns = gold_columns({name: arrivals[name].columns for name in RELATIONS})
        rows = [term.select(*columns, F.lit(batch_id).alias("batch_id")) for term in terms]
        self._append("gold", reduce(DataFrame.union, rows), "gold")
        for name in RELATIONS:
            self._append(f"state/{name}", arrivals[name], f"{name}_state")

    def gold(self) -> DataFrame:
        return self._read("gold")  # type: ignore[return-value] - written by the first batch

    def _append(self, table: str, frame: DataFrame, step: str) -> None:
        started = time.perf_counter()
        append_delta(self.engine, os.path.join(self.root, table), frame)
        self.phases[step] = self.phases.get(step, 0.0) + time.perf_counter() - started

    def _read(self, table: str) -> DataFrame | None:
        return read_delta(self.spark, self.engine, os.path.join(self.root, table))


def gold_columns(columns: dict[str, list[str]]) -> list[Column]:
    """What lakejoin's gold holds of a pair of the joined relations (aliased by name, ``columns`` per relation): both
    records' columns, prefixed by relation (``r_id``), and the owner, the relation of the older record (r wins ties)."""
    r, s = RELATIONS
    prefixed = [F.col(f"{name}.{column}").alias(f"{name}_{column}") for name in RELATIONS for column in columns[name]]
    owner = F.when(F.col(f"{r}.ts") <= F.col(f"{s}.ts"), F.lit(r.upper())).otherwise(F.lit(s.upper())).alias("owner")
    return [*prefixed, owner]


def append_delta(engine: str, path: str, frame: DataFrame) -> None:
    """``frame`` appended to the Delta table at ``path`` as ``engine`` writes: Delta on Spark's writer, or Arrow
    committed by delta-rs."""
    if engine == "spark":
        frame.write.format("delta").mode("append").save(path)
    else:
        write_deltalake(path, frame.toArrow(), mode="append")


def read_delta(spark: SparkSession, engine: str, path: str) -> DataFrame | None:
    """The Delta table at ``path`` as ``engine`` reads it (delta-rs: its current files, read by Spark), or None."""
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return None
    if engine == "spark":
        return spark.read.format("delta").load(path)
    opened = DeltaTable(path)
    return spark.read.schema(from_arrow_schema(pa.schema(opened.schema().to_arrow()))).parquet(*opened.file_uris())
