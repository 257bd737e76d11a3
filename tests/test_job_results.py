"""Every failure of a bundle job's task ends its run FAILED, so that the job's on_failure notifications are sent.

Databricks' rules, applied here to the bundle's task graphs as its documentation states them ("Configure task
dependencies", https://docs.databricks.com/aws/en/jobs/run-if, and "Run tasks conditionally",
https://docs.databricks.com/workflows/jobs/conditional-tasks.html):

- Run if "All succeeded: All dependencies have run and succeeded. This is the default [...] The task is marked as
  Upstream failed" when it is not met; "At least one succeeded" and "None failed" (no dependency failed and at least
  one ran) likewise; "All done: the task runs after all its dependencies have run, whatever their status";
  "At least one failed" and "All failed": "If the condition is not met, the task is marked as Excluded".
- "If a task configured to handle failures does not meet its Run if condition, it is marked as Excluded. Excluded
  tasks are skipped and are treated as successful." "If all task dependencies are excluded, the task is also
  excluded, regardless of its Run if condition."
- "Databricks Jobs determines whether a job run was successful based on the outcome of the job's leaf tasks. A leaf
  task is a task that has no downstream dependencies. A job run can have one of three outcomes: Succeeded: All tasks
  were successful. Succeeded with failures: Some tasks failed, but all leaf tasks were successful. Failed: One or
  more leaf tasks failed."
- An If/else condition task runs the tasks that depend on its outcome ("<task-name> (true)" or "(false)",
  https://docs.databricks.com/aws/en/jobs/if-else); a task depending on the outcome it did not give is skipped:
  Excluded (Jobs API ``RunResultState``: "EXCLUDED: The run was skipped because the necessary conditions were not met").
- Job-level ``email_notifications.on_failure`` and ``webhook_notifications.on_failure`` are sent when a run fails:
  a run that ends "Succeeded with failures" sends neither.

- A task's retries (Jobs API ``Task``): ``max_retries`` retries "an unsuccessful run [...] the FAILED result_state",
  ``retry_on_timeout`` a timed-out one, whose state is ``TIMEDOUT`` ("The run was stopped after reaching the
  timeout"); a task's state is its last try's.

Whether a leaf that is "Upstream failed" fails the run, and whether "At least one failed" counts an upstream-failed
or a timed-out dependency as failed, the pages do not say: every verdict here holds under each reading.
"""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from pipelines.cli import SUCCEEDED, _parser
from tests.test_bundle import BUNDLE, GIVEN, RUN_VALUES, holds, jobs, load, resolved, target_variables

SUCCESS, FAILED, EXCLUDED, UPSTREAM_FAILED, TIMEDOUT = "SUCCESS", "FAILED", "EXCLUDED", "UPSTREAM_FAILED", "TIMEDOUT"
# How a task's tries go: each fails (a lasting failure, or a transient one that outlasts the retries), each times out,
# or the first fails and the next would succeed (a lost cluster, a commit that lost a race)
FAILS, TIMES_OUT, FAILS_ONCE = "fails", "times out", "fails once"
FIRST_RUN_OF_THE_DAY, ORDINARY_RUN = datetime(2026, 12, 1, 0, 0), datetime(2026, 12, 1, 5, 30)
ACCEPTANCE, NOTIFICATION_CHECK = "lakejoin_acceptance", "lakejoin_notification_check"


def task_states(
    tasks: list[dict],
    trigger: datetime,
    failing: set[str] | dict[str, str],
    upstream_failed_is_failed: bool,
    timed_out_is_failed: bool = True,
) -> dict[str, tuple[str, bool | None]]:
    """Each task's result state, and a condition task's outcome, for a run triggered at ``trigger`` in which the tasks
    ``failing`` go as it says (a set: each of their tries fails)."""
    tries = failing if isinstance(failing, dict) else dict.fromkeys(failing, FAILS)
    failed_states = {FAILED} | ({UPSTREAM_FAILED} if upstream_failed_is_failed else set())
    failed_states |= {TIMEDOUT} if timed_out_is_failed else set()
    states: dict[str, tuple[str, bool | None]] = {}
    pending = list(tasks)
    while pending:
        task = next(
            task
            for task in pending
            if all(dependency["task_key"] in states for dependency in task.get("depends_on", []))
        )
        pending.remove(task)
        edges = []
        for dependency in task.get("depends_on", []):
            state, outcome = states[dependency["task_key"]]
            wanted = dependency.get("outcome")
            edges.append(
                EXCLUDED if wanted is not None and state == SUCCESS and str(outcome).lower() != wanted else state
            )
        failed = [edge in failed_states for edge in edges]
        succeeded = [edge in (SUCCESS, EXCLUDED) for edge in edges]
        rule = task.get("run_if", "ALL_SUCCESS")
        if edges and all(edge == EXCLUDED for edge in edges):
            runs, otherwise = False, EXCLUDED
        elif not edges or rule == "ALL_DONE":
            runs, otherwise = True, None
        elif rule == "ALL_SUCCESS":
            runs, otherwise = all(succeeded), UPSTREAM_FAILED
        elif rule == "AT_LEAST_ONE_SUCCESS":
            runs, otherwise = any(succeeded), UPSTREAM_FAILED
        elif rule == "NONE_FAILED":
            runs, otherwise = not any(failed) and any(edge != EXCLUDED for edge in edges), UPSTREAM_FAILED
        elif rule == "AT_LEAST_ONE_FAILED":
            runs, otherwise = any(failed), EXCLUDED
        elif rule == "ALL_FAILED":
            runs, otherwise = all(failed), EXCLUDED
        else:
            raise AssertionError(f"unknown run_if {rule}")
        if not runs:
            states[task["task_key"]] = (otherwise, None)
        elif "condition_task" in task:
            states[task["task_key"]] = (SUCCESS, holds(task["condition_task"], trigger))
        elif fails_itself(task, states):
            states[task["task_key"]] = (FAILED, None)
        else:
            states[task["task_key"]] = (last_try(task, tries.get(task["task_key"])), None)
    return states


