"""Records that change: joins over change feeds, gold corrected exactly once (state/changes.py, pipelines/gold.py).

Gold after every batch is the join of the current version of every record; ``gold/changes`` lists what each batch
added and took out; an older change arriving later changes nothing, and a delete's tombstone outlives it.
"""

from __future__ import annotations

from collections import Counter

import pytest

from pipelines.config import Config
from state.errors import LakejoinError
from tests.helpers import Pipeline

CHANGES = {"op": "op", "sequence_by": "seq"}
CONFIG = {"relations": {"r": {"changes": CHANGES}, "s": {"changes": CHANGES}}}


def change(op: str, seq: int, id: str, ts: int, key: str, amount: float = 1.0) -> dict:
    return {"op": op, "seq": seq, "id": id, "ts": ts, "key": key, "amount": amount}


def current_gold(pipeline: Pipeline) -> Counter:
    return Counter((row["_r_id"], row["_s_id"], row["r_amount"], row["s_amount"]) for row in pipeline.gold_rows())


def changes_sum(pipeline: Pipeline) -> Counter:
    """``gold/changes`` summed: +1 per ``+`` row, -1 per ``-`` row, per row content."""
    rows = pipeline.engine.read(pipeline.warehouse.gold_changes)
    total: Counter = Counter()
    for row in [] if rows is None else rows.collect():
        total[(row["_r_id"], row["_s_id"], row["r_amount"], row["s_amount"])] += 1 if row["_change"] == "+" else -1
    return +total


@pytest.fixture
def orders(tmp_path, deltars) -> Pipeline:
    return Pipeline(deltars, str(tmp_path), Config(**CONFIG))


def test_an_update_retracts_the_old_versions_pairs_and_adds_the_new_ones(orders: Pipeline) -> None:
    orders.ingest("r", orders.write_file([change("c", 1, "o1", 10, "k1", 100.0)]))
    orders.ingest("s", orders.write_file([change("c", 1, "p1", 12, "k1", 100.0), change("c", 2, "p2", 13, "k2", 5.0)]))
    orders.run()
    assert current_gold(orders) == Counter({("o1", "p1", 100.0, 100.0): 1})

    orders.ingest("r", orders.write_file([change("u", 2, "o1", 11, "k2", 120.0)]))  # amount corrected, and another key
    orders.run()
    assert current_gold(orders) == Counter({("o1", "p2", 120.0, 5.0): 1})

    orders.ingest("s", orders.write_file([change("d", 3, "p2", 13, "k2", 5.0)]))
    orders.run()
    assert current_gold(orders) == Counter()
    assert changes_sum(orders) == current_gold(orders)


def test_an_older_change_arriving_later_changes_nothing_and_a_delete_outlives_a_late_insert(orders: Pipeline) -> None:
    orders.ingest("s", orders.write_file([change("c", 1, "p1", 12, "k1")]))
    orders.ingest("r", orders.write_file([change("u", 5, "o1", 10, "k1", 50.0)]))  # an update before its insert: an upsert
    orders.run()
    orders.ingest("r", orders.write_file([change("c", 1, "o1", 10, "k1", 10.0)]))  # the insert, older: ignored
    orders.ingest("s", orders.write_file([change("d", 4, "p1", 12, "k1")]))
    orders.run()
    orders.ingest("s", orders.write_file([change("c", 2, "p1", 12, "k1")]))  # older than its delete: stays deleted
    reports = orders.run()
    assert current_gold(orders) == Counter()
    assert changes_sum(orders) == Counter()
    assert reports[-1].pairs == 0


def test_a_change_feed_takes_an_inner_join_and_refuses_others_in_one_line() -> None:
    with pytest.raises(LakejoinError, match=r"join: left over change feeds is not built"):
        Config(**CONFIG, join="left", window=10, allowed_lateness=5)
    with pytest.raises(LakejoinError, match=r"relations.r.changes: cdf reads a source table"):
        Config(relations={"r": {"changes": "cdf"}, "s": {}})
