"""The Databricks bundle, checked offline: it parses, every job validates against ``databricks-bundles``'
models, every task calls a real ``lakejoin`` command with the config and names no relation, crons are valid, nothing
names a workspace or a secret; and the join job's own command, run here on a config of other relations' names,
ingests their landing folders and joins them."""

from __future__ import annotations

import glob
import json
import operator
import os
import re
import sys
import tomllib
from collections.abc import Iterator
from datetime import datetime, timedelta
from importlib.metadata import EntryPoint
from typing import Any

import pytest
import yaml
from databricks.bundles.jobs import Job

from pipelines.cli import _parser
from tests.helpers import REPO

BUNDLE = os.path.join(REPO, "databricks.yml")
# What Databricks puts for a dynamic value reference in a task's parameters when it runs (jobs/dynamic-value-references:
# {{job.start_time.<argument>}}, the job run's start in UTC)
RUN_VALUES = {"{{job.start_time.iso_datetime}}": "2026-12-05T10:15:00"}


def parsed(parameters: list[str]) -> Any:
    """A task's parameters as the ``lakejoin`` command parses them when the task runs (SystemExit on a bad one)."""
    return _parser().parse_args([RUN_VALUES.get(parameter, parameter) for parameter in parameters])


_VARIABLE = re.compile(r"\$\{var\.(\w+)\}")


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def bundle() -> dict[str, Any]:
    return load(BUNDLE)


def included(bundle: dict[str, Any]) -> list[str]:
    return sorted(path for pattern in bundle["include"] for path in glob.glob(os.path.join(REPO, pattern)))


