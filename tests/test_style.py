"""The code's style is the tools', not a reviewer's: ``ruff format`` and ``ruff check`` (pyproject.toml's rules, lines of
120) leave every file as it is."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_ruff_finds_nothing_to_change(command):
    done = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
