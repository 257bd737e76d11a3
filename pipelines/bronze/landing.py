"""Files that land in folders: found by listing, each known by its path, then by its content.

A relation's ``landing`` folder (config) is listed by every ``lakejoin run``, whose batches land the files new there
(pipelines/batch/land.py); ``lakejoin ingest --landing`` ingests them in one call (pipelines/bronze/ingest.py; Auto
Loader finds them on Databricks). Either way a file is read once on the driver first, for its digest and its places. A
file is new when neither its path nor, once hashed, its content was landed or ingested before (the batch log and the
ingest log say which), so a file is hashed once, and a copy under another name adds nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.bronze.parse import FORMATS, check_format, csv_header, format_of, stored_columns
from state.engines.table import Table
from state.errors import FileRefused, LakejoinError
from state.join.relations import Relation
from state.layout import Warehouse

BLOCK = 1 << 20


def on_databricks() -> bool:
    return "DATABRICKS_RUNTIME_VERSION" in os.environ


@dataclass
class Known:
    """The files landed or ingested before (or refused for good): by path, whether refused; by content, per relation."""

    paths: dict[str, bool] = field(default_factory=dict)  # path -> refused
    digests: dict[str, dict[str, str]] = field(default_factory=dict)  # relation -> digest -> the path that brought it

    def add(self, relation: str, path: str, digest: str | None, refused: bool) -> None:
        self.paths[path] = self.paths.get(path, True) and refused
        if digest is not None and not refused:
            self.digests.setdefault(relation, {}).setdefault(digest, path)


def known_files(ingest_log: Table, batches: Table) -> Known:
    """Every file the ingest log and the batch log name (what grows here is one row per file, on the driver)."""
    known = Known()
    ingested = ingest_log.rows(where="source_version IS NULL AND sha256 IS NOT NULL")
    for row in (
        [] if ingested is None else ingested.select(["relation", "source_file", "sha256", "refused"]).to_pylist()
    ):
        known.add(row["relation"], row["source_file"], row["sha256"], row["refused"] is not None)
    logged = batches.rows()
    for files in [] if logged is None else logged.column("files").to_pylist():
        for file in files or []:
            known.add(file["relation"], file["path"], file["sha256"], file["refused"] is not None)
    return known


@dataclass(frozen=True)
class Found:
    """A new file of a relation's landing folder, read once on the driver: its content's digest, and how many rows
    it holds at most (a Parquet file's footer count; a text file's lines), or why it is refused as a whole."""

    relation: str
    path: str
    bytes: int
    sha256: str
    rows: int  # at most: a Parquet file's rows, a text file's lines (and so the places in the arrival order it takes)
    refused: FileRefused | None = None


def found_files(landings: dict[Relation, str], known: Known) -> Iterable[Found | FileRefused]:
    """The files new in each relation's landing folder, in name order, relation by relation; a file that cannot be
    read now comes as its refusal, not lasting (it is looked at again next time)."""
    for rel, landing in landings.items():
        for path in listed(landing):
            if path in known.paths:
                continue
            try:
                yield examined(rel.name, path)
            except OSError as exc:
                yield FileRefused(f"cannot ingest {path}: cannot read it ({exc.strerror or exc})", lasting=False)


def examined(relation: str, path: str, shown: str | None = None) -> Found:
    """``path`` read once: its SHA-256 and, for text, its lines; its form checked (a lasting refusal when wrong, naming
    the file as ``shown``, by default its path)."""
    digest, lines = hashlib.sha256(), Lines()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)
            lines.add(block)
    fmt = format_of(path)
    refused = None
    rows = lines.count
    try:
        check_format(path, fmt)
        if fmt == "parquet":
            metadata = pq.read_metadata(path)
            rows = metadata.num_rows
            stored_columns(metadata.schema.to_arrow_schema().names)
        elif fmt == "csv":
            stored_columns(list(csv_header(path)))
    except FileRefused as exc:
        refused = FileRefused(f"cannot ingest {shown or path}: {exc}", exc.lasting)
    except (pa.ArrowException, OSError) as exc:
        refused = FileRefused(
            f"cannot ingest {shown or path}: not a readable Parquet file ({str(exc).splitlines()[0]})"
        )
    return Found(relation, path, lines.size, digest.hexdigest(), rows, refused)


@dataclass
class Lines:
    """The lines of a text file as Spark's text reader splits them (at ``\\r\\n``, ``\\r`` or ``\\n``; nothing after a
    last separator), counted block by block: a line's number in the file is at most ``count``."""

    separators: int = 0
    size: int = 0
    last: bytes = b""

    def add(self, block: bytes) -> None:
        self.separators += (
            block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n") - (self.last == b"\r" and block[:1] == b"\n")
        )
        self.size += len(block)
        self.last = block[-1:]

    @property
    def count(self) -> int:
        return self.separators + (self.size > 0 and self.last not in (b"\n", b"\r"))


def require_landing(landing: str, relation: str) -> None:
    """Refuse a landing folder that is not there: a mistyped path would otherwise ingest nothing, run after run."""
    if not os.path.isdir(landing):
        raise LakejoinError(
            f"{relation}'s landing folder {landing} does not exist: create it, or correct the path (config "
            f"relations.{relation}.landing, or --landing)"
        )


def listed(landing: str) -> list[str]:
    """Files under ``landing`` with an extension ingest reads, by absolute path in name order (hidden and ``_`` entries
    skipped)."""
    found = []
    for folder, subfolders, files in os.walk(os.path.abspath(landing)):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith(("_", ".")))
        found += [os.path.join(folder, name) for name in files if not name.startswith(("_", ".")) and readable(name)]
    return sorted(found)


def readable(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in FORMATS


def default_checkpoint(landing: str, warehouse: Warehouse, rel: Relation) -> str:
    """Auto Loader's checkpoint when none is given: in the landing folder, one per warehouse and relation, so that two
    warehouses fed from one folder (a bundle's dev and prod targets) each find every file."""
    return os.path.join(
        landing, "_lakejoin_checkpoint", re.sub(r"[^A-Za-z0-9_.-]+", "_", warehouse.root.strip("/")), rel.name
    )