def jobs(bundle: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every job by key, with the file defining it (relative paths resolve from there)."""
    found = {}
    for path in [BUNDLE, *included(bundle)]:
        for key, job in (load(path).get("resources") or {}).get("jobs", {}).items():
            found[key] = (path, job)
    return found


def resolved(value: Any, variables: dict[str, Any], substitutions: dict[str, str] | None = None) -> Any:
    """``value`` with ``${var.name}`` replaced by the variables' values (and ``${name}`` by ``substitutions``), as
    ``bundle deploy`` would."""
    if isinstance(value, dict):
        return {key: resolved(item, variables, substitutions) for key, item in value.items()}
    if isinstance(value, list):
        return [resolved(item, variables, substitutions) for item in value]
    if isinstance(value, str):
        for name, text in (substitutions or {}).items():
            value = value.replace("${" + name + "}", text)
        whole = _VARIABLE.fullmatch(value)
        if whole and whole.group(1) in variables:
            return variables[whole.group(1)]
        return _VARIABLE.sub(lambda match: str(variables.get(match.group(1), match.group(0))), value)
    return value


# What a team gives the variables that have no default (docs/databricks.md, the checklist), as --var or in
# .databricks/bundle/<target>/variable-overrides.json.
GIVEN = {
    "notify_on_failure": ["data-oncall@example.com"],
    "alert_subscriptions": [{"user_email": "data-oncall@example.com"}],
    "sql_warehouse_id": "0123456789abcdef",
    "service_principal": "6f1e0c4d-0000-0000-0000-000000000000",
    "operators": "data-engineers",
    "workspace_id": "1234567890123456",
    "node_type_id": "m5d.xlarge",
}
# What every target is given, dev included: the workspace's own (its SQL warehouse, its id, its cloud's node type)
WORKSPACE_S_OWN = ("sql_warehouse_id", "workspace_id", "node_type_id")
# Substitutions the CLI makes from the workspace it deploys to.
WORKSPACE = {"workspace.current_user.userName": "someone@example.com"}


class RequiredVariable(Exception):
    """What ``databricks bundle validate`` refuses: a declared variable with no value in the target."""


def target_variables(bundle: dict[str, Any], target: str | None, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The variables as ``bundle deploy [-t target]`` resolves them: the defaults, the target's own values, those
    ``given``, then the references from one variable to another. Every declared variable needs a value, whether the
    target uses it or not (databricks/cli, bundle/config/mutator/set_variables.go)."""
    values = {name: spec["default"] for name, spec in bundle["variables"].items() if "default" in spec}
    values.update((bundle["targets"][target].get("variables") or {}) if target else {})
    values.update(given or {})
    missing = [name for name in bundle["variables"] if name not in values]
    if missing:
        raise RequiredVariable(f"no value assigned to required variable {missing[0]}")
    values = {name: resolved(value, {}, WORKSPACE) for name, value in values.items()}
    for _ in values:  # each pass resolves one more level of reference
        values = {name: resolved(value, values) for name, value in values.items()}
    return values


def defaults(bundle: dict[str, Any]) -> dict[str, Any]:
    """The variables of a target that sets none of its own, given what has no default."""
    return target_variables(bundle, None, GIVEN)


def test_every_include_glob_matches_a_file(bundle):
    for pattern in bundle["include"]:
        assert glob.glob(os.path.join(REPO, pattern)), pattern


def test_every_job_validates_against_the_databricks_bundles_models(bundle):
    found = jobs(bundle)
    assert set(found) == {
        "lakejoin_join",
        "lakejoin_join_follow",
        "lakejoin_join_serverless",
        ACCEPTANCE,
        NOTIFICATION_CHECK,
    }
    for key, (_, job) in found.items():
        Job.from_dict(resolved(job, defaults(bundle)))  # raises on an unknown field or a missing required one


def test_the_models_do_reject_what_they_should():
    with pytest.raises(ValueError, match="Unexpected field"):
        Job.from_dict({"name": "x", "tasks": [{"task_key": "a", "spark_python_taks": {}}]})
    with pytest.raises(TypeError):
        Job.from_dict(
            {"name": "x", "tasks": [{"python_wheel_task": {"package_name": "lakejoin", "entry_point": "lakejoin"}}]}
        )


ACCEPTANCE = "lakejoin_acceptance"  # checks a workspace once, in schemas of its own: no join of the warehouse
NOTIFICATION_CHECK = "lakejoin_notification_check"  # fails on purpose, to see who is told


def joining_jobs(bundle: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The jobs that work on the target's warehouse: every job but the acceptance checks."""
    return {key: found for key, found in jobs(bundle).items() if key not in (ACCEPTANCE, NOTIFICATION_CHECK)}


def wheel_tasks(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The job's tasks that run lakejoin on the warehouse, by task key (the others are conditions, and the task that
    fails a run in which one of them failed: tests/test_job_results.py)."""
    return {
        task["task_key"]: task
        for task in job["tasks"]
        if "python_wheel_task" in task and task["python_wheel_task"]["parameters"][0] != "failed"
    }


def test_every_task_runs_a_real_lakejoin_command_from_the_wheel(bundle):
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        project = tomllib.load(handle)["project"]
    commands = set()
    for path, job in joining_jobs(bundle).values():
        every = {
            task["task_key"]: task
            for task in as_run(resolved(job, defaults(bundle)))["tasks"]
            if "python_wheel_task" in task
        }
        if "failed" in every:
            commands.add(parsed(every["failed"]["python_wheel_task"]["parameters"]).command)
        for task in wheel_tasks(as_run(resolved(job, defaults(bundle)))).values():
            wheel_task = task["python_wheel_task"]
            assert wheel_task["package_name"] == project["name"]
            assert wheel_task["entry_point"] in project["scripts"]
            arguments = parsed(wheel_task["parameters"])  # exits (SystemExit) on a bad argument
            commands.add(arguments.command)
            assert arguments.warehouse == "main.lakejoin"  # catalog.schema: a Unity Catalog warehouse
            # the wheel where the artifact's build puts it: a cluster's task library, or its serverless environment's
            environments = {
                environment["environment_key"]: environment["spec"] for environment in job.get("environments", [])
            }
            wheels = [library["whl"] for library in task.get("libraries", [])] or environments[task["environment_key"]][
                "dependencies"
            ]
            assert [os.path.normpath(os.path.join(os.path.dirname(path), wheel)) for wheel in wheels] == [
                os.path.join(REPO, "dist", "*.whl")
            ]
    assert commands == {"run", "validate", "maintain", "failed"}
    assert bundle["artifacts"]["lakejoin_wheel"]["type"] == "whl"


QUARTZ_FIELDS = [(0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (1, 7), (1970, 2199)]


def quartz_valid(expression: str) -> bool:
    """Seconds, minutes, hours, day of month, month, day of week[, year]; ``?`` in exactly one day field."""
    fields = expression.split()
    if len(fields) not in (6, 7) or [fields[3], fields[5]].count("?") != 1:
        return False
    for field, (low, high) in zip(fields, QUARTZ_FIELDS):
        for part in field.split(","):
            if part in ("*", "?"):
                continue
            match = re.fullmatch(r"(\*|\d+)(?:-(\d+))?(?:/(\d+))?", part)
            if not match:
                return False
            numbers = [int(n) for n in (match.group(1), match.group(2)) if n and n != "*"]
            if any(not low <= n <= high for n in numbers) or (match.group(3) and int(match.group(3)) < 1):
                return False
    return True


def test_a_wheel_task_s_entry_point_ends_the_process_with_the_command_s_status(bundle, monkeypatch, tmp_path):
    """A python_wheel_task loads its entry_point from the wheel's console scripts and calls the function with the task's
    parameters in sys.argv, ignoring what it returns: the function itself must exit with the status, or a refused
    command shows as a successful task."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        scripts = tomllib.load(handle)["project"]["scripts"]
    (entry_point,) = {
        task["python_wheel_task"]["entry_point"]
        for _, job in jobs(bundle).values()
        for task in wheel_tasks(job).values()
    }
    called = EntryPoint(entry_point, scripts[entry_point], "console_scripts").load()
    monkeypatch.setattr(
        sys, "argv", [entry_point, "reset", "--warehouse", str(tmp_path)]
    )  # refused without --yes, before Spark
    with pytest.raises(SystemExit) as ended:
        called()
    assert ended.value.code == 2


def test_the_cron_checker_rejects_bad_expressions():
    assert quartz_valid("0 */15 * * * ?") and quartz_valid("0 30 2 * * ?")
    assert not quartz_valid("*/15 * * * *")  # Unix cron: five fields
    assert not quartz_valid("0 61 * * * ?") and not quartz_valid("0 0 4 * * *")


TRIGGERS = ("schedule", "continuous", "trigger")


def deployed_pause(job: dict[str, Any], target: dict[str, Any]) -> dict[str, str]:
    """How each trigger of ``job`` is deployed to ``target``: its own pause_status, else the target's
    presets.trigger_pause_status (PAUSED by default in development mode), else the Jobs API's default, UNPAUSED
    (databricks/cli: bundle/config/mutator/apply_presets.go and apply_target_mode.go)."""
    preset = (target.get("presets") or {}).get("trigger_pause_status") or (
        "PAUSED" if target.get("mode") == "development" else None
    )
    return {kind: job[kind].get("pause_status") or preset or "UNPAUSED" for kind in TRIGGERS if kind in job}


def test_every_schedule_is_a_valid_quartz_cron(bundle):
    scheduled = {key: resolved(job, defaults(bundle)) for key, (_, job) in jobs(bundle).items() if "schedule" in job}
    assert set(scheduled) == {"lakejoin_join", "lakejoin_join_serverless"}
    for minutes in ("5", "15", "20", "30", "45", "60"):
        job = resolved(jobs(bundle)["lakejoin_join"][1], {**defaults(bundle), "join_every_minutes": minutes})
        assert quartz_valid(job["schedule"]["quartz_cron_expression"]), minutes
        Job.from_dict(job)


def in_sequence(tasks: list[dict[str, Any]]) -> list[str]:
    """The task keys in the one order they run in, each task depending on the one before it and nothing else; fails
    if two tasks of a run could run at once."""
    after = {task["task_key"]: [dependency["task_key"] for dependency in task.get("depends_on", [])] for task in tasks}
    order: list[str] = []
    while after:
        (following,) = [key for key, dependencies in after.items() if dependencies == order[-1:]]
        order.append(following)
        del after[following]
    return order


def test_nothing_scheduled_can_overlap_a_join(bundle):
    """A Unity Catalog warehouse has no lock. Whatever a target unpauses, one job runs, one run of it at a time, each
    run's tasks one after the other: the join, then on the day's first run validation, then maintenance."""
    for name, target in bundle["targets"].items():
        unpaused = {**target, "presets": {"trigger_pause_status": "UNPAUSED"}}
        running = sorted(
            key for key, (_, job) in jobs(bundle).items() if "UNPAUSED" in deployed_pause(job, unpaused).values()
        )
        assert running == ["lakejoin_join"], (name, running)
    job = jobs(bundle)["lakejoin_join"][1]
    assert job["max_concurrent_runs"] == 1 and job["queue"]["enabled"]
    on_the_warehouse = [task for task in job["tasks"] if task["task_key"] != "failed"]  # `failed` reads no table
    assert in_sequence(on_the_warehouse) == [
        "join",
        "first_hour_of_the_day",
        "first_run_of_the_hour",
        "validate",
        "maintain",
    ]
    assert [parsed(task["python_wheel_task"]["parameters"]).command for task in wheel_tasks(job).values()] == [
        "run",
        "validate",
        "maintain",
    ]


COMPARED = {
    "LESS_THAN": operator.lt,
    "LESS_THAN_OR_EQUAL": operator.le,
    "GREATER_THAN": operator.gt,
    "GREATER_THAN_OR_EQUAL": operator.ge,
}


def holds(condition: dict[str, str], trigger: datetime) -> bool:
    """A condition task's outcome for a run triggered at ``trigger`` (UTC): ``{{job.trigger.time.hour}}`` and
    ``.minute`` are the trigger's; these operators compare numbers (https://docs.databricks.com/aws/en/jobs/if-else)."""

    def value(operand: str) -> float:
        return float(
            re.sub(
                r"\{\{job\.trigger\.time\.(hour|minute)\}\}",
                lambda match: str(getattr(trigger, match.group(1))),
                operand,
            )
        )

    return COMPARED[condition["op"]](value(condition["left"]), value(condition["right"]))


def triggers(expression: str, day: datetime) -> Iterator[datetime]:
    """The times a ``0 M H * * ?`` Quartz cron fires on ``day``, M and H each ``*``, ``*/N`` or a number."""

    def values(field: str, high: int) -> list[int]:
        if field == "*":
            return list(range(high + 1))
        if field.startswith("*/"):
            return list(range(0, high + 1, int(field[2:])))
        return [int(field)]

    _, minutes, hours, *_ = expression.split()
    for hour in values(hours, 23):
        for minute in values(minutes, 59):
            yield day + timedelta(hours=hour, minutes=minute)


def test_validation_and_maintenance_run_on_the_first_run_of_each_utc_day_only(bundle):
    for minutes in ("5", "15", "20", "30", "45", "60"):
        job = resolved(jobs(bundle)["lakejoin_join"][1], {**defaults(bundle), "join_every_minutes": minutes})
        conditions = [task["condition_task"] for task in job["tasks"] if "condition_task" in task]
        day = datetime(2026, 11, 27)
        daily = [
            run
            for run in triggers(job["schedule"]["quartz_cron_expression"], day)
            if all(holds(condition, run) for condition in conditions)
        ]
        assert daily == [day], (minutes, daily)


def test_no_schedule_runs_until_its_target_unpauses_it(bundle):
    """Deploying starts nothing: the checklist runs the join once, checks it, then unpauses prod."""
    for name, target in bundle["targets"].items():
        for key, (_, job) in jobs(bundle).items():
            assert set(deployed_pause(job, target).values()) <= {"PAUSED"}, (name, key, deployed_pause(job, target))


def test_unpausing_is_the_target_s_own_setting_which_every_later_deploy_keeps(bundle):
    """A --var given to one deploy is gone at the next (an upgrade would pause everything again): the pause status is
    prod's presets.trigger_pause_status, edited once in databricks.yml; the continuous join stays paused whatever it
    says, to be unpaused only instead of the scheduled one."""
    assert "schedules" not in bundle["variables"]
    for _, job in jobs(bundle).values():
        assert all("${var." not in str(job[kind].get("pause_status", "")) for kind in TRIGGERS if kind in job)
    unpaused = {
        **bundle["targets"]["prod"],
        "presets": {"trigger_pause_status": "UNPAUSED"},
    }  # the checklist's last step
    assert deployed_pause(jobs(bundle)["lakejoin_join"][1], unpaused) == {"schedule": "UNPAUSED"}
    assert deployed_pause(jobs(bundle)["lakejoin_join_follow"][1], unpaused) == {"continuous": "PAUSED"}
    with open(os.path.join(REPO, "docs", "databricks.md"), encoding="utf-8") as handle:
        page = handle.read()
    assert "trigger_pause_status: UNPAUSED" in page and "--var" not in page


# What `databricks bundle validate` requires of a target's mode, from the CLI's own rules (databricks/cli,
# bundle/config/mutator/validate_target_mode.go) and https://docs.databricks.com/aws/en/dev-tools/bundles/deployment-modes.
# The CLI cannot run here: it is a binary from GitHub releases, which this machine cannot reach, and its validation
# logs in to a workspace. (CLI versions before the root_path rule required run_as instead, which docs/databricks.md
# says how to set.)
USER_PATHS = ("root_path", "file_path", "resource_path", "artifact_path", "state_path")


def mode_errors(target: dict[str, Any]) -> list[str]:
    """The errors `databricks bundle validate -t TARGET` reports for the target's mode."""
    mode, workspace = target.get("mode"), target.get("workspace") or {}
    if mode == "production":
        return (
            []
            if workspace.get("root_path")
            else [
                "target with 'mode: production' must set 'workspace.root_path' to make sure only one copy is deployed"
            ]
        )
    if mode == "development":
        errors = [
            f"{key} must start with '~/' or contain the current username when using 'mode: development'"
            for key in USER_PATHS
            if key in workspace
            and not (workspace[key].startswith("~/") or "${workspace.current_user." in workspace[key])
        ]
        if (target.get("presets") or {}).get("trigger_pause_status") == "UNPAUSED":
            errors.append("target with 'mode: development' cannot set trigger pause status to UNPAUSED by default")
        return errors
    return (
        []
        if mode is None
        else [f"unsupported value '{mode}' specified for 'mode': must be either 'development' or 'production'"]
    )


def test_the_mode_rules_refuse_what_the_cli_refuses():
    assert mode_errors({"mode": "production"}) and mode_errors({"mode": "staging"})
    assert mode_errors({"mode": "development", "workspace": {"root_path": "/Workspace/Shared/x"}})
    assert not mode_errors({"mode": "development", "workspace": {"root_path": "~/.bundle/x"}})


def test_every_target_passes_the_cli_s_mode_rules(bundle):
    assert {name: target.get("mode") for name, target in bundle["targets"].items()} == {
        "dev": "development",
        "prod": "production",
    }
    for name, target in bundle["targets"].items():
        assert not mode_errors(target), (name, mode_errors(target))


def test_prod_deploys_one_copy_whoever_deploys_it(bundle):
    """Two copies of prod's jobs would run two joins on one warehouse: its root path names no deploying user."""
    root = bundle["targets"]["prod"]["workspace"]["root_path"]
    assert root.startswith("/Workspace/") and "current_user" not in root and "${bundle.target}" in root


def test_the_following_join_is_a_paused_continuous_job_that_runs_on_the_scheduled_join_s_warehouse(bundle):
    follow, scheduled = (
        as_run(resolved(jobs(bundle)[key][1], defaults(bundle))) for key in ("lakejoin_join_follow", "lakejoin_join")
    )
    assert "schedule" not in follow and follow["continuous"] == {
        "pause_status": "PAUSED"
    }  # unpaused instead of lakejoin_join, by hand
    arguments = parsed(wheel_tasks(follow)["join_follow"]["python_wheel_task"]["parameters"])
    assert arguments.follow and arguments.trigger == 30
    assert arguments.warehouse == parsed(wheel_tasks(scheduled)["join"]["python_wheel_task"]["parameters"]).warehouse


def test_the_serverless_join_is_the_scheduled_join_on_a_serverless_environment_paused_until_unpaused_instead(bundle):
    serverless, scheduled = (
        resolved(jobs(bundle)[key][1], defaults(bundle)) for key in ("lakejoin_join_serverless", "lakejoin_join")
    )
    assert serverless["schedule"]["pause_status"] == "PAUSED" and "job_clusters" not in serverless
    [environment] = serverless["environments"]
    assert environment["spec"]["environment_version"] == defaults(bundle)["serverless_environment"]
    on_cluster = [
        {key: value for key, value in task.items() if key not in ("job_cluster_key", "libraries", "run_if")}
        for task in scheduled["tasks"]
    ]
    on_serverless = [
        {key: value for key, value in task.items() if key not in ("environment_key", "run_if")}
        for task in serverless["tasks"]
    ]
    assert on_serverless == on_cluster  # the same tasks, conditions and commands
    assert [task.get("environment_key") for task in serverless["tasks"]] == [
        task.get("job_cluster_key") and environment["environment_key"] for task in scheduled["tasks"]
    ]
    assert [task.get("run_if") for task in serverless["tasks"]] == [task.get("run_if") for task in scheduled["tasks"]]
    for part in ("email_notifications", "webhook_notifications", "max_concurrent_runs", "queue"):
        assert serverless[part] == scheduled[part], part
    assert {**serverless["schedule"], "pause_status": "PAUSED"} == {**scheduled["schedule"], "pause_status": "PAUSED"}


# The Databricks Runtime versions that ship Spark 4.1, as the runtime release notes name them
# (https://docs.databricks.com/aws/en/release-notes/runtime/): version -> (Spark, support, end of support). Runtime 18
# is the first with unified release notes: after 18.0 to 18.2, its updates ship as dated entries of "18", not as 18.3.
SPARK_4_1_RUNTIMES = {
    "18.0": ("4.1", "Beta", "2026-06-09"),
    "18": ("4.1", "LTS", "2029-06-10"),
}
# The Clusters API's key for a version (SparkVersion.key, GET /api/2.1/clusters/spark-versions, e.g. 17.3.x-scala2.13):
# the version as the release notes name it, ".x" (its latest maintenance update), then the Scala line.
RUNTIME_KEY = re.compile(r"(?P<version>\d+(?:\.\d+)?)\.x-scala(?P<scala>\d+\.\d+)")


def test_the_runtime_key_has_the_documented_form():
    assert [
        RUNTIME_KEY.fullmatch(key)["version"] for key in ("17.3.x-scala2.13", "16.4.x-scala2.12", "18.x-scala2.13")
    ] == ["17.3", "16.4", "18"]
    assert not any(
        RUNTIME_KEY.fullmatch(key) for key in ("18-scala2.13", "18.x", "18.3.x-scala2.13 ", "LTS 18.x-scala2.13")
    )


def test_the_runtime_is_the_long_term_supported_line_of_the_pinned_spark(bundle):
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        local = tomllib.load(handle)["project"]["optional-dependencies"]["local"]
    pinned = next(match.group(1) for pin in local if (match := re.fullmatch(r"pyspark(?:\[[\w,]+\])?==(.+)", pin)))
    key = RUNTIME_KEY.fullmatch(defaults(bundle)["job_cluster"]["spark_version"])
    assert key is not None and key["scala"] == "2.13"
    spark, support, _ = SPARK_4_1_RUNTIMES[key["version"]]
    assert support == "LTS"
    assert pinned.startswith(spark + ".")


def test_prod_is_refused_without_whom_a_failure_tells_and_dev_tells_whoever_deploys_it(bundle):
    for name in ("notify_on_failure", "alert_subscriptions"):
        with pytest.raises(RequiredVariable, match=name):
            target_variables(bundle, "prod", {key: value for key, value in GIVEN.items() if key != name})
    dev = target_variables(bundle, "dev", {key: GIVEN[key] for key in WORKSPACE_S_OWN})
    assert dev["notify_on_failure"] == ["someone@example.com"] and dev["alert_subscriptions"] == [
        {"user_email": "someone@example.com"}
    ]
    named = {**GIVEN, "failure_destinations": [{"id": "0f1e2d3c"}]}
    for key, (_, job) in jobs(bundle).items():
        if key == NOTIFICATION_CHECK:  # tells whom it is asked to: below
            continue
        told = resolved(job, target_variables(bundle, "prod", named))
        assert told["email_notifications"]["on_failure"] == ["data-oncall@example.com"], key
        assert told["webhook_notifications"]["on_failure"] == [{"id": "0f1e2d3c"}], key
        Job.from_dict(told)


def test_an_overlong_join_task_tells_them_before_the_next_run_waits(bundle):
    """The duration rule is the scheduled join's own: the day's validate and maintain do not count towards it. A task's
    rule is told by the task's notifications: the job's are sent only for a rule in the job's health field."""
    values = defaults(bundle)
    for key in ("lakejoin_join", "lakejoin_join_serverless"):
        job = resolved(jobs(bundle)[key][1], values)
        assert "health" not in job and "on_duration_warning_threshold_exceeded" not in job["email_notifications"]
        rules = {task["task_key"]: task["health"]["rules"] for task in job["tasks"] if "health" in task}
        assert rules == {
            "join": [
                {
                    "metric": "RUN_DURATION_SECONDS",
                    "op": "GREATER_THAN",
                    "value": values["run_duration_warning_seconds"],
                }
            ]
        }, key
        join = wheel_tasks(job)["join"]
        assert join["email_notifications"]["on_duration_warning_threshold_exceeded"] == values["notify_on_failure"]
        assert join["webhook_notifications"]["on_duration_warning_threshold_exceeded"] == values["failure_destinations"]
    assert (
        values["run_duration_warning_seconds"] < int(values["join_every_minutes"]) * 60
    )  # heard of before the next run waits


def test_prod_runs_as_its_service_principal_from_its_folder_with_groups_that_may_run_or_view(bundle):
    prod = resolved(bundle["targets"]["prod"], target_variables(bundle, "prod", GIVEN))
    principal = GIVEN["service_principal"]
    assert prod["run_as"] == {"service_principal_name": principal}
    assert prod["workspace"]["root_path"].startswith(f"/Workspace/Users/{principal}/.bundle/")
    assert prod["permissions"] == [
        {"level": "CAN_RUN", "group_name": "data-engineers"},  # CAN_MANAGE_RUN on each job
        {"level": "CAN_VIEW", "group_name": "users"},
    ]
    job_level = {"CAN_RUN": "CAN_MANAGE_RUN", "CAN_VIEW": "CAN_VIEW", "CAN_MANAGE": "CAN_MANAGE"}
    on_jobs = [{**permission, "level": job_level[permission["level"]]} for permission in prod["permissions"]]
    for key, (_, job) in jobs(bundle).items():  # the models take the target's run_as and permissions on each job
        Job.from_dict({**resolved(job, defaults(bundle)), "run_as": prod["run_as"], "permissions": on_jobs})


def test_every_job_cluster_carries_the_tag_its_cost_is_found_by(bundle):
    for key, (_, job) in jobs(bundle).items():
        for cluster in resolved(job, defaults(bundle)).get("job_clusters", []):
            assert cluster["new_cluster"]["custom_tags"] == {"application": "lakejoin"}, key


def test_no_workspace_url_or_secret_is_hard_coded(bundle):
    forbidden = re.compile(
        r"https?://|cloud\.databricks\.com|azuredatabricks\.net|gcp\.databricks\.com|dapi[0-9a-f]{16,}|\btoken\b|password|\bhost:",
        re.I,
    )
    for path in [BUNDLE, *included(bundle)]:
        with open(path, encoding="utf-8") as handle:
            text = "\n".join(line.split("#")[0] for line in handle)  # comments may explain, not configure
        assert not forbidden.search(text), (path, forbidden.search(text))


def task_parameters(
    bundle: dict[str, Any], key: str, task: str, job_parameters: dict[str, str] | None = None, **variables: str
) -> list[str]:
    """The parameters of task ``task`` of job ``key`` as a run of it passes them, with ``variables`` set (``-t`` a
    target, ``--var name=value``) and the run given ``job_parameters`` (the others at their defaults)."""
    job = as_run(resolved(jobs(bundle)[key][1], {**defaults(bundle), **variables}), job_parameters)
    return [
        RUN_VALUES.get(parameter, parameter) for parameter in wheel_tasks(job)[task]["python_wheel_task"]["parameters"]
    ]


def as_run(job: dict[str, Any], given: dict[str, str] | None = None) -> dict[str, Any]:
    """``job`` (deployed) as a run of it sees it: each ``{{job.parameters.NAME}}`` the value the run was given, or the
    parameter's default; a parameter the job does not declare is refused, as the Jobs API refuses it."""
    values = {parameter["name"]: parameter["default"] for parameter in job.get("parameters", [])}
    assert set(given or {}) <= set(values), f"{job['name']} takes no parameter {set(given or {}) - set(values)}"
    values |= given or {}

    def run_value(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: run_value(item) for key, item in value.items()}
        if isinstance(value, list):
            return [run_value(item) for item in value]
        if isinstance(value, str):
            return re.sub(r"\{\{job\.parameters\.(\w+)\}\}", lambda match: values[match[1]], value)
        return value

    return run_value(job)


def test_every_task_takes_the_config_and_names_no_relation_and_no_batch_size(bundle):
    for key, (_, job) in joining_jobs(bundle).items():
        for task in wheel_tasks(job):
            arguments = parsed(task_parameters(bundle, key, task))
            assert arguments.config == defaults(bundle)["config"], (key, task)
            assert getattr(arguments, "relation", None) is None and getattr(arguments, "side", None) is None, (
                key,
                task,
            )
            assert getattr(arguments, "max_batch_rows", None) is None, (key, task)  # the config's max_batch_rows rules


def test_the_acceptance_job_checks_both_computes_in_schemas_of_their_own_and_is_never_scheduled(bundle):
    path, job = jobs(bundle)[ACCEPTANCE]
    assert not set(TRIGGERS) & set(job), "run by hand, once"
    tasks = wheel_tasks(resolved(job, defaults(bundle)))
    checks = {key: parsed(task["python_wheel_task"]["parameters"]) for key, task in tasks.items()}
    assert {key: args.command for key, args in checks.items()} == {
        "seed": "acceptance",
        "killed_join": "acceptance",
        "validate": "validate",
        "maintain": "maintain",
        "joined": "acceptance",
        "classic": "acceptance",
        "serverless": "acceptance",
    }
    assert not any(checks[key].fail for key in ("seed", "killed_join", "joined", "classic", "serverless"))
    assert "job_cluster_key" in tasks["classic"] and "environment_key" in tasks["serverless"]
    schemas = {checks["classic"].warehouse, checks["serverless"].warehouse, checks["seed"].warehouse}
    assert len(schemas) == 3 and "main.lakejoin" not in schemas, "never the join's warehouse, nor each other's"
    assert {volume(checks[key].report) for key in ("classic", "serverless", "joined")} == {defaults(bundle)["docs"]}
    assert job["email_notifications"]["on_failure"] == "${var.notify_on_failure}"
    with open(os.path.join(REPO, "docs", "databricks.md"), encoding="utf-8") as handle:
        assert "databricks bundle run -t dev lakejoin_acceptance" in handle.read()


def test_the_acceptance_run_joins_a_seeded_warehouse_with_the_real_join_jobs_at_once_never_the_target_s(bundle):
    """Both join jobs run as themselves (run_job_task), given the seeded warehouse and config as job parameters each
    declares, started together after the seed; validate, maintain and the gold check work on that warehouse."""
    job = resolved(jobs(bundle)[ACCEPTANCE][1], defaults(bundle))
    tasks = {task["task_key"]: task for task in job["tasks"]}
    seeded = parsed(tasks["seed"]["python_wheel_task"]["parameters"])
    for key, joined in (("join_classic", "lakejoin_join"), ("join_serverless", "lakejoin_join_serverless")):
        run = tasks[key]["run_job_task"]
        assert run["job_id"] == "${resources.jobs." + joined + ".id}", key
        assert [dependency["task_key"] for dependency in tasks[key]["depends_on"]] == ["seed"], "at once, after it"
        arguments = parsed(task_parameters(bundle, joined, "join", job_parameters=run["job_parameters"]))
        assert (arguments.warehouse, arguments.config) == (seeded.warehouse, seeded.seed + "/config.yml"), key
        assert arguments.warehouse != defaults(bundle)["catalog"] + "." + defaults(bundle)["schema"]
        assert volume(run["job_parameters"]["docs"]) == defaults(bundle)["docs"]
    for key in ("validate", "maintain"):
        arguments = parsed(tasks[key]["python_wheel_task"]["parameters"])
        assert (arguments.warehouse, arguments.config) == (seeded.warehouse, seeded.seed + "/config.yml"), key
    assert parsed(tasks["joined"]["python_wheel_task"]["parameters"]).warehouse == seeded.warehouse
    assert parsed(tasks["joined"]["python_wheel_task"]["parameters"]).seeded
    killed = parsed(tasks["killed_join"]["python_wheel_task"]["parameters"])
    assert (killed.warehouse, killed.killed_join) == (seeded.warehouse, seeded.seed), "more records, seeded there"
    assert {dependency["task_key"] for dependency in tasks["killed_join"]["depends_on"]} == {
        "join_classic",
        "join_serverless",
    }
    assert tasks["killed_join"]["max_retries"] >= 1 and "job_cluster_key" in tasks["killed_join"]
    assert [dependency["task_key"] for dependency in tasks["validate"]["depends_on"]] == ["killed_join"]
    assert {dependency["task_key"] for dependency in tasks["passed"]["depends_on"]} == set(tasks) - {"passed"}


def test_the_notification_check_fails_on_purpose_and_pages_no_one_unless_asked(bundle):
    _, job = jobs(bundle)[NOTIFICATION_CHECK]
    assert not set(TRIGGERS) & set(job)
    (task,) = resolved(job, defaults(bundle))["tasks"]
    assert parsed(task["python_wheel_task"]["parameters"]).fail
    assert resolved(job, defaults(bundle))["email_notifications"]["on_failure"] == []
    for target in bundle["targets"]:
        assert target_variables(bundle, target, GIVEN)["notification_check_to"] == [], target


def volume(path: str) -> str:
    """The Unity Catalog Volume a ``/Volumes/catalog/schema/volume/...`` path is on."""
    return "/".join(path.split("/")[:5])


def checklist_configs() -> dict[str, dict[str, Any]]:
    """The configs docs/databricks.md's checklist uploads, by where it uploads them (a ``databricks fs cp`` of a
    file the page shows in a titled YAML block)."""
    with open(os.path.join(REPO, "docs", "databricks.md"), encoding="utf-8") as handle:
        page = handle.read()
    shown = {
        title: yaml.safe_load(body) for title, body in re.findall(r'```yaml title="([^"]+)"\n(.*?)```', page, re.S)
    }
    copies = re.findall(r"databricks fs cp (\S+) dbfs:(\S+)", page)
    return {destination: shown[source] for source, destination in copies if source in shown}


def test_each_target_has_its_own_config_and_quality_volume(bundle):
    """dev's smoke test must not land in prod, nor dev's validation write into prod's quality Volume."""
    seen: dict[str, str] = {}
    for target in bundle["targets"]:
        values = target_variables(bundle, target, GIVEN)
        own = f"/Volumes/{values['catalog']}/{values['schema']}"
        assert volume(values["config"]) == own + "/config" and volume(values["docs"]) == own + "/quality", target
        for path in (values["config"], values["docs"]):
            assert seen.setdefault(volume(path), target) == target, (path, seen)


def test_each_target_s_config_in_the_checklist_lands_from_that_target_s_landing_volume(bundle):
    uploaded = checklist_configs()
    for target in bundle["targets"]:
        values = target_variables(bundle, target, GIVEN)
        config = uploaded[values["config"]]  # the checklist uploads one config per target, where the bundle reads it
        landing = f"/Volumes/{values['catalog']}/{values['schema']}/landing"
        assert {volume(relation["landing"]) for relation in config["relations"].values()} == {landing}, target


def test_the_join_job_ingests_and_joins_a_config_s_own_relations_from_their_landing_folders(bundle, spark, tmp_path):
    """The bundle follows the config: relations named orders and payments, each with its landing folder, joined by
    the join job's exact command (the variables pointed here), run after run."""
    from pipelines.cli import main
    from state.engines.deltars import DeltaRsReader

    landing = {name: tmp_path / "landing" / name for name in ("orders", "payments")}
    for folder in landing.values():
        folder.mkdir(parents=True)
    config = tmp_path / "pipeline.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "relations": {
                    "orders": {"id": "order_id", "event_time": "placed", "landing": str(landing["orders"])},
                    "payments": {"id": "payment_id", "event_time": "paid", "landing": str(landing["payments"])},
                },
                "predicate": "orders.customer = payments.customer",
                "engine": "delta-rs",
            }
        )
    )

    def land(name: str, file: str, rows: list[dict]) -> None:
        (landing[name] / file).write_text("".join(json.dumps(row) + "\n" for row in rows))

    land("orders", "o1.jsonl", [{"order_id": f"o{i}", "placed": i, "customer": f"c{i % 2}"} for i in range(4)])
    land("payments", "p1.jsonl", [{"payment_id": "p0", "paid": 5, "customer": "c0"}])
    warehouse = tmp_path / "wh"
    parameters = task_parameters(bundle, "lakejoin_join", "join", config=str(config))
    parameters[parameters.index("--warehouse") + 1] = str(warehouse)  # catalog.schema here is a folder
    assert main(parameters) == 0
    land("payments", "p2.jsonl", [{"payment_id": "p1", "paid": 6, "customer": "c1"}])
    assert main(parameters) == 0
    gold = DeltaRsReader().rows(str(warehouse / "gold" / "join_results")).to_pylist()
    assert sorted((row["orders_order_id"], row["payments_payment_id"]) for row in gold) == [
        ("o0", "p0"),
        ("o1", "p1"),
        ("o2", "p0"),
        ("o3", "p1"),
    ]


