"""Another writer's OPTIMIZE committed in the middle of lakejoin's writes on Delta on Spark, as predictive optimization
may commit one: a write's source is held at its first row (a Python UDF waiting on a file), after the write has read
its table's snapshot, while another thread's OPTIMIZE commits; then the write goes on and commits, or loses the race.

Used by tests/test_recovery.py in the test process, and by tests/where_spark_runs.py in a Spark Connect client's
process (the UDF then runs in the server's Python workers: the flags are files both see).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

MERGE, APPEND = "merge", "append"  # the write kinds a race is forced at: a MERGE, or an append of rows


def optimize_committed(spark: SparkSession, table: str) -> None:
    """An OPTIMIZE of ``table`` that commits: a compaction when it has several files, otherwise a Z-order by a column
    with statistics (which rewrites even one file). Fails when nothing was committed: then there was no race."""
    from state.engines.delta_log import sql_name

    name = sql_name(table)
    detail = spark.sql(f"DESCRIBE DETAIL {name}").first()
    before = spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first()["version"]
    if detail["numFiles"] > 1:
        spark.sql(f"OPTIMIZE {name}").collect()
    else:
        indexed = (detail["properties"] or {}).get("delta.dataSkippingStatsColumns")
        column = indexed.split(",")[0] if indexed else spark.sql(f"SELECT * FROM {name} LIMIT 0").columns[0]
        spark.sql(f"OPTIMIZE {name} ZORDER BY (`{column}`)").collect()
    after = spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first()["version"]
    assert after == before + 1, f"OPTIMIZE of {table} committed nothing: no race"


def exists(spark: SparkSession, table: str) -> bool:
    """Whether ``table`` (a catalog name or a folder) holds a Delta table yet: only one that does can be optimized."""
    from state.layout import is_table_name

    if is_table_name(table):
        return spark.catalog.tableExists(table)
    return os.path.isdir(os.path.join(table, "_delta_log"))


def race_writes(patch: Callable[[object, str, object], None], writes: Iterable[tuple[str, str]], flags: Path) -> list:
    """Make the first write of each ``(kind, table)`` in ``writes`` meet an OPTIMIZE of its table committed between its
    read of the table and its commit; ``patch`` sets an attribute (``monkeypatch.setattr``, or ``setattr`` in a process
    of its own). Returns the list the tables are noted in as each OPTIMIZE commits."""
    from state.engines import spark_delta
    from state.engines.spark_delta import SparkDeltaEngine

    pending, won, numbers = set(writes), [], itertools.count()
    alone = threading.Lock()  # a held task takes one of local[2]'s slots: the OPTIMIZE needs the other
    merge, append = SparkDeltaEngine._merge, spark_delta._append_to

    @contextmanager
    def held(spark: SparkSession, write: tuple[str, str], frame: DataFrame) -> Iterator[DataFrame]:
        """``frame`` waiting at its first row until another thread's OPTIMIZE of the table has committed; a write of
        no rows never waits, and leaves its table to the next write of that kind."""
        pending.remove(write)
        number, table, finished = next(numbers), write[1], threading.Event()
        waiting, go = str(flags / f"{number}-held"), str(flags / f"{number}-go")

        def hold(_: int) -> bool:
            try:
                os.close(os.open(waiting, os.O_CREAT | os.O_EXCL))  # the first row only: one task waits
            except FileExistsError:
                return True
            while not os.path.exists(go):
                time.sleep(0.05)
            return True

        def optimize() -> None:
            while not os.path.exists(waiting):
                if finished.is_set():  # no row was read: nothing waits
                    pending.add(write)
                    return
                time.sleep(0.05)
            try:
                optimize_committed(spark, table)
                won.append(table)
            finally:
                open(go, "w").close()

        with alone:
            racer = threading.Thread(target=optimize)
            racer.start()
            try:
                yield frame.where(F.udf(hold, BooleanType()).asNondeterministic()(F.lit(1)))
            finally:
                finished.set()
                racer.join()

    def raced_merge(self, path, head, df, *rest):  # noqa: ANN001, ANN202 - SparkDeltaEngine._merge's own
        if (MERGE, path) not in pending:
            return merge(self, path, head, df, *rest)
        from state.engines import as_frame

        with held(self.spark, (MERGE, path), as_frame(self.spark, df)) as frame:
            return merge(self, path, head, frame, *rest)

    def raced_append(table: str, frame: DataFrame, options: dict[str, str]) -> None:
        if (APPEND, table) not in pending or not exists(frame.sparkSession, table):
            return append(table, frame, options)
        with held(frame.sparkSession, (APPEND, table), frame) as waiting:
            return append(table, waiting, options)

    patch(SparkDeltaEngine, "_merge", raced_merge)
    patch(spark_delta, "_append_to", raced_append)
    return won


def losses(patch: Callable[[object, str, object], None], engine: type) -> list[str]:
    """The tables whose writes by ``engine`` (a class) raised a lost commit race, noted as each is raised: the write
    kinds a race was forced at, told apart (a batch tried again counts once however many of its writes lost)."""
    from state.errors import lost_a_race

    lost: list[str] = []

    def noting(write: Callable) -> Callable:
        def written(self, path: str, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - the write's own
            try:
                return write(self, path, *args, **kwargs)
            except Exception as error:
                if lost_a_race(error):
                    lost.append(path)
                raise

        return written

    for name in ("append", "merge", "apply_changes"):
        patch(engine, name, noting(getattr(engine, name)))
    return lost


def raced_change_batches(spark: SparkSession, warehouse: str, folder: Path) -> dict:
    """Change feeds on ``warehouse`` (a catalog schema): a first batch makes every table, then a batch that takes a
    result out of gold meets an OPTIMIZE at each of its writes (gold's MERGE, the state tables' MERGEs, gold/changes'
    and the batch log's appends). What the test compares: the tables raced and the writes that lost (as sorted
    lists), the batch's tries again, and gold beside the join of the current records."""
    import json

    import pytest

    from pipelines.api import Pipeline
    from state.config import Config
    from state.engines.spark_delta import SparkDeltaEngine
    from state.layout import Warehouse
    from tests.test_changes import CONFIG, RETRACTING, reference_gold

    def land(pipeline: Pipeline, numbers: range) -> None:
        for number in numbers:
            relation, row = RETRACTING[number]
            (folder / f"{number}.jsonl").write_text(json.dumps(row) + "\n")
            pipeline.ingest(relation, str(folder / f"{number}.jsonl"))

    joined = Config.of(**CONFIG).joined
    tables = Warehouse(warehouse, joined)
    writes = [(MERGE, tables.gold), *((MERGE, tables.state(rel)) for rel in joined)]
    writes += [(APPEND, tables.gold_changes), (APPEND, tables.batches)]
    (folder / "flags").mkdir()
    with Pipeline(warehouse, CONFIG, spark=spark) as pipeline, pytest.MonkeyPatch.context() as patch:
        land(pipeline, range(2))
        pipeline.run()
        land(pipeline, range(2, 4))  # r's o1 moves to another key: the batch takes (o1, p1) out of gold
        patch.setattr("pipelines.silver.RACE_BACKOFF", 0.0)
        won = race_writes(patch.setattr, writes, folder / "flags")
        lost = losses(patch.setattr, SparkDeltaEngine)
        races = pipeline.run().races
    gold = [
        (row["_r_id"], row["_s_id"], row["r_amount"], row["s_amount"]) for row in spark.table(tables.gold).collect()
    ]
    return {
        "won": sorted(won),
        "lost": sorted(set(lost)),
        "writes": sorted(table for _, table in writes),
        "merges": sorted(table for kind, table in writes if kind == MERGE),
        "races": races,
        "gold": sorted(gold),
        "expected": sorted(reference_gold(RETRACTING[:4]).elements()),
    }
