"""The one exception type users see: a message that says what is wrong and what to do."""


class LakejoinError(Exception):
    """A failure the user can act on; the CLI prints it on one line and exits non-zero."""