@pytest.mark.spark_delta
def test_an_acceptance_run_s_commands_pass_on_what_they_seeded_and_its_gold_check_fails_on_a_gold_that_is_not(
    bundle, spark, tmp_path, monkeypatch
):
    """The acceptance run's tasks in order, each by its command in the bundle on a local catalog: the seed, each join
    job's join task as its run_job_task's job parameters point it, the killed join (its first try dies before gold's
    write, its retry resumes that batch), validate (Data Docs in the quality folder), maintain, and the gold check,
    every one exiting 0 but the killed try; a retry with no batch to resume fails, and with a pair taken out of gold,
    the gold check fails."""
    from pipelines.cli import main
    from pipelines.commands import acceptance
    from state.faults import InjectedCrash
    from state.layout import Warehouse
    from tests.conftest import require_spark_delta

    def killed() -> None:  # the process must live on here: a crash that unwinds instead of exiting
        raise InjectedCrash(acceptance.KILLED_AT)

    require_spark_delta(spark)
    variables = {"catalog": "spark_catalog", "schema": "lj_seeded", "docs": str(tmp_path / "quality")}
    tasks = {
        task["task_key"]: task
        for task in resolved(jobs(bundle)[ACCEPTANCE][1], {**defaults(bundle), **variables})["tasks"]
    }

    def ran(key: str) -> int:
        return main(
            [RUN_VALUES.get(parameter, parameter) for parameter in tasks[key]["python_wheel_task"]["parameters"]]
        )

    spark.sql(f"CREATE SCHEMA lj_seeded_acceptance_join LOCATION '{tmp_path / 'schema'}'")
    try:
        assert ran("seed") == 0
        for key, joined in (("join_classic", "lakejoin_join"), ("join_serverless", "lakejoin_join_serverless")):
            given = tasks[key]["run_job_task"]["job_parameters"]
            assert main(task_parameters(bundle, joined, "join", job_parameters=given, **variables)) == 0, key
        assert tasks["killed_join"]["max_retries"] >= 1
        with monkeypatch.context() as patched:
            patched.setattr(acceptance, "_die", killed)
            with pytest.raises(InjectedCrash):
                ran("killed_join")
        assert ran("killed_join") == 0, "the retry resumes the batch cut short"
        assert ran("killed_join") == 1, "a retry with nothing cut short fails"
        for key in ("validate", "maintain", "joined"):
            assert ran(key) == 0, key
        assert os.listdir(tmp_path / "quality" / "acceptance" / "seeded" / "docs"), "Data Docs in the quality Volume"
        gold = Warehouse("spark_catalog.lj_seeded_acceptance_join").gold
        spark.sql(f"DELETE FROM {gold} WHERE _s_id = 's2'")
        assert ran("joined") == 1
    finally:
        spark.sql("DROP SCHEMA IF EXISTS lj_seeded_acceptance_join CASCADE")


