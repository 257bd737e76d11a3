"""The scenarios tests/test_where_spark_runs.py checks, run in a process of their own where Spark runs: as a client of a
Spark Connect server that refuses what Databricks serverless refuses (``--remote URL``: tests/serverless.py) or as the
driver of a standalone cluster (``--master URL``), through lakejoin's Python API as a user's job would. Prints what the
test compares, as one line of JSON.

    python -m tests.where_spark_runs WORKDIR (--remote sc://127.0.0.1:15002 [--every-kind] | --master spark://127.0.0.1:7077)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from pipelines import Pipeline
from pipelines.commands.acceptance import accept
from pipelines.spark import get_spark
from state.faults import CRASH_AT, InjectedCrash
from state.layout import Warehouse
from tests.racing import raced_change_batches
from tests.test_join_pipeline import ORDERS

WORKED_ORDER = "delayed store r4"
WORKED_BATCH_ROWS = 2

# A record of every type a user's table holds, for both relations (payments' columns differ only in name).
TYPES = pa.schema(
    [
        ("id", pa.string()),
        ("customer", pa.string()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("amount", pa.decimal128(10, 2)),
        ("units", pa.int32()),
        ("total", pa.int64()),
        ("ratio", pa.float64()),
        ("paid", pa.bool_()),
        ("day", pa.date32()),
        ("tags", pa.list_(pa.string())),
        ("attributes", pa.map_(pa.string(), pa.int64())),
        ("address", pa.struct([("city", pa.string()), ("zip", pa.string())])),
        ("note", pa.string()),
    ]
)
TYPED_CONFIG = {
    "relations": {"r": {"id": "id", "event_time": "at"}, "s": {"id": "id", "event_time": "at"}},
    "predicate": "r.customer = s.customer AND s.at BETWEEN r.at - INTERVAL 30 MINUTES AND r.at + INTERVAL 1 HOUR",
}

# Bounded state, so that each batch's state tables take a MERGE (their cutoffs move), not an append; nothing is late.
SERVERLESS_CONFIG = TYPED_CONFIG | {"window": "2 hours", "allowed_lateness": "2 hours"}


def typed_rows(relation: str, count: int) -> list[dict]:
    return [
        {
            "id": f"{relation}{n}", "customer": f"c{n % 3}", "at": datetime(2026, 1, 1, 10, (7 * n) % 60, tzinfo=timezone.utc),
            "amount": Decimal(f"{n}.25"), "units": n, "total": 10**12 + n, "ratio": n / 7, "paid": n % 2 == 0,
            "day": date(2026, 1, 1 + n % 28), "tags": [relation, f"t{n}"], "attributes": [("n", n)],
            "address": {"city": f"city {n % 4}", "zip": f"{10000 + n}"}, "note": None if n % 5 == 0 else f"note {n}",
        }
        for n in range(count)
    ]  # fmt: skip


def worked_example(root: str, spark) -> list[list]:  # noqa: ANN001 - a cluster's session
    """docs/design.md section 2's worked example in batches of ``WORKED_BATCH_ROWS``: the gold rows (r, s, owner, batch).
    Records arrive in their order (one file each; a relation's consecutive ones in one ingest)."""
    records, _ = ORDERS[WORKED_ORDER]
    with Pipeline(os.path.join(root, "worked"), spark=spark) as pipeline:
        for relation, run in itertools.groupby(enumerate(records), key=lambda numbered: numbered[1].relation):
            files = []
            for number, record in run:
                files.append(os.path.join(root, f"worked-{number}.jsonl"))
                with open(files[-1], "w", encoding="utf-8") as handle:
                    handle.write(
                        json.dumps({"id": record.id, "ts": record.ts, "key": record.key, "payload": record.payload})
                        + "\n"
                    )
            pipeline.ingest(relation, files)
        pipeline.run(max_batch_rows=WORKED_BATCH_ROWS)
        return [list(row) for row in pipeline.table("gold").select("r_id", "s_id", "owner", "batch_id").collect()]


def serverless_join(root: str, spark) -> dict:  # noqa: ANN001
    """Records of every type joined in three batches on a session that refuses settings, caching and clones, state
    bounded so that each batch MERGEs: the first creates the state tables, the second lands a DataFrame and a micro-batch of ``foreach_batch`` and dies between a
    state table's marker and its MERGE, the third dies after the MERGEs; each is finished by a new run. Then
    ``validate`` and ``status`` on the warehouse."""
    counts = {"r": 12, "s": 15}
    files = {relation: os.path.join(root, f"serverless-{relation}.parquet") for relation in counts}
    parts: dict[str, list[str]] = {relation: [] for relation in counts}
    for relation, count in counts.items():
        rows = pa.Table.from_pylist(
            sorted(typed_rows(relation, count), key=lambda row: row["at"]), TYPES
        )  # each part raises the watermark
        pq.write_table(rows, files[relation])
        for part, first in enumerate(range(0, count, 5)):
            parts[relation].append(os.path.join(root, f"serverless-{relation}-{part}.parquet"))
            pq.write_table(rows.slice(first, min(5, count - first)), parts[relation][-1])
    warehouse = os.path.join(root, "serverless")  # a folder: the change feed below is on a catalog's managed tables
    crashes = []
    with Pipeline(warehouse, SERVERLESS_CONFIG, spark=spark) as pipeline:
        for relation in counts:
            pipeline.ingest(relation, parts[relation][0])
        pipeline.run()
        cases = os.path.join(root, "cases.jsonl")
        with open(cases, "w", encoding="utf-8") as handle:
            handle.write(
                '{"id": "x1", "customer": "c1", "at": "2026-01-01T10:00:00Z", "Note": "a"}\n{"id": "x2", "customer": "c1", "at": "2026-01-01T10:00:00Z", "note": "b"}\n'
            )
        [cased] = pipeline.ingest("r", cases)
        pipeline.ingest("r", spark.read.parquet(parts["r"][1]))
        pipeline.foreach_batch("s")(spark.read.parquet(parts["s"][1]), 7)
        for point, rest in ((f"marked:{Warehouse(warehouse).path_of('silver/r_state')}", 1), ("after:r_state", 2)):
            if rest == 2:
                for relation in counts:
                    for path in parts[relation][2:]:
                        pipeline.ingest(relation, path)
            os.environ[CRASH_AT] = point
            try:
                pipeline.run()
            except InjectedCrash:
                crashes.append(point)
            finally:
                del os.environ[CRASH_AT]
            with Pipeline(warehouse, spark=spark) as resumed:
                resumed.run()
        history = spark.sql(f"DESCRIBE HISTORY delta.`{Warehouse(warehouse).path_of('silver/r_state')}`")
        operations = [row.operation for row in history.orderBy("version").collect()]
        audit = pipeline.validate()
        status = pipeline.status()
    return {
        "files": files, "gold": Warehouse(warehouse).gold, "crashed": crashes, "valid": audit.success,
        "committed": status["last_committed_batch"], "operations": operations, "refusal": cased.refused,
    }  # fmt: skip


MANAGED = "managed"  # under the workdir: the catalog schemas' storage, which the restricted client may not read by path


def managed_schema(spark, root: str, name: str) -> str:  # noqa: ANN001
    """A catalog schema whose tables are managed, stored under the workdir's ``managed`` folder: the warehouse."""
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS spark_catalog.{name} LOCATION '{os.path.join(root, MANAGED, name)}'")
    return f"spark_catalog.{name}"


def write_records(root: str, label: str, records: list) -> dict[str, str]:
    """One JSON Lines file per relation of ``records`` (tests/reference.py ``Record``s), outside the managed storage."""
    files = {}
    for record in records:
        files.setdefault(record.relation, os.path.join(root, "landing", f"{label}-{record.relation}.jsonl"))
    os.makedirs(os.path.join(root, "landing"), exist_ok=True)
    for relation, path in files.items():
        with open(path, "w", encoding="utf-8") as handle:
            handle.writelines(
                json.dumps({"id": rec.id, "ts": rec.ts, "key": rec.key, "payload": rec.payload}) + "\n"
                for rec in records
                if rec.relation == relation
            )
    return files


def serverless_kinds(root: str, spark) -> dict:  # noqa: ANN001
    """Every kind of join on a session that refuses what serverless refuses, each in a catalog warehouse of its own,
    its records landed and joined in a batch, then records that push every watermark past them in another: each kind's
    gold and its reference's (tests/reference.py, tests/test_final_reference.py, tests/test_nway_reference.py)."""
    from collections import Counter

    from state.clock import set_now
    from tests.reference import Record, batch_join, within
    from tests.test_final_reference import FAR, merge_asof, sql_join
    from tests.test_nway_reference import expected_tuples

    two = [Record("r", "r1", 1, "a"), Record("s", "s1", 2, "a"), Record("r", "r2", 4, "b"), Record("s", "s2", 5, "a"),
           Record("r", "r3", 7, "a"), Record("s", "s3", 8, "b"), Record("r", "r4", 9, "c"), Record("s", "s4", 9, "a")]  # fmt: skip
    far = [Record("r", "r~", FAR, "~r"), Record("s", "s~", FAR, "~s")]
    three = [
        Record(name, f"{name}{ts}", ts, "a" if ts % 3 else "b", rank=rank)
        for rank, name in enumerate("rst")
        for ts in (1, 2, 4, 5)
    ]
    far3 = [Record(name, f"{name}~", FAR, f"~{name}", rank=rank) for rank, name in enumerate("rst")]

    def pairs(rows):
        return sorted(Counter((row.get("_r_id"), row.get("_s_id"), row["owner"]) for row in rows).items(), key=repr)

    def tuples(rows, names):
        return sorted(
            Counter((tuple(row[f"_{name}_id"] for name in names), row["owner"].lower()) for row in rows).items(),
            key=repr,
        )

    def expected_pairs(found):
        return sorted(Counter((pair.r_id, pair.s_id, pair.owner) for pair in found).items(), key=repr)

    def expected_tuples_of(found):
        return sorted(
            Counter((tuple(rec_id for _, rec_id in match.ids), match.owner) for match in found.elements()).items(),
            key=repr,
        )

    cases = {
        "inner": ({"window": 2, "allowed_lateness": 1}, two, far, lambda: expected_pairs(batch_join(two, within(2))), pairs),
        "left": ({"join": "left", "window": 2, "allowed_lateness": 1}, two, far, lambda: expected_pairs(sql_join(two, "left", within(2))), pairs),
        "full": ({"join": "full", "window": 2, "allowed_lateness": 1}, two, far, lambda: expected_pairs(sql_join(two, "full", within(2))), pairs),
        "asof": ({"join": "asof", "allowed_lateness": 1}, two, far, lambda: expected_pairs(merge_asof(two, None, False)),
                 lambda rows: pairs([row for row in rows if row.get("_r_id") != "r~"])),
        "three-way": ({"relations": dict.fromkeys("rst"), "window": 2, "allowed_lateness": 1}, three, far3,
                      lambda: expected_tuples_of(expected_tuples(three, "rst", window=2)), lambda rows: tuples(rows, "rst")),
        "synchronized": ({"relations": dict.fromkeys("rst"), "join": "synchronized", "predicate": "r.key = s.key AND s.key = t.key"}, three, [],
                         lambda: expected_tuples_of(expected_tuples(three, "rst", window=0)), lambda rows: tuples(rows, "rst")),
    }  # fmt: skip
    found = {}
    for kind, (config, records, flush, expected, seen) in cases.items():
        with Pipeline(
            managed_schema(spark, root, f"lj_kind_{kind.replace('-', '_')}"), config, spark=spark
        ) as pipeline:
            for label, chunk in (
                (kind, records),
                (f"{kind}-far", flush),
            ):  # a batch each: the first keeps state, the second ends it
                for relation, path in write_records(root, label, chunk).items():
                    pipeline.ingest(relation, path)
                pipeline.run()
            found[kind] = {
                "gold": seen([row.asDict() for row in pipeline.table("gold").collect()]),
                "expected": expected(),
            }
    # an idle relation released: payments stop, and once idle the orders' rows waiting on them come out
    quiet = {
        "join": "left",
        "window": 2,
        "allowed_lateness": 0,
        "relations": {"r": {}, "s": {"idle_after": "15 minutes"}},
    }
    start = datetime(2026, 11, 25, 9, 0, tzinfo=timezone.utc)
    try:
        with Pipeline(managed_schema(spark, root, "lj_kind_idle"), quiet, spark=spark) as pipeline:
            for minutes, label, chunk in ((0, "idle-1", [Record("s", "s1", 1, "k"), Record("r", "r2", 2, "k"), Record("r", "r4", 4, "k")]),
                                          (1, "idle-2", [Record("r", "r8", 8, "k")]), (16, "idle-3", [])):  # fmt: skip
                set_now(start + timedelta(minutes=minutes))
                for relation, path in write_records(root, label, chunk).items():
                    pipeline.ingest(relation, path)
                pipeline.run()
            found["idle"] = {
                "gold": pairs([row.asDict() for row in pipeline.table("gold").collect()]),
                "expected": [(("r2", "s1", "S"), 1), (("r4", None, "R"), 1)],
            }
    finally:
        set_now(None)
    found["table"] = serverless_table(root, spark)
    return found


def serverless_table(root: str, spark) -> dict:  # noqa: ANN001
    """A relation read in place from a managed table of the catalog, by name (its files are the catalog's to read), as
    it grows: gold and the batch join of the table's rows with the files'."""
    from collections import Counter

    from tests.reference import Record, batch_join

    source = f"{managed_schema(spark, root, 'lj_sources')}.orders"
    orders = [Record("r", f"o{n}", n, "a" if n % 2 else "b") for n in range(6)]
    payments = [Record("s", f"p{n}", n, "a" if n % 3 else "b") for n in range(4)]
    schema = "id string, ts bigint, key string, payload string"
    spark.createDataFrame([(rec.id, rec.ts, rec.key, rec.payload) for rec in orders[:3]], schema).write.format(
        "delta"
    ).saveAsTable(source)
    with Pipeline(
        managed_schema(spark, root, "lj_kind_table"), {"relations": {"r": {"table": source}, "s": {}}}, spark=spark
    ) as pipeline:
        pipeline.ingest("s", write_records(root, "table-s", payments)["s"])
        pipeline.run()
        spark.createDataFrame([(rec.id, rec.ts, rec.key, rec.payload) for rec in orders[3:]], schema).write.format(
            "delta"
        ).mode("append").saveAsTable(source)
        pipeline.run()
        gold = Counter((row.r_id, row.s_id) for row in pipeline.table("gold").collect())
    expected = Counter((pair.r_id, pair.s_id) for pair in batch_join(orders + payments))
    return {"gold": sorted(gold.items()), "expected": sorted(expected.items())}


def serverless_changes(root: str, spark) -> dict:  # noqa: ANN001
    """A join of two change feeds on a session that refuses what serverless refuses, through tests/test_changes.py's
    schedule with updates, a batch that changes no gold row and one that changes no state row: gold after each run,
    and the reference's."""
    from tests.test_changes import CONFIG, UNCHANGED, reference_gold

    schedule = UNCHANGED
    arrived: list[tuple[str, dict]] = []
    found, expected = [], []
    with Pipeline(managed_schema(spark, root, "lj_changes"), CONFIG, spark=spark) as pipeline:
        for number, step in enumerate(schedule):
            if step[0] == "ingest":
                path = os.path.join(root, f"change-{number}.jsonl")
                with open(path, "w", encoding="utf-8") as handle:
                    handle.writelines(json.dumps(row) + "\n" for row in step[2])
                pipeline.ingest(step[1], path)
                arrived += [(step[1], row) for row in step[2]]
                continue
            pipeline.run(max_batch_rows=step[1])
            gold = [row.asDict() for row in pipeline.table("gold").collect()]  # its columns come with its first pair
            found.append(sorted((row["_r_id"], row["_s_id"], row["r_amount"], row["s_amount"]) for row in gold))
            expected.append(sorted(reference_gold(arrived).elements()))
    return {"gold": found, "expected": expected}


def client() -> str:
    """The Spark Connect client this process runs: Databricks Connect (serverless ships it) or pyspark's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"databricks-connect {version('databricks-connect')}"
    except PackageNotFoundError:
        return f"pyspark {version('pyspark')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workdir")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--remote")
    where.add_argument("--master")
    parser.add_argument(
        "--every-kind", action="store_true", help="with --remote: every kind of join and the acceptance checks too"
    )
    args = parser.parse_args()
    spark = get_spark(master=args.master, remote=args.remote)
    from state.engines import make_engine

    if args.remote:
        from tests.serverless import refuse_what_serverless_refuses

        calls = refuse_what_serverless_refuses(managed=os.path.join(args.workdir, MANAGED))
        found = {"session": type(spark).__module__, "engine": make_engine(spark).name, "client": client()}
        found["typed"] = serverless_join(args.workdir, spark)
        found["changes"] = serverless_changes(args.workdir, spark)
        os.makedirs(raced := os.path.join(args.workdir, "raced"))
        found["raced"] = raced_change_batches(spark, managed_schema(spark, args.workdir, "lj_raced"), Path(raced))
        if args.every_kind:
            found["kinds"] = serverless_kinds(args.workdir, spark)
            os.environ.setdefault("DATABRICKS_RUNTIME_VERSION", "client.4.0")  # as serverless sets it, for acceptance
            found["acceptance"] = [
                outcome.line()
                for outcome in accept(spark, managed_schema(spark, args.workdir, "lj_acceptance"))
                if not outcome.passed
            ]
        state = Warehouse(os.path.join(args.workdir, "serverless")).path_of("silver/r_state")
        print(
            json.dumps(
                found
                | {"refused": calls.refused, "r_state_merges": sum(f"`{state}`" in merge for merge in calls.merges)},
                default=str,
            )
        )
        return
    # a cluster: batch after batch on executors; Python run by the executors' own workers, one folder each
    found = {
        "session": type(spark).__module__,
        "engine": make_engine(spark).name,
        "worked": worked_example(args.workdir, spark),
    }
    folder = F.udf(lambda _: os.getcwd())
    found["executors"] = spark.range(0, 16, 1, 16).select(folder("id")).distinct().count()
    print(json.dumps(found))


if __name__ == "__main__":
    main()
