"""The pipeline definition kept in the warehouse: recorded by the first command given a config, used when none
is given, and a change that would alter gold refused on a warehouse that has batches."""

from __future__ import annotations

from collections import Counter

import pytest

from pipelines.commands.reset import reset
from pipelines.definition import record, recorded, settle
from state.config import Config
from state.errors import LakejoinError
from state.faults import CRASH_AT, InjectedCrash
from tests.helpers import Pipeline, lakejoin_here
from tests.reference import Pair, Record, batch_join

RECORDS = [
    Record("r", "r1", 1, "a", "x"),
    Record("s", "s1", 2, "a", "y"),
    Record("r", "r2", 9, "b", "z"),
    Record("s", "s2", 3, "b", "w"),
]
# One config per setting that alters gold, each differing from the defaults in that setting only.
GOLD_ALTERING = {
    "predicate": Config.of(predicate="r.key <= s.key"),
    "window": Config.of(window=1),
    "allowed_lateness.r": Config.of(allowed_lateness={"r": 5}),
    "select": Config.of(select=["r.id", "s.id AS sid"]),
    "relations.s.required": Config.of(relations={"s": {"required": ["payload"]}}),
    "expectations.policies.bronze_ts_plausible": Config.of(expectations={"policies": {"bronze_ts_plausible": "warn"}}),
    "pipeline": Config.of(pipeline="other"),
}


def joined(pipeline: Pipeline) -> Pipeline:
    """``pipeline`` with its definition recorded, RECORDS landed and joined."""
    record(pipeline.engine, pipeline.warehouse, settle(pipeline.engine, pipeline.warehouse, pipeline.config, "test"))
    pipeline.land(RECORDS)
    pipeline.run()
    return pipeline


@pytest.mark.parametrize("setting", GOLD_ALTERING)
def test_a_gold_altering_change_on_a_warehouse_with_batches_is_refused_naming_it(deltars, tmp_path, setting):
    pipeline = joined(Pipeline(deltars, str(tmp_path)))
    versions = pipeline.versions()
    with pytest.raises(LakejoinError) as refused:
        settle(deltars, pipeline.warehouse, GOLD_ALTERING[setting], "run")
    message = str(refused.value)
    assert message.startswith(f"config changes {setting} from ")
    assert f"'lakejoin reset --warehouse {pipeline.warehouse.root} --yes'" in message and "\n" not in message
    assert pipeline.versions() == versions


