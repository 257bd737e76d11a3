"""One process per job and warehouse: ``run`` (and ``reset``) exclude each other, ``ingest`` queues.

On a folder the lock is an OS file lock (``flock``) on ``<warehouse>/_lakejoin_<job>.lock``: the kernel releases it
when its holder exits or dies, even by ``kill -9``, so a crashed run never leaves a stale lock behind. A Unity
Catalog schema has no file to lock: there it is a lease in a table of the schema (state/log/lease.py), which a run
proves still held before each batch's writes and commit (``Held.check``). Object-store folders (``s3://``, ``abfss://``,
…) have neither: there the scheduler must not overlap runs (the bundle's jobs set ``max_concurrent_runs: 1``).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import IO, TYPE_CHECKING, Protocol

from state.errors import WarehouseBusy
from state.layout import is_catalog_schema
from state.log.lease import Lease, lease_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JOIN, INGEST = "run", "ingest"
POLL_SECONDS = 0.2


def is_local(root: str) -> bool:
    """A folder on this machine's filesystems (where ``flock`` works), not a URI or a catalog schema."""
    return "://" not in root and not is_catalog_schema(root)


def lock_path(root: str, job: str) -> str:
    return os.path.join(root, f"_lakejoin_{job}.lock")


class Held(Protocol):
    """A lock held: ``check`` proves it still is, before a batch writes and before it commits."""

    def check(self) -> None: ...


class _Unexpiring:
    """A file lock, held until its holder ends (or, on an object store, no lock at all): nothing to prove."""

    def check(self) -> None:
        return None


@contextmanager
def hold(root: str, job: str, wait_seconds: float | None = 0.0, spark: SparkSession | None = None) -> Iterator[Held]:
    """Hold ``job``'s lock on the warehouse at ``root``, waiting up to ``wait_seconds`` (None: as long as it takes); a
    catalog schema's lease needs the ``spark`` session its tables are reached through.

    Raises ``WarehouseBusy`` naming the holder when the wait runs out.
    """
    if is_catalog_schema(root) and spark is not None:
        from state.engines.spark_delta import session_apart

        # on a session apart: a renewal never waits for, nor is mistaken for, a commit of the run's on ``spark``
        lease = Lease(session_apart(spark), lease_table(root), job)
        lease.take(wait_seconds)
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
        handle.truncate()
        handle.write(
            f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
        )
        handle.flush()
        yield _Unexpiring()


def holder(root: str, job: str) -> str | None:
    """Who holds ``job``'s lock right now (pid, host, since when), or None when nobody does."""
    path = lock_path(root, job)
    if not is_local(root) or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return handle.read().strip() or "another process"
    return None


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
                who = handle.read().strip() or "another process"
                raise WarehouseBusy(
                    f"another 'lakejoin {job}' holds {root} ({who}); this one did nothing: "
                    "retry when it is done, or pass --wait SECONDS to queue behind it"
                ) from None
            time.sleep(POLL_SECONDS)
