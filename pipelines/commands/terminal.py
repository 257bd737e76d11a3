"""What a command leaves on the terminal: its own lines, not the native libraries' internals.

delta-rs reports a storage failure (a full disk, a vanished folder) by returning an error, which lakejoin turns into
its one ``lakejoin: error:`` line; but a worker thread of its runtime may panic on the way, and Rust's panic hook writes
the panic (and, with ``RUST_BACKTRACE``, a stack trace) straight to file descriptor 2, where no Python code sees it.
The CLI therefore passes its own stderr through ``without_native_panics`` unless ``--verbose``.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

PANIC = b" panicked at "  # Rust's panic header: thread 'name' (id) panicked at file:line:column:, then the message line
# What may follow the message: a backtrace (its frames indented) and notes on how to see more.
PANIC_TAIL = (b"stack backtrace:", b"note: ", b" ", b"\t")
# Written last (after a newline, so a partial line before it cannot hide it): leaving waits until every earlier
# line is through.
FLUSHED = b"lakejoin-stderr-flushed\n"


@contextmanager
def without_native_panics() -> Iterator[None]:
    """Within, this process's stderr (file descriptor 2: Python's, native code's and child processes') reaches the
    terminal without Rust panic messages: a panic's header line, its message line, and the backtrace and notes after."""
    read, write = os.pipe()
    terminal = os.dup(2)
    flushed = threading.Event()
    forwarder = threading.Thread(target=_forward, args=(read, terminal, flushed), name="lakejoin-stderr", daemon=True)
    forwarder.start()
    sys.stderr.flush()
    os.dup2(write, 2)
    os.close(write)
    try:
        yield
    finally:
        try:
            sys.stderr.flush()
            os.write(2, b"\n" + FLUSHED)
            flushed.wait(timeout=5)
        finally:
            os.dup2(terminal, 2)  # child processes that still hold the pipe (Spark's JVM) keep being forwarded


def _forward(read: int, terminal: int, flushed: threading.Event) -> None:
    """Copy the pipe to the terminal without panic text, until every writer has closed it; a terminal that went away
    (a closed pipe) only stops the copying, never the draining, so no writer ever blocks on a full pipe."""
    message_next = in_tail = False
    blank = False  # a blank line held back: the newline written before FLUSHED, or one of the output's own
    with os.fdopen(read, "rb") as lines, os.fdopen(terminal, "wb") as out:
        for line in lines:
            if line == FLUSHED:
                blank = False
                flushed.set()
                continue
            if blank:
                write_quietly(out, b"\n")
            blank = line == b"\n"
            if blank:
                continue
            if message_next:
                message_next, in_tail = False, True
                continue
            if in_tail and line.startswith(PANIC_TAIL):
                continue
            in_tail = False
            if line.startswith(b"thread '") and PANIC in line:
                message_next = True
                continue
            write_quietly(out, line)


def write_quietly(out: BinaryIO, line: bytes) -> None:
    """Write and flush ``line``, dropping it when the terminal is gone."""
    try:
        out.write(line)
        out.flush()
    except OSError:
        pass