def last_try(task: dict, tries: str | None) -> str:
    """A task's state after its retries: its last try's."""
    if tries == FAILS_ONCE:
        return SUCCESS if task.get("max_retries", 0) != 0 else FAILED
    return {None: SUCCESS, FAILS: FAILED, TIMES_OUT: TIMEDOUT}[tries]


def fails_itself(task: dict, states: dict[str, tuple[str, bool | None]]) -> bool:
    """``lakejoin acceptance --fail``, which exits 1 whenever it runs, and ``lakejoin failed``, which exits 1 when a
    task it names is in a state that is no success (tests/test_cli.py), each state as Databricks puts it in
    ``{{tasks.NAME.result_state}}``."""
    wheel = task.get("python_wheel_task")
    if wheel is None:
        return False
    named = [
        re.sub(r"\{\{tasks\.(\w+)\.result_state\}\}", lambda match: states[match[1]][0].lower(), parameter)
        for parameter in wheel["parameters"]
    ]
    arguments = _parser().parse_args([RUN_VALUES.get(parameter, parameter) for parameter in named])
    if arguments.command == "failed":
        return any(state.partition("=")[2] not in SUCCEEDED for state in arguments.tasks)
    return bool(getattr(arguments, "fail", False))


def run_result(
    tasks: list[dict],
    trigger: datetime,
    failing: set[str] | dict[str, str],
    upstream_failed_is_failed: bool,
    timed_out_is_failed: bool = True,
) -> str:
    """The run's result state: FAILED when a leaf task failed (or timed out), SUCCESS_WITH_FAILURES when some other
    task did."""
    states = task_states(tasks, trigger, failing, upstream_failed_is_failed, timed_out_is_failed)
    depended_on = {dependency["task_key"] for task in tasks for dependency in task.get("depends_on", [])}
    leaves = [states[task["task_key"]][0] for task in tasks if task["task_key"] not in depended_on]
    failing_states = (FAILED, TIMEDOUT, UPSTREAM_FAILED) if upstream_failed_is_failed else (FAILED, TIMEDOUT)
    if any(state in failing_states for state in leaves):
        return "FAILED"
    return "SUCCESS_WITH_FAILURES" if any(state in (FAILED, TIMEDOUT) for state, _ in states.values()) else "SUCCESS"


def ran(tasks: list[dict], trigger: datetime) -> list[str]:
    """The tasks that run, and so can fail, when none fails."""
    states = task_states(tasks, trigger, set(), upstream_failed_is_failed=True)
    return [
        task["task_key"] for task in tasks if "condition_task" not in task and states[task["task_key"]][0] == SUCCESS
    ]


def every_job() -> dict[str, list[dict]]:
    bundle = load(BUNDLE)
    return {
        key: resolved(job, target_variables(bundle, "prod", GIVEN))["tasks"] for key, (_, job) in jobs(bundle).items()
    }


@pytest.mark.parametrize("timed_out_is_failed", [True, False], ids=["timed-out-fails", "timed-out-passes"])
@pytest.mark.parametrize(
    "upstream_failed_is_failed", [True, False], ids=["upstream-failed-fails", "upstream-failed-passes"]
)
@pytest.mark.parametrize("trigger", [FIRST_RUN_OF_THE_DAY, ORDINARY_RUN], ids=["00:00", "05:30"])
def test_any_task_that_fails_or_times_out_fails_the_run_of_every_job(
    trigger, upstream_failed_is_failed, timed_out_is_failed
):
    """With retries and timeouts: a task whose every try fails or times out fails the run, and a try that a retry
    cures does not."""
    readings = (upstream_failed_is_failed, timed_out_is_failed)
    for key, tasks in every_job().items():
        if key == NOTIFICATION_CHECK:  # it fails on purpose: below
            continue
        assert run_result(tasks, trigger, set(), *readings) == "SUCCESS", key
        for task in ran(tasks, trigger):
            for tries in (FAILS, TIMES_OUT):
                assert run_result(tasks, trigger, {task: tries}, *readings) == "FAILED", (key, task, tries)
            retried = next(each for each in tasks if each["task_key"] == task).get("max_retries", 0) != 0
            cured = run_result(tasks, trigger, {task: FAILS_ONCE}, *readings)
            assert cured == ("SUCCESS" if retried else "FAILED"), (key, task)


