"""The batch form of state/join/joiner.py for three and four relations, through Spark, against the pure-Python reference:
given every store's buffers and a batch's arrivals, ``batch_tuples`` produces the tuples the reference's batch
step produces, with the same owners (docs/design.md section 2.8)."""

from __future__ import annotations

import random
from collections import Counter
from itertools import combinations

import pyarrow as pa
import pytest

from state.join.joiner import Projection, Side, batch_tuples
from state.join.relations import Relation
from tests.reference import BatchJoiner, Record, banded

COLUMNS = pa.schema([("_id", pa.string()), ("_ts", pa.int64()), ("key", pa.string())])


def frame(spark, records: list[Record]):  # noqa: ANN001, ANN201 - a SparkSession, a DataFrame
    rows = [{"_id": rec.id, "_ts": rec.ts, "key": rec.key} for rec in records]
    return spark.createDataFrame(pa.Table.from_pylist(rows, COLUMNS))


def predicate(names: str, window: int) -> str:
    pairs = list(combinations(names, 2))
    keys = " AND ".join(f"{a}.key = {b}.key" for a, b in pairs)
    band = " AND ".join(f"abs({a}._ts - {b}._ts) <= {window}" for a, b in pairs)
    return f"{keys} AND {band}"


def dense_stream(seed: int, names: str) -> list[list[Record]]:
    """Three batches of a shuffled stream: 4 records per relation, mostly one key, close times (so every term of
    the batch form has tuples to find, and a few records are late)."""
    chosen = random.Random(seed)
    records = [
        Record(name, f"{name}{i}", chosen.randint(0, 6), chosen.choice("xxy"), rank=rank)
        for rank, name in enumerate(names)
        for i in range(4)
    ]
    chosen.shuffle(records)
    cuts = sorted(chosen.sample(range(1, len(records)), 2))
    return [records[: cuts[0]], records[cuts[0] : cuts[1]], records[cuts[1] :]]


@pytest.mark.parametrize(
    "seed, names, broadcast",
    [(seed, "abc", seed % 2 == 0) for seed in range(4)] + [(seed, "abcd", seed == 5) for seed in range(5, 7)],
)
def test_the_batch_form_gives_the_references_tuples_and_owners(spark, seed, names, broadcast):
    """Whether a batch broadcasts its arrivals (a small batch) or not (one above ``BROADCAST_ROWS``)."""
    relations = {name: Relation(name, rank) for rank, name in enumerate(names)}
    *earlier, last = dense_stream(seed, names)
    joiner = BatchJoiner(names, banded(3), lateness=2, window=3)
    for batch in earlier:
        joiner.step(batch)
    buffered = {owner: {name: list(store.buffered(name)) for name in names} for owner, store in joiner.stores.items()}
    arrived, expected = joiner.step(last)
    assert expected  # the case exercises the join

    sides = [
        Side(
            relations[owner],
            arrivals=frame(spark, [rec for rec in arrived if rec.relation == owner]),
            store=frame(spark, buffered[owner][owner]),
            probes={relations[name]: frame(spark, buffered[owner][name]) for name in names if name != owner},
        )
        for owner in names
    ]
    rows = batch_tuples(sides, predicate(names, 3), Projection({}), broadcast).collect()
    produced = Counter((tuple(row[f"_{name}_id"] for name in names), row["owner"].lower()) for row in rows)
    assert produced == Counter((tuple(member for _, member in match.ids), match.owner) for match in expected)


def test_each_term_joins_a_relation_linked_to_those_before_and_shuffles_no_state(spark):
    """``a.k1 = b.k1 AND b.k2 = c.k2`` links a and c only through b. Joined in the order of the terms, a term of
    b's store starting from a's arrivals would take c next, with no condition: a nested-loop join. Each term
    joins b next instead, then c, each by a broadcast hash join, so no state table is shuffled."""
    schema = "_id string, _ts bigint, k1 string, k2 string"
    rows = {name: spark.createDataFrame([(f"{name}{i}", i, "x", "y") for i in range(3)], schema) for name in "abc"}
    relations = [Relation(name, rank) for rank, name in enumerate("abc")]
    sides = [
        Side(rel, rows[rel.name], rows[rel.name], {other: rows[other.name] for other in relations if other != rel})
        for rel in relations
    ]
    tuples = batch_tuples(sides, "a.k1 = b.k1 AND b.k2 = c.k2", Projection({}))
    plan = tuples._jdf.queryExecution().executedPlan().toString()
    assert "BroadcastHashJoin" in plan
    assert [
        join
        for join in ("BroadcastNestedLoopJoin", "CartesianProduct", "SortMergeJoin", "ShuffledHashJoin")
        if join in plan
    ] == []
