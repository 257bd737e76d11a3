"""A warehouse that is not lakejoin's, or whose tables disagree with the batch log, is refused untouched."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from state.config import Config
from state.errors import LakejoinError
from state.join.relations import R, S
from tests.helpers import Pipeline
from tests.reference import Record

JOINED = [Record("r", "r1", 1, "a"), Record("s", "s2", 2, "a"), Record("r", "r3", 3, "a"), Record("s", "s4", 4, "a")]
PENDING = [Record("r", "r5", 5, "a"), Record("s", "s6", 6, "a")]


def foreign(columns: dict[str, list]) -> pa.Table:
    return pa.table({name: pa.array(values) for name, values in columns.items()})


DAMAGES = {
    "batch log deleted": (
        lambda p: p.engine.drop(p.warehouse.batches),
        "silver/r_state holds batch 2, but the batch log ends at batch 0",
    ),
    "state table deleted": (
        lambda p: p.engine.drop(p.warehouse.state(R)),
        "silver/r_state is missing, but batch 2 read its version 0",
    ),
    "gold deleted": (
        lambda p: p.engine.drop(p.warehouse.gold),
        "gold/join_results is missing, but the batch log has committed batch 2",
    ),
    "gold replaced by another table": (
        lambda p: (p.engine.drop(p.warehouse.gold), p.engine.append(p.warehouse.gold, foreign({"pair": ["x"]}))),
        r"gold/join_results was not written by lakejoin \(no column _r_id\)",
    ),
    "state table rewritten by something else": (
        lambda p: (
            rows := p.engine.rows(p.warehouse.state(S)),
            p.engine.drop(p.warehouse.state(S)),
            p.engine.append(p.warehouse.state(S), rows),
        ),
        "silver/s_state was not written by pipeline 'lakejoin'",
    ),
    "a state table of the earlier layout (a table per buffer) and no batch log": (
        lambda p: (
            p.engine.drop(p.warehouse.batches),
            p.engine.append(os.path.join(p.warehouse.root, "silver", "r_probes"), p.engine.rows(p.warehouse.bronze(R))),
        ),
        "silver/r_probes is a table of lakejoin's earlier layout",
    ),
    "a batch log of the earlier layout (with phases)": (
        lambda p: (
            p.engine.drop(p.warehouse.batches),
            p.engine.append(p.warehouse.batches, foreign({"batch_id": [1], "phase": ["committed"]})),
        ),
        "silver/batches is a table of lakejoin's earlier layout",
    ),
    "batch log replaced by another table": (
        lambda p: (
            p.engine.drop(p.warehouse.batches),
            p.engine.append(p.warehouse.batches, foreign({"batch_id": [1]})),
        ),
        r"silver/batches was not written by lakejoin \(no column seq_from\)",
    ),
}


@pytest.fixture
def joined(deltars, tmp_path) -> Pipeline:
    """Two committed batches, two arrivals pending."""
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land(JOINED)
    assert len(pipeline.run(max_batch_rows=2)) == 2
    pipeline.land(PENDING)
    return pipeline


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_warehouse_is_refused_and_nothing_is_written(joined, damage):
    harm, message = DAMAGES[damage]
    harm(joined)
    before = joined.versions()
    with pytest.raises(LakejoinError, match=message) as refused:
        joined.run()
    assert "lakejoin reset --warehouse" in str(refused.value) and "\n" not in str(refused.value)
    assert joined.versions() == before


def test_a_run_under_another_pipeline_name_is_refused(joined):
    joined.config = Config.of(pipeline="nightly")
    before = joined.versions()
    with pytest.raises(LakejoinError, match="silver/r_state was not written by pipeline 'nightly'"):
        joined.run()
    assert joined.versions() == before


def test_a_folder_without_bronze_is_not_a_warehouse(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    with pytest.raises(LakejoinError, match="is not a lakejoin warehouse .*'lakejoin ingest --warehouse"):
        pipeline.run()


def test_an_undamaged_warehouse_runs_on(joined):
    assert [report.batch_id for report in joined.run()] == [3]