def test_the_join_is_the_task_that_retries():
    """Retried: the join, which resumes what a dead try cut short; validate and maintain fail the day's run as they
    are (the next day's run audits again)."""
    for key in ("lakejoin_join", "lakejoin_join_serverless"):
        assert [task["task_key"] for task in every_job()[key] if task.get("max_retries")] == ["join"], key


def test_the_daily_audit_runs_after_a_join_that_failed_and_the_run_still_fails():
    tasks = every_job()["lakejoin_join"]
    states = task_states(tasks, FIRST_RUN_OF_THE_DAY, {"join"}, upstream_failed_is_failed=False)
    assert {key: states[key][0] for key in ("join", "validate", "maintain", "failed")} == {
        "join": FAILED,
        "validate": SUCCESS,
        "maintain": SUCCESS,
        "failed": FAILED,
    }


# The join job's graph as it stood before the `failed` task: the day's audit after the join, run if ALL_DONE.
EARLIER = [
    {"task_key": "join"},
    {"task_key": "first_hour_of_the_day", "depends_on": [{"task_key": "join"}], "run_if": "ALL_DONE",
     "condition_task": {"left": "{{job.trigger.time.hour}}", "op": "LESS_THAN", "right": "1"}},
    {"task_key": "first_run_of_the_hour", "depends_on": [{"task_key": "first_hour_of_the_day", "outcome": "true"}],
     "condition_task": {"left": "{{job.trigger.time.minute}}", "op": "LESS_THAN", "right": "15"}},
    {"task_key": "validate", "depends_on": [{"task_key": "first_run_of_the_hour", "outcome": "true"}]},
    {"task_key": "maintain", "depends_on": [{"task_key": "validate"}]},
]  # fmt: skip


@pytest.mark.parametrize("upstream_failed_is_failed", [True, False])
def test_the_rules_read_the_earlier_graph_as_masking_a_failed_join(upstream_failed_is_failed):
    """The simulation can fail: the earlier graph ended a failed join's run SUCCESS_WITH_FAILURES, at 05:30 (the audit
    excluded) and at 00:00 (the audit passing), and so told nobody."""
    for trigger in (ORDINARY_RUN, FIRST_RUN_OF_THE_DAY):
        assert run_result(EARLIER, trigger, {"join"}, upstream_failed_is_failed) == "SUCCESS_WITH_FAILURES"
    assert run_result(EARLIER, FIRST_RUN_OF_THE_DAY, {"maintain"}, upstream_failed_is_failed) == "FAILED"


@pytest.mark.parametrize("upstream_failed_is_failed", [True, False])
def test_the_acceptance_run_ends_success_only_when_every_check_passed(upstream_failed_is_failed):
    """The seed, each join job's run, validate, maintain, the gold check and both computes' checks: the run is SUCCESS
    when every one passed, and FAILED when any failed or timed out (the tasks after it then never ran); both computes'
    checks run whatever the other did, so a workspace without serverless still gets the classic verdict."""
    tasks = every_job()[ACCEPTANCE]
    checks = [task["task_key"] for task in tasks if task["task_key"] != "passed"]
    assert run_result(tasks, ORDINARY_RUN, set(), upstream_failed_is_failed) == "SUCCESS"
    for failing in [{key: FAILS} for key in checks] + [{key: TIMES_OUT} for key in checks]:
        states = task_states(tasks, ORDINARY_RUN, failing, upstream_failed_is_failed)
        assert states["passed"][0] == FAILED, failing
        assert run_result(tasks, ORDINARY_RUN, failing, upstream_failed_is_failed) == "FAILED", failing
    states = task_states(tasks, ORDINARY_RUN, {"classic"}, upstream_failed_is_failed)
    assert states["serverless"][0] == SUCCESS, "the serverless checks run after failed classic ones"


def test_the_notification_check_always_ends_failed():
    assert run_result(every_job()[NOTIFICATION_CHECK], ORDINARY_RUN, set(), True) == "FAILED"


def test_the_rules_read_a_leaf_run_only_if_one_failed_as_masking_a_timed_out_join():
    """The simulation can fail: the leaf as it stood at 979df51 (run only AT_LEAST_ONE_FAILED) is excluded after a
    timed-out join when that rule does not count TIMEDOUT as failed, and the run ends SUCCESS_WITH_FAILURES."""
    earlier = [
        {**task, "run_if": "AT_LEAST_ONE_FAILED"} if task["task_key"] == "failed" else task
        for task in every_job()["lakejoin_join"]
    ]
    assert run_result(earlier, ORDINARY_RUN, {"join": TIMES_OUT}, True, False) == "SUCCESS_WITH_FAILURES"
    assert run_result(every_job()["lakejoin_join"], ORDINARY_RUN, {"join": TIMES_OUT}, True, False) == "FAILED"
