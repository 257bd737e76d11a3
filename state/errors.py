"""The exceptions users see: a message that says what is wrong and what to do, and an exit code."""

import re

CAUSE = re.compile(r"^Caused by: (.+)$", re.M)


class LakejoinError(Exception):
    """A failure the user can act on; the CLI prints it on one line and exits with ``exit_code``."""

    exit_code = 2


class WarehouseBusy(LakejoinError):
    """Another process holds the warehouse for the same job; this one did nothing."""

    exit_code = 3


class FileRefused(LakejoinError):
    """One input file cannot be ingested as a whole; nothing of it was written, and other files go on.

    ``lasting``: the file's form is the cause, so its content would be refused again (a landing folder records
    it and moves on); not when reading it failed (gone, unreadable, Spark failing), which a later try may get past."""

    def __init__(self, message: str, lasting: bool = True) -> None:
        super().__init__(message)
        self.lasting = lasting


def first_line(exc: BaseException) -> str:
    """An error's own words, on one line. Spark's and the JVM's go on with plans and stack traces, and a wrapper's first
    line says least ('An error occurred while calling …', 'Exception thrown in awaitResult'): the innermost cause
    named in the error's text, else its first line that is not a call's frame."""
    text = str(exc).strip()
    if causes := CAUSE.findall(text):
        return causes[-1].strip()
    lines = [
        line.strip().lstrip(": ") for line in text.splitlines() if line.strip() and not line.strip().startswith("at ")
    ]
    if len(lines) > 1 and lines[0].startswith("An error occurred while calling"):
        return lines[1]
    return lines[0] if lines else type(exc).__name__


# How a commit that lost a race to another writer (OPTIMIZE, VACUUM, predictive optimization) says so: Delta on
# Spark's conflict conditions (SQLSTATE 2D521, in the message on a classic session, the condition over Spark Connect)
# and delta-rs's CommitFailedError, which the engine wraps. Nothing of the losing commit was written.
LOST_RACE = (
    "DELTA_CONCURRENT_APPEND",
    "DELTA_CONCURRENT_DELETE_READ",
    "DELTA_CONCURRENT_DELETE_DELETE",
    "DELTA_CONCURRENT_TRANSACTION",
    "DELTA_CONCURRENT_WRITE",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
)


def lost_a_race(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from, is a commit that lost a race: what a retry cures."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ == "CommitFailedError" or any(name in str(seen) for name in LOST_RACE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
