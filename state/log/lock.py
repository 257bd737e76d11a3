"""One process per job and warehouse: ``run`` (and ``reset``) exclude each other, ``ingest`` queues.

On a folder the lock is an OS file lock (``flock``) on ``<warehouse>/_lakejoin_<job>.lock``: the kernel releases it
when its holder exits or dies, even by ``kill -9``, so a crashed run never leaves a stale lock behind. A Unity
Catalog schema has no file to lock: there it is a lease in a table of the schema (state/log/lease.py), which a run
proves still held before each batch's writes and commit (``Held.check``). Object-store folders (``s3://``, ``abfss://``,
…) have neither: there the scheduler must not overlap runs (the bundle's jobs set ``max_concurrent_runs: 1``).

Each taking of a lock has an epoch, one more than the taking before it (the lock file's second line, the lease row's
``epoch``). A pipeline records the takings it makes and sees (``Takings``): a taking that finds no other taking of
either lock since its own last one (``Held.unchanged``) knows that no lakejoin writer has written the warehouse
meanwhile, so what the pipeline saw of its tables' logs then is still their newest (docs/design.md section 5.3).
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, TYPE_CHECKING, Protocol

from state.errors import LakejoinError, WarehouseBusy
from state.layout import is_catalog_schema
from state.log.lease import JOBS, Lease, first_epoch, lease_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JOIN, INGEST = "run", "ingest"
POLL_SECONDS = 0.2
# How long a pipeline keeps what it saw of its tables across takings that find nothing else taken: well within the
# week Delta keeps the files an older version reads (VACUUM's default retention, and lakejoin's least), so a version
# kept that long still reads after a foreign OPTIMIZE and VACUUM (Databricks' predictive optimization), which take no
# lock.
KEPT_SECONDS = 3600
EPOCH = "epoch "
RELEASED = "released"  # the lock file's last line once its holder let it go: read without taking the file's lock
# The locks each thread holds: a thread that takes one it holds would wait on itself for ever.
_HELD = threading.local()


def is_local(root: str) -> bool:
    """A folder on this machine's filesystems (where ``flock`` works), not a URI or a catalog schema."""
    return "://" not in root and not is_catalog_schema(root)


def lock_path(root: str, job: str) -> str:
    return os.path.join(root, f"_lakejoin_{job}.lock")


class Held(Protocol):
    """A lock held: ``check`` proves it still is, before a batch writes and before it commits. ``unchanged``: no other
    taking of either of the warehouse's locks came since the last one the taker's ``Takings`` recorded."""

    unchanged: bool

    def check(self) -> None: ...


@dataclass(frozen=True)
class _Unexpiring:
    """A file lock, held until its holder ends (or, on an object store, no lock at all): nothing to prove."""

    unchanged: bool = False

    def check(self) -> None:
        return None


@dataclass
class Takings:
    """The takings of one warehouse's locks a pipeline has made or seen, by epoch: the holder of what the pipeline
    keeps of its tables' logs between calls. Without a lock there is no epoch, so an object-store folder's takings are
    never unchanged."""

    seen: dict[str, int] = field(default_factory=dict)  # job -> the epoch of its last taking made or seen
    holding: set[str] = field(default_factory=set)
    since: float = float("-inf")  # when (time.monotonic) what is kept was first seen

    def took(self, job: str, epoch: int, others: dict[str, int | None]) -> bool:
        """Record this pipeline's taking of ``job`` at ``epoch``, the other locks' epochs as seen then (None: held by
        another, or never seen): whether nothing else took a lock since its last taking, and what it keeps is young
        enough to read (``KEPT_SECONDS``). Otherwise what it kept is forgotten, and kept again from now."""
        unchanged = (
            time.monotonic() - self.since < KEPT_SECONDS
            and self.seen.get(job) == epoch - 1
            and all(
                other in self.holding or (seen is not None and self.seen.get(other) == seen)
                for other, seen in others.items()
            )
        )
        if not unchanged:
            self.since = time.monotonic()
        self.holding.add(job)
        self._see({job: epoch} | {other: seen for other, seen in others.items() if other not in self.holding})
        return unchanged

    def released(self, job: str) -> None:
        self.holding.discard(job)

    def expired(self) -> bool:
        """Whether what is kept is older than ``KEPT_SECONDS``, for a holder that keeps its lock that long (``run
        --follow``); if so it is kept again from now, once the holder has forgotten it."""
        if time.monotonic() - self.since < KEPT_SECONDS:
            return False
        self.since = time.monotonic()
        return True

    def peek(self, root: str, job: str) -> bool:
        """Whether nothing took ``job``'s lock since this pipeline last saw it, asked of the lock file without taking it
        (a catalog's lease would cost a read of its table: there, as on an object store, the answer is no)."""
        epoch = _free_epoch(root, job) if is_local(root) else None
        unchanged = epoch is not None and self.seen.get(job) == epoch
        self._see({job: epoch})
        return unchanged

    def _see(self, epochs: dict[str, int | None]) -> None:
        for job, epoch in epochs.items():
            if epoch is None:
                self.seen.pop(job, None)
            else:
                self.seen[job] = epoch