# What Databricks refuses or ignores in a bundle, from its documentation and the CLI's source, as data: each rule a
# check of the bundle as written (the CLI cannot run here). Top-level and target permissions take three levels
# ("Allowed top-level permission levels are CAN_VIEW, CAN_MANAGE, and CAN_RUN", bundles/permissions); a duration
# warning is sent only for a RUN_DURATION_SECONDS rule at the notifications' own level ("If no rule for the
# RUN_DURATION_SECONDS metric is specified in the health field for the job, notifications are not sent", Jobs API);
# system.lakeflow holds "records from all workspaces in your account deployed in the same cloud region"
# (admin/system-tables/jobs); alerts are bundle resources from CLI 0.279.0, and take the target's run_as from 0.287.0.
TOP_LEVEL_PERMISSIONS = {"CAN_VIEW", "CAN_MANAGE", "CAN_RUN"}
OLDEST_CLI = (0, 287, 0)
# Node types that exist on one cloud only (AWS instance types, Azure VM sizes, GCP machine types)
ONE_CLOUD_NODE_TYPE = re.compile(r"^(?:[a-z]\d[a-z]*\.\w+|Standard_\w+|[a-z]\d[a-z]?-\w+-\d+)$")


def bundle_errors(bundle: dict[str, Any], resources: dict[str, Any]) -> list[str]:
    """What Databricks would refuse, or deploy to no effect, in ``bundle`` (databricks.yml) and ``resources`` (the
    merged ``resources`` of every file)."""
    errors = []
    for where, permissions in [("bundle", bundle.get("permissions") or [])] + [
        (f"target {name}", target.get("permissions") or []) for name, target in bundle["targets"].items()
    ]:
        errors += [
            f"{where}: permission level {permission['level']} is not one of {sorted(TOP_LEVEL_PERMISSIONS)}"
            for permission in permissions
            if permission["level"] not in TOP_LEVEL_PERMISSIONS
        ]
    version = re.fullmatch(r">=\s*(\d+)\.(\d+)\.(\d+)", str(bundle["bundle"].get("databricks_cli_version", "")))
    if version is None or tuple(int(part) for part in version.groups()) < OLDEST_CLI:
        errors.append(f"bundle: databricks_cli_version must be '>= {'.'.join(map(str, OLDEST_CLI))}' or later")
    for key, job in (resources.get("jobs") or {}).items():
        for level, holder in [(key, job), *((f"{key}.{task['task_key']}", task) for task in job.get("tasks", []))]:
            told = any(
                (holder.get(kind) or {}).get("on_duration_warning_threshold_exceeded")
                for kind in ("email_notifications", "webhook_notifications")
            )
            ruled = any(
                rule["metric"] == "RUN_DURATION_SECONDS" for rule in (holder.get("health") or {}).get("rules", [])
            )
            if told and not ruled:
                errors.append(f"{level}: a duration warning with no RUN_DURATION_SECONDS rule of its own is never sent")
        if "continuous" not in job:
            errors += [
                f"{key}.{task['task_key']}: no timeout_seconds (a hung task holds the job for ever)"
                for task in job.get("tasks", [])
                if "condition_task" not in task and not task.get("timeout_seconds")
            ]
        for cluster in job.get("job_clusters", []):
            node = cluster["new_cluster"]
            node = node if isinstance(node, dict) else bundle["variables"][_VARIABLE.fullmatch(node)[1]]["default"]
            if ONE_CLOUD_NODE_TYPE.match(str(node.get("node_type_id", ""))):
                errors.append(f"{key}: node type {node['node_type_id']} exists on one cloud only")
    for key, alert in (resources.get("alerts") or {}).items():
        if "system." in alert["query_text"] and "workspace_id" not in alert["query_text"]:
            errors.append(f"alert {key}: a system table read without workspace_id counts every workspace's runs")
    return errors


