"""A batch that writes nothing — no gold row, no state row, only its late arrivals set aside — is followed by runs that
go on, for every join kind whose writes can be empty: gold leaves the batch's mark where the consistency check and a
resumed batch look for it, and stays the batch SQL join of what is not late (expectations/reconcile.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from expectations.reconcile import check_gold
from state.config import Config
from tests.helpers import Pipeline
from tests.reference import Record
from tests.strategies import split

# Every way gold is written with bounded state (a window where it takes one, and a lateness): pairs (inner; an N-way
# inner join writes as two relations do), rows once final (full; a left join is its one side), as-of rows, and
# synchronized rows of three relations. A record far below its relation's watermark is late, so a batch of only
# such records joins nothing and keeps nothing.
KINDS = {
    "inner": dict(window=2, allowed_lateness=1),
    "full": dict(join="full", window=2, allowed_lateness=1),
    "asof": dict(join="asof", allowed_lateness=1),
    "synchronized": dict(
        relations=dict.fromkeys("rst"),
        join="synchronized",
        predicate="r.key = s.key AND s.key = t.key",
        allowed_lateness=1,
    ),
}


def streams(names: str) -> st.SearchStrategy[list[Record]]:
    """2 to 10 records of the relations ``names``, event times 10 to 16 on two keys, each relation at least once."""
    drawn = st.tuples(st.sampled_from(names), st.integers(10, 16), st.sampled_from(["a", "b"]))
    records = st.lists(drawn, min_size=len(names), max_size=10).map(
        lambda rows: [
            Record(name, f"{name}{i:02d}", ts, key, rank=names.index(name)) for i, (name, ts, key) in enumerate(rows)
        ]
    )
    return records.filter(lambda recs: {rec.relation for rec in recs} == set(names))


@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=1,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate],
)
@given(data=st.data())
def test_a_batch_that_writes_nothing_is_followed_by_runs_that_go_on(deltars, tmp_path_factory, kind, data):
    config = Config.of(**KINDS[kind])
    names = "".join(rel.name for rel in config.joined)
    pipeline = Pipeline(deltars, str(tmp_path_factory.mktemp(kind)), config)
    batches = split(data, data.draw(st.permutations(data.draw(streams(names)))), most=2)
    for number, landed in enumerate(batches):
        pipeline.land(landed)
        pipeline.run(max_batch_rows=data.draw(st.integers(1, 6)))
        if number == 0:  # every relation that has arrived has a watermark, 9 or more: records at 0 are late
            arrived = {rec.relation for rec in landed}
            late = [Record(name, f"{name}-late", 0, "a", rank=names.index(name)) for name in names if name in arrived]
            states = {path: deltars.version(path) for path in pipeline.warehouse.buffers().values()}
            pipeline.land(late)
            (empty,) = pipeline.run()
            assert empty.pairs == 0 and sum(empty.late.values()) == len(late)
            assert {path: deltars.version(path) for path in states} == states, "no state table written"
        check = check_gold(deltars, pipeline.warehouse, pipeline.config)
        assert check is None or check.passed, check.describe()
