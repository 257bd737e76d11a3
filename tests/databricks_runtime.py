"""A classic session as a Databricks runtime gives it to a job, as far as lakejoin may rely on it: the runtime's
variable set, and Delta's internals refused to Python. A runtime ships Databricks' own Delta, whose internal classes
(``org.apache.spark.sql.delta.*``) and their signatures are no contract, so here any method called on an object of
that package, and any class of it named through py4j, raises ``RefusedOnDatabricks``. Delta's public API
(``io.delta.tables``, SQL, reads and writes) is left alone."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# The scenarios that start Spark where users run it (a Spark Connect server with the serverless client, a standalone
# cluster) and every kind of join under each emulation: each costs minutes (over Spark Connect a batch costs tens of
# seconds, issue 87's fixed cost), so they run on demand, beside the suite, not in it
WHERE_IT_RUNS = "LAKEJOIN_WHERE_IT_RUNS"
ON_DEMAND = pytest.mark.skipif(
    not os.environ.get(WHERE_IT_RUNS),
    reason=f"starts Spark where users run it, or joins every kind under the Databricks emulations: set {WHERE_IT_RUNS}=1 (tens of minutes)",
)
DELTA_INTERNALS = "org.apache.spark.sql.delta"
RUNTIME = "DATABRICKS_RUNTIME_VERSION"
STATIC = "z:"  # py4j's prefix of a class's target, for its static methods


class RefusedOnDatabricks(Exception):
    """What calling into a runtime's Delta internals amounts to: no promise that it works."""


@contextmanager
def databricks_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The process as a Databricks job's: yields the list of what was refused (each refusal also raises)."""
    from py4j import java_gateway

    refused: list[str] = []
    classes: dict[str, str] = {}
    call, named = java_gateway.JavaMember.__call__, java_gateway.JavaPackage.__getattr__

    def class_of(target: java_gateway.JavaObject) -> str:
        if target._target_id not in classes:
            get_class = java_gateway.JavaMember("getClass", target, target._target_id, target._gateway_client)
            type_of = call(get_class)
            get_name = java_gateway.JavaMember("getName", type_of, type_of._target_id, type_of._gateway_client)
            classes[target._target_id] = call(get_name)
        return classes[target._target_id]

    def guarded_call(self: java_gateway.JavaMember, *args: object) -> object:
        if isinstance(self.container, java_gateway.JavaObject) and class_of(self.container).startswith(DELTA_INTERNALS):
            refused.append(f"{class_of(self.container)}.{self.name}")
            raise RefusedOnDatabricks(f"{refused[-1]}: Delta's internals are no contract on a Databricks runtime")
        if self.target_id.startswith(STATIC + DELTA_INTERNALS):  # a static method of a class of the package
            refused.append(f"{self.target_id[len(STATIC) :]}.{self.name}")
            raise RefusedOnDatabricks(f"{refused[-1]}: Delta's internals are no contract on a Databricks runtime")
        return call(self, *args)

    def guarded_name(self: java_gateway.JavaPackage, name: str) -> object:
        if f"{self._fqn}.{name}".startswith(DELTA_INTERNALS):
            refused.append(f"{self._fqn}.{name}")
            raise RefusedOnDatabricks(f"{refused[-1]}: Delta's internals are no contract on a Databricks runtime")
        return named(self, name)

    monkeypatch.setenv(RUNTIME, "18.0")
    monkeypatch.setattr(java_gateway.JavaMember, "__call__", guarded_call)
    monkeypatch.setattr(java_gateway.JavaPackage, "__getattr__", guarded_name)
    yield refused
