"""The lock of a warehouse in a Unity Catalog schema, which has no file to ``flock``: a lease per job.

``<catalog>.<schema>.silver_leases`` holds one row per job (``run``, ``ingest``): its holder, an epoch that grows
with every taking, and when the lease lapses. The table and its rows are made in one commit (CREATE TABLE AS
SELECT), so two runs making it at once cannot both add a row. A lease is taken by a conditional UPDATE (free or
lapsed → this holder, epoch + 1): of two runs racing for it, Delta's conflict detection lets one commit (two
transactions rewriting the same row conflict, whether Delta tracks files or rows), the other fails or finds it held.
Its holder renews it every ``RENEW_SECONDS`` while it works, and a run renews it, conditionally on its epoch, before
each batch's first write and before the batch's log row (``check``): a run whose lease lapsed and was taken stops
there, so it never commits a batch the new holder may be computing; the writes it made carry the batch's plan, and
the new holder resumes that batch (docs/design.md section 3.8).
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from state.errors import LakejoinError, WarehouseBusy
from state.names import literal

LEASE_SECONDS = 300  # a holder that stops renewing (it died, or hangs) loses the lease after this long
RENEW_SECONDS = 60
POLL_SECONDS = 2.0
CONFLICT_RETRIES = 20
JOBS = ("run", "ingest")
# Delta's errors for a transaction that lost to a concurrent one (its conflict checks)
CONFLICTS = (
    "DELTA_CONCURRENT",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentTransactionException",
)
CREATED = ("TABLE_OR_VIEW_ALREADY_EXISTS", "already exists")


class LeaseLost(LakejoinError):
    """The run's lease lapsed and another run took the warehouse: this one stopped before committing its batch."""

    exit_code = 3


def first_epoch() -> int:
    """A lock's first epoch, at random: a lock made again (a warehouse deleted and made anew under a running pipeline)
    does not count again from where a pipeline saw the old one (state/log/lock.py ``Takings``)."""
    return random.getrandbits(48)


def lease_table(root: str) -> str:
    """The leases of the warehouse in the catalog schema ``root``: beside its definition, wherever its layers are."""
    return f"{root}.silver_leases"