@contextmanager
def hold(
    root: str,
    job: str,
    wait_seconds: float | None = 0.0,
    spark: SparkSession | None = None,
    takings: Takings | None = None,
) -> Iterator[Held]:
    """Hold ``job``'s lock on the warehouse at ``root``, waiting up to ``wait_seconds`` (None: as long as it takes); a
    catalog schema's lease needs the ``spark`` session its tables are reached through. ``takings``: the holder's record
    of the locks' takings, which says whether the lock held is ``unchanged``.

    Raises ``WarehouseBusy`` naming the holder when the wait runs out.
    """
    takings = Takings() if takings is None else takings
    held_here = _HELD.__dict__.setdefault("locks", set())
    if (root, job) in held_here:
        raise LakejoinError(
            f"this thread already holds the {job} lock of {root} (is a callback of the call under way calling "
            "lakejoin?): make that call once the one under way has returned"
        )
    held_here.add((root, job))
    try:
        with _taken(root, job, wait_seconds, spark, takings) as held:
            yield held
    finally:
        held_here.discard((root, job))
        takings.released(job)


@contextmanager
def _taken(
    root: str, job: str, wait_seconds: float | None, spark: SparkSession | None, takings: Takings
) -> Iterator[Held]:
    others = [other for other in JOBS if other != job]
    if is_catalog_schema(root) and spark is not None:
        from state.engines.spark_delta import session_apart

        # on a session apart: a renewal never waits for, nor is mistaken for, a commit of the run's on ``spark``
        lease = Lease(session_apart(spark), lease_table(root), job)
        epochs = lease.take(wait_seconds)
        lease.unchanged = takings.took(job, epochs[job], {other: epochs.get(other) for other in others})
        try:
            yield lease
        finally:
            lease.release()
        return
    if not is_local(root):
        yield _Unexpiring()
        return
    os.makedirs(root, exist_ok=True)
    with open(lock_path(root, job), "a+", encoding="utf-8") as handle:
        _acquire(handle, job, root, wait_seconds)
        handle.seek(0)
        last = _epoch(handle.read())
        epoch = first_epoch() if last is None else last + 1
        who = f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
        _rewrite(handle, f"{who}\n{EPOCH}{epoch}\n")
        for other in others:
            _made(root, other)
        seen = {other: None if other in takings.holding else _free_epoch(root, other) for other in others}
        try:
            yield _Unexpiring(takings.took(job, epoch, seen))
        finally:
            _rewrite(handle, f"{who}\n{EPOCH}{epoch}\n{RELEASED}\n")


def _made(root: str, job: str) -> None:
    """``job``'s lock file, released at a random epoch, where there is none yet: then a pipeline's next taking of the
    other lock can find this one as it left it, before it is first taken."""
    try:
        made = os.open(lock_path(root, job), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    with os.fdopen(made, "w", encoding="utf-8") as handle:
        handle.write(f"nobody\n{EPOCH}{first_epoch()}\n{RELEASED}\n")


def _rewrite(handle: IO[str], text: str) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(text)
    handle.flush()


def _epoch(text: str) -> int | None:
    """The epoch a lock file records of its last taking: None before the first (or in a file written before epochs,
    or half written)."""
    line = next((line for line in text.splitlines() if line.startswith(EPOCH)), None)
    return None if line is None else int(line.removeprefix(EPOCH))


def _free_epoch(root: str, job: str) -> int | None:
    """The epoch of ``job``'s last taking when its holder has let it go; None while it is held (or its holder died
    holding it, or the file is half written, or not there: the first taking's epoch is random). Read without taking the
    file's lock, which would make a taker that does not wait find it busy."""
    try:
        with open(lock_path(root, job), encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    return _epoch(text) if text.rstrip().endswith(RELEASED) else None


def holder(root: str, job: str) -> str | None:
    """Who holds ``job``'s lock right now (pid, host, since when), or None when nobody does."""
    path = lock_path(root, job)
    if not is_local(root) or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _who(handle.read())
    return None


def _who(text: str) -> str:
    """The holder a lock file names: its first line."""
    return text.strip().split("\n", 1)[0] or "another process"


def _acquire(handle: IO[str], job: str, root: str, wait_seconds: float | None) -> None:
    if wait_seconds is None:
        fcntl.flock(handle, fcntl.LOCK_EX)
        return
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.seek(0)
                who = _who(handle.read())
                raise WarehouseBusy(
                    f"another 'lakejoin {job}' holds {root} ({who}); this one did nothing: "
                    "retry when it is done, or pass --wait SECONDS to queue behind it"
                ) from None
            time.sleep(POLL_SECONDS)