def merged_resources(bundle: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for path in [BUNDLE, *included(bundle)]:
        for kind, items in (load(path).get("resources") or {}).items():
            merged.setdefault(kind, {}).update(items)
    return merged


def test_the_bundle_breaks_none_of_databricks_rules(bundle):
    assert bundle_errors(bundle, merged_resources(bundle)) == []


# What the rules found in the bundle of 979df51, as it stood (each piece as written there)
MAINS_BUNDLE = {
    "bundle": {"name": "lakejoin"},
    "variables": {"job_cluster": {"default": {"spark_version": "18.x-scala2.13", "node_type_id": "i3.xlarge"}}},
    "targets": {"prod": {"permissions": [{"level": "CAN_MANAGE_RUN", "group_name": "ops"}]}},
}
MAINS_RESOURCES = {
    "jobs": {
        "lakejoin_join": {
            "email_notifications": {"on_duration_warning_threshold_exceeded": ["a@example.com"]},
            "job_clusters": [{"job_cluster_key": "lakejoin", "new_cluster": "${var.job_cluster}"}],
            "tasks": [
                {
                    "task_key": "join",
                    "health": {"rules": [{"metric": "RUN_DURATION_SECONDS", "op": "GREATER_THAN", "value": 600}]},
                }
            ],
        }
    },
    "alerts": {
        "lakejoin_join_task_failed": {
            "query_text": "SELECT count(*) FROM system.lakeflow.job_task_run_timeline WHERE job_id = '1'"
        }
    },
}


def test_the_rules_find_each_fault_of_the_bundle_as_it_stood():
    assert bundle_errors(MAINS_BUNDLE, MAINS_RESOURCES) == [
        "target prod: permission level CAN_MANAGE_RUN is not one of ['CAN_MANAGE', 'CAN_RUN', 'CAN_VIEW']",
        "bundle: databricks_cli_version must be '>= 0.287.0' or later",
        "lakejoin_join: a duration warning with no RUN_DURATION_SECONDS rule of its own is never sent",
        "lakejoin_join.join: no timeout_seconds (a hung task holds the job for ever)",
        "lakejoin_join: node type i3.xlarge exists on one cloud only",
        "alert lakejoin_join_task_failed: a system table read without workspace_id counts every workspace's runs",
    ]
    for node in ("m5d.xlarge", "Standard_D4ds_v5", "n2-highmem-4", "i3.xlarge"):
        assert ONE_CLOUD_NODE_TYPE.match(node), node


def test_a_join_try_is_retried_past_its_dead_try_s_lease_and_a_lasting_failure_fails_every_try(bundle):
    """Databricks retries every failed try, whatever the exit code: a lost cluster and a timeout are cured by one; a
    lasting failure must fail the retry too (a definition or fail rule refuses again; a refused file is reported
    again by --refusals-since). A killed try holds the lease up to LEASE_SECONDS: the retry waits it out."""
    from state.log.lease import LEASE_SECONDS

    for key in ("lakejoin_join", "lakejoin_join_serverless"):
        join = wheel_tasks(as_run(resolved(jobs(bundle)[key][1], defaults(bundle))))["join"]
        assert join["max_retries"] >= 1 and join["retry_on_timeout"] is True, key
        assert 0 < join["timeout_seconds"] and join["notification_settings"] == {"alert_on_last_attempt": True}, key
        assert join["email_notifications"]["on_failure"] == defaults(bundle)["notify_on_failure"], key
        arguments = parsed(join["python_wheel_task"]["parameters"])
        assert arguments.wait > LEASE_SECONDS, key
        assert "{{job.start_time.iso_datetime}}" in join["python_wheel_task"]["parameters"], key


def test_a_retried_join_try_fails_like_the_try_that_refused_a_file(bundle, spark, tmp_path):
    """The first try refuses a file for good (exit 2) and records it; Databricks retries it, and the retry, which
    takes the file no more, must fail too, or the run would end SUCCESS and tell nobody. A later run of the job
    (another start time) is not failed by it."""
    from datetime import datetime, timezone

    from pipelines.cli import main

    landing = tmp_path / "landing"
    for name in ("orders", "payments"):
        (landing / name).mkdir(parents=True)
    (landing / "orders" / "o1.jsonl").write_text(json.dumps({"order_id": "o1", "placed": 1, "customer": "c"}) + "\n")
    (landing / "payments" / "bad.parquet").write_text("not parquet")
    config = tmp_path / "pipeline.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "relations": {
                    "orders": {"id": "order_id", "event_time": "placed", "landing": str(landing / "orders")},
                    "payments": {"id": "payment_id", "event_time": "paid", "landing": str(landing / "payments")},
                },
                "predicate": "orders.customer = payments.customer",
                "engine": "delta-rs",
            }
        )
    )
    started = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    parameters = task_parameters(bundle, "lakejoin_join", "join", config=str(config))
    parameters[parameters.index("--warehouse") + 1] = str(tmp_path / "wh")
    parameters[parameters.index(RUN_VALUES["{{job.start_time.iso_datetime}}"])] = started
    assert main(parameters) == 2  # the first try
    assert main(parameters) == 2  # its retry: the file recorded as refused since the job run started
    parameters[parameters.index(started)] = datetime.now(timezone.utc).isoformat()
    assert main(parameters) == 0  # the next run of the job