@dataclass
class Lease:
    """A job's lease on a catalog warehouse, held by this process from ``take`` to ``release``."""

    spark: SparkSession
    table: str
    job: str
    holder: str = field(default_factory=lambda: f"pid {os.getpid()} on {socket.gethostname()} ({uuid.uuid4().hex[:8]})")
    epoch: int | None = None
    unchanged: bool = False  # set by its taker (state/log/lock.py ``Held``)
    _lost: bool = False
    _renewed_at: float = float("-inf")  # when (time.monotonic) the last taking or renewal that held was sent
    _stop: threading.Event = field(default_factory=threading.Event)
    _renewer: threading.Thread | None = None

    def take(self, wait_seconds: float | None) -> dict[str, int | None]:
        """Take the lease, waiting up to ``wait_seconds`` (None: as long as it takes) for its holder to let it go or
        let it lapse; raises ``WarehouseBusy`` naming the holder when the wait runs out. Returns each job's epoch as
        the taking saw it: this one's, and the others' where nobody holds them (None where somebody does)."""
        self._create()
        deadline = None if wait_seconds is None else time.monotonic() + wait_seconds
        while (epochs := self._taken()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                row = self.spark.sql(
                    f"SELECT holder, expires_at FROM {self.table} WHERE job = {literal(self.job)}"
                ).first()
                raise WarehouseBusy(
                    f"another 'lakejoin {self.job}' holds {self.table.rpartition('.')[0]} ({row.holder}, its lease "
                    f"runs to {row.expires_at} UTC unless renewed); this one did nothing: retry when it is done, or "
                    "pass --wait SECONDS"
                )
            time.sleep(POLL_SECONDS)
        self._renewer = threading.Thread(target=self._renew_while_held, name=f"lakejoin-lease-{self.job}", daemon=True)
        self._renewer.start()
        return epochs

    def check(self) -> None:
        """Prove the lease held for at least half its length from now: renewed in the last half (its holder's renewals
        come every ``RENEW_SECONDS``, so a check rarely commits), else renewed now; raises ``LeaseLost`` when another
        run took it. Expiry is the server's clock against the server's clock, so no other run takes it before then."""
        if not self._lost and time.monotonic() - self._renewed_at < LEASE_SECONDS / 2:
            return
        if self._lost or not self._renewed():
            self._lost = True
            raise LeaseLost(
                f"this run's lease on {self.table.rpartition('.')[0]} lapsed and another run took the warehouse: it "
                "stopped before committing its batch, which the other run resumes"
            )

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if not self._lost:
            self._update(
                "holder = NULL, expires_at = NULL", f"holder = {literal(self.holder)} AND epoch = {self.epoch}"
            )

    def _create(self) -> None:
        """The table with a free lease per job, in one commit; a run that made it just before this one is no error."""
        rows = " UNION ALL ".join(f"SELECT {literal(job)} AS job" for job in JOBS)
        try:
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS {self.table} USING DELTA TBLPROPERTIES "
                "('delta.enableDeletionVectors' = 'false') AS SELECT job, CAST(NULL AS STRING) AS holder, "
                f"CAST({first_epoch()} AS BIGINT) AS epoch, CAST(NULL AS TIMESTAMP) AS expires_at FROM ({rows})"
            )
        except Exception as exc:  # noqa: BLE001 - a concurrent creation surfaces as the catalog's error or Delta's
            if not any(mark in str(exc) for mark in CREATED):
                raise

    def _taken(self) -> dict[str, int | None] | None:
        """Take the lease if it is free or lapsed: each job's epoch as ``take`` returns it when this run now holds it,
        None when it does not. The epochs are one read of the table, which the taking's own epoch needs anyway."""
        started = time.monotonic()
        taken = self._update(
            f"holder = {literal(self.holder)}, epoch = epoch + 1, expires_at = current_timestamp() + INTERVAL "
            f"{LEASE_SECONDS} SECONDS",
            "holder IS NULL OR expires_at < current_timestamp()",
        )
        if not taken:
            return None
        self._renewed_at = started
        rows = {row.job: row for row in self.spark.sql(f"SELECT job, holder, epoch FROM {self.table}").collect()}
        self.epoch = rows[self.job].epoch  # the UPDATE made it this holder's, and only a taking changes it
        return {job: row.epoch if job == self.job or row.holder is None else None for job, row in rows.items()}

    def _renewed(self) -> bool:
        """Renew the lease if this run still holds it: whether it did."""
        if self.epoch is None:  # never taken
            return False
        started = time.monotonic()
        renewed = self._update(
            f"expires_at = current_timestamp() + INTERVAL {LEASE_SECONDS} SECONDS",
            f"holder = {literal(self.holder)} AND epoch = {self.epoch}",
        )
        if renewed:
            self._renewed_at = started  # the lease runs at least LEASE_SECONDS from before the statement
        return renewed

    def _update(self, assignments: str, condition: str) -> bool:
        """One conditional UPDATE of the job's row: whether it changed the row. A transaction that loses to a
        concurrent one (another run taking or renewing a lease: the rows share a file) is tried again on the table as
        that one left it, so the answer is the condition's on the latest version."""
        statement = f"UPDATE {self.table} SET {assignments} WHERE job = {literal(self.job)} AND ({condition})"
        for attempt in range(CONFLICT_RETRIES):
            try:
                return bool(self.spark.sql(statement).first().num_affected_rows)
            except Exception as exc:  # noqa: BLE001 - Delta's conflict errors reach Python under several types
                if not any(mark in str(exc) for mark in CONFLICTS):
                    raise
            time.sleep(random.uniform(0.1, 0.5) * (attempt + 1))
        raise LakejoinError(
            f"{self.table} kept changing under this run for {CONFLICT_RETRIES} tries: another process rewrites it; "
            "retry"
        )

    def _renew_while_held(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            if not self._renewed():
                self._lost = True
                return
