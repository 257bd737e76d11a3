"""MkDocs hooks: what the site takes from the code rather than from hand-written pages, so the two cannot disagree.

- ``config.md``'s marker line becomes the reference of every setting, from the config's own definitions
  (``state.config.reference``) and the rules of the suites (``expectations.rules.reference``).
- The benchmark plots ``benchmarks/`` writes to ``benchmarks/results/*.png`` are served as ``plots/<name>.png``.
"""

from __future__ import annotations

import glob
import os
import sys

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_REFERENCE = "<!-- lakejoin:config-reference -->"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for plot in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.png"))):
        files.append(File.generated(config, f"plots/{os.path.basename(plot)}", abs_src_path=plot))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if CONFIG_REFERENCE not in markdown:
        return markdown
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from expectations import rules
    from state import config

    return markdown.replace(
        CONFIG_REFERENCE, f"{config.reference()}### Rules and their default policies\n\n{rules.reference()}"
    )
