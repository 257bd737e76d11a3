"""The exceptions users see: a message that says what is wrong and what to do, and an exit code."""


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
