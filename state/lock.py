"""One process per job and warehouse: ``run`` (and ``reset``) exclude each other, ``ingest`` queues.

The lock is an OS file lock (``flock``) on ``<warehouse>/_lakejoin_<job>.lock``: the kernel releases it
when its holder exits or dies, even by ``kill -9``, so a crashed run never leaves a stale lock behind.
Object-store warehouses (``s3://``, ``abfss://``, …) have no such lock: there the scheduler must not
overlap runs (the bundle's jobs set ``max_concurrent_runs: 1``).
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import IO

from state.errors import WarehouseBusy
from state.layout import is_catalog_schema

JOIN, INGEST = "run", "ingest"
POLL_SECONDS = 0.2


def is_local(root: str) -> bool:
    """A folder on this machine's filesystems (where ``flock`` works), not a URI or a catalog schema."""
    return "://" not in root and not is_catalog_schema(root)


def lock_path(root: str, job: str) -> str:
    return os.path.join(root, f"_lakejoin_{job}.lock")


@contextmanager
def hold(root: str, job: str, wait_seconds: float | None = 0.0) -> Iterator[None]:
    """Hold ``job``'s lock on the warehouse at ``root``, waiting up to ``wait_seconds`` (None: as long as it takes).

    Raises ``WarehouseBusy`` naming the holder when the wait runs out.
    """
    if not is_local(root):
        yield
        return
    os.makedirs(root, exist_ok=True)
    with open(lock_path(root, job), "a+", encoding="utf-8") as handle:
        _acquire(handle, job, root, wait_seconds)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC")
        handle.flush()
        yield


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
