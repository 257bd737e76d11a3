"""The documentation site builds in strict mode (a broken link, a missing anchor or a stale API reference fails it),
and its config reference comes from the settings' own definitions; no page outgrows an evening's reading."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields

import pytest

from state.config import Config, Expectations, reference
from state.join.relations import ChangeSpec, RelationSpec
from state.settings import documented
from tests.helpers import REPO


def test_the_site_builds_in_strict_mode_with_the_generated_references(tmp_path):
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr[-3000:]
    config_page = (site / "config" / "index.html").read_text(encoding="utf-8")
    assert "relations.NAME.idle_after" in config_page and "bronze_ts_plausible" in config_page
    assert "lakejoin:config-reference" not in config_page
    api_page = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "foreach_batch" in api_page and "Declare that no record of" in api_page  # from the docstrings
    assert (site / "plots" / "peers.png").is_file()


@pytest.mark.parametrize("settings", [Config, RelationSpec, ChangeSpec, Expectations], ids=lambda cls: cls.__name__)
def test_every_setting_carries_its_reference_text(settings):
    assert [each.doc for each in documented(settings)] and all(each.doc.strip() for each in documented(settings))


def test_the_reference_names_every_key_a_config_may_hold():
    text = reference()
    assert all(f"`{field.name}`" in text for field in fields(Config))
    assert all(f"`relations.NAME.{field.name}`" in text for field in fields(RelationSpec))
    assert all(f"`relations.NAME.changes.{key}`" in text for key in ("op", "sequence_by", *ChangeSpec().values))
    assert all(f"`expectations.{field.name}`" in text for field in fields(Expectations))


DOCS = os.path.join(REPO, "docs")
LONGEST = {"docs/design.md": 40_000, "docs/benchmarks.md": 60_000, "docs/changelog.md": 60_000}


@pytest.mark.parametrize(
    "page", ["README.md", *(f"docs/{name}" for name in sorted(os.listdir(DOCS)) if name.endswith(".md"))]
)
def test_a_page_is_short_enough_to_read_in_one_sitting(page):
    """No page over 30 KB: the design 40 KB, the benchmarks page and the changelog (tables and history) 60 KB."""
    assert os.path.getsize(os.path.join(REPO, page)) <= LONGEST.get(page, 30_000)


def test_the_whole_of_the_docs_reads_in_an_evening():
    """230 KB in all, the generated benchmarks page, the changelog and the glossary included (220 KB before the glossary
    and release notes): one place for each fact, linked from the others, the design's history in the changelog."""
    total = sum(os.path.getsize(os.path.join(DOCS, name)) for name in os.listdir(DOCS) if name.endswith(".md"))
    assert total <= 230_000, f"docs/ holds {total:,} bytes of Markdown"