def test_a_warehouse_joined_before_any_definition_was_recorded_holds_the_defaults(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    pipeline.land(RECORDS)
    pipeline.run()
    with pytest.raises(LakejoinError, match='config changes predicate from "r.key = s.key" to "r.key <= s.key"'):
        settle(deltars, pipeline.warehouse, Config.of(predicate="r.key <= s.key"), "run")


def test_after_reset_a_new_definition_rebuilds_gold_exactly(deltars, tmp_path):
    pipeline = joined(Pipeline(deltars, str(tmp_path)))
    assert pipeline.gold_pairs() == Counter(batch_join(RECORDS))
    reset(deltars, pipeline.warehouse)
    changed = Config.of(predicate="r.key <= s.key")
    record(deltars, pipeline.warehouse, settle(deltars, pipeline.warehouse, changed, "run"))
    pipeline.config = changed
    pipeline.run(max_batch_rows=1)
    assert pipeline.gold_pairs() == Counter([Pair("r1", "s1", "R"), Pair("r1", "s2", "R"), Pair("r2", "s2", "S")])
    definition = recorded(deltars, pipeline.warehouse)
    assert (definition.version, definition.settings["predicate"]) == (1, "r.key <= s.key")


def test_a_change_that_does_not_alter_gold_is_accepted_and_recorded(deltars, tmp_path):
    pipeline = joined(Pipeline(deltars, str(tmp_path)))
    record(
        deltars,
        pipeline.warehouse,
        settle(deltars, pipeline.warehouse, Config.of(max_batch_rows=7, engine="delta-rs"), "run"),
    )
    rows = sorted(deltars.read(pipeline.warehouse.definition).collect(), key=lambda row: row["version"])
    assert [(row["version"], row["changed"]) for row in rows] == [
        (0, ""),
        (1, 'engine: "auto" -> "delta-rs"\nmax_batch_rows: 1000000 -> 7'),
    ]
    assert settle(deltars, pipeline.warehouse, None, "run").config.max_batch_rows == 7  # no config: the recorded one


def test_the_id_or_event_time_of_an_ingested_relation_cannot_change_even_before_batches(deltars, tmp_path):
    pipeline = Pipeline(deltars, str(tmp_path))
    record(deltars, pipeline.warehouse, settle(deltars, pipeline.warehouse, pipeline.config, "ingest"))
    pipeline.land(RECORDS[:1])
    with pytest.raises(
        LakejoinError, match=r"config changes relations.r.event_time from \"ts\" to \"at\", but bronze/r was ingested"
    ):
        settle(
            deltars, pipeline.warehouse, Config.of(relations={"r": {"event_time": "at", "required": ["key"]}}), "ingest"
        )


def test_commands_without_a_config_use_the_recorded_definition_and_status_prints_it(tmp_path):
    config = tmp_path / "pipeline.yml"
    config.write_text("predicate: r.key <= s.key\nmax_batch_rows: 1\n")
    (tmp_path / "r.jsonl").write_text('{"id": "r1", "ts": 1, "key": "a"}\n')
    (tmp_path / "s.jsonl").write_text('{"id": "s1", "ts": 2, "key": "b"}\n')
    warehouse = str(tmp_path / "wh")
    assert (
        lakejoin_here(
            "ingest", "--warehouse", warehouse, "--side", "r", "--config", str(config), "r.jsonl", cwd=str(tmp_path)
        ).returncode
        == 0
    )
    assert (
        lakejoin_here("ingest", "--warehouse", warehouse, "--side", "s", "s.jsonl", cwd=str(tmp_path)).returncode == 0
    )
    ran = lakejoin_here("run", "--warehouse", warehouse, cwd=str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    assert "1 pairs" in ran.stdout.splitlines()[-1]  # r.key <= s.key: a <= b; the default predicate would give none
    status = lakejoin_here("status", "--warehouse", warehouse, cwd=str(tmp_path))
    assert "definition: version 0" in status.stdout and "  predicate: r.key <= s.key" in status.stdout
    other = tmp_path / "other.yml"
    other.write_text("predicate: r.key = s.key\n")
    refused = lakejoin_here("run", "--warehouse", warehouse, "--config", str(other), cwd=str(tmp_path))
    assert refused.returncode == 2
    (error,) = [line for line in refused.stderr.splitlines() if line.startswith("lakejoin:")]
    assert error.startswith(
        'lakejoin: error: config changes predicate from "r.key <= s.key" to "r.key = s.key", which alters gold'
    )


def test_a_run_dying_after_a_committed_batch_leaves_it_under_its_definition_and_the_same_config_resumes(
    deltars, tmp_path, monkeypatch
):
    """Regression: the definition was recorded when the run ended, so a run killed after its first batch left
    batches under none, and the next run with the same config was refused as altering gold."""
    pipeline = Pipeline(deltars, str(tmp_path), Config.of(window=5))
    pipeline.land(RECORDS)
    config = tmp_path / "pipeline.yml"
    config.write_text("window: 5\n")
    args = ("run", "--warehouse", pipeline.warehouse.root, "--config", str(config), "--max-batch-rows", "1")
    monkeypatch.setenv(CRASH_AT, "after:commit")
    with pytest.raises(InjectedCrash):
        lakejoin_here(*args, cwd=str(tmp_path))
    monkeypatch.delenv(CRASH_AT)
    resumed = lakejoin_here(*args, cwd=str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert pipeline.gold_pairs() == Counter([Pair("r1", "s1", "R")])  # r2 and s2 are 6 apart
