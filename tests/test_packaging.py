"""The wheel's requirements: ranges that the Databricks runtimes the bundle names already satisfy, so a job installs no
library over the runtime's own copy; the versions tested here pinned apart (constraints.txt), for the local install.
A release: one version, printed by ``lakejoin --version``, with its dated changelog entry and what it was tested with."""

from __future__ import annotations

import os
import re
import tomllib
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement

from pipelines.cli import main
from tests.helpers import REPO

# The libraries each runtime ships, from its release notes' "Installed Python libraries": Databricks Runtime 18 LTS
# (https://docs.databricks.com/aws/en/release-notes/runtime/18, the bundle's job_cluster spark_version 18.x) and
# serverless environment 5 (https://docs.databricks.com/aws/en/release-notes/serverless/environment-version/five, the
# bundle's serverless_environment), as Databricks' own github.com/databricks/environments transcribes them
# (python/dbr/18.x-scala2.13/constraints.txt, python/serverless/serverless-v5/pyproject.toml). None: not shipped.
RUNTIMES = {
    "Databricks Runtime 18 LTS": {
        "deltalake": "1.1.4",
        "pyarrow": "21.0.0",
        "pandas": "2.2.3",
        "pyyaml": "6.0.2",
        "great-expectations": None,
    },
    "serverless environment 5": {
        "deltalake": "1.1.4",
        "pyarrow": "21.0.0",
        "pandas": "2.2.3",
        "pyyaml": "6.0.2",
        "great-expectations": None,
    },
}


def requirements() -> dict[str, Requirement]:
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        return {
            (req := Requirement(text)).name.lower(): req for text in tomllib.load(handle)["project"]["dependencies"]
        }


def constraints() -> dict[str, str]:
    with open(os.path.join(REPO, "constraints.txt"), encoding="utf-8") as handle:
        return dict(
            re.fullmatch(r"([\w.-]+)==(\S+)", line.strip()).groups()
            for line in handle
            if line.strip() and not line.startswith("#")
        )


def test_the_wheel_installs_nothing_over_what_a_runtime_the_bundle_names_ships():
    for runtime, shipped in RUNTIMES.items():
        assert set(shipped) == set(requirements()), runtime
        for name, release in shipped.items():
            if release is not None:
                assert requirements()[name].specifier.contains(release), (
                    runtime,
                    name,
                    release,
                    str(requirements()[name].specifier),
                )


def test_the_tested_versions_are_pinned_within_the_ranges_and_installed_here():
    pinned = constraints()
    assert set(pinned) == set(requirements())
    for name, release in pinned.items():
        assert requirements()[name].specifier.contains(release), (name, release)
        assert version(name) == release, name
    with open(os.path.join(REPO, "Makefile"), encoding="utf-8") as handle:
        assert "--constraint constraints.txt --editable" in handle.read()


def test_the_version_is_set_in_one_place_and_lakejoin_version_prints_it(capsys):
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as handle:
        assert version("lakejoin") == tomllib.load(handle)["project"]["version"]
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert (exited.value.code, capsys.readouterr().out) == (0, f"lakejoin {version('lakejoin')}\n")


def test_the_changelog_dates_the_installed_release_and_names_the_versions_it_was_tested_with():
    with open(os.path.join(REPO, "docs", "changelog.md"), encoding="utf-8") as handle:
        text = handle.read()
    heading = re.search(rf"^## {re.escape(version('lakejoin'))} — \d{{4}}-\d{{2}}-\d{{2}}$", text, re.MULTILINE)
    assert heading is not None, f"no '## {version('lakejoin')} — YYYY-MM-DD' heading in docs/changelog.md"
    release = text[heading.end() :].split("\n## ", 1)[0]
    for package in ("pyspark", "delta-spark", "deltalake", "great-expectations"):
        assert f"{package} {version(package)}" in release, package
