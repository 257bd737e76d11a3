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

PANIC = b" panicked at "  # Rust's panic header: thread 'name' (id) panicked at file:line:column:, then the message line
# What may follow the message: a backtrace (its frames indented) and notes on how to see more.
PANIC_TAIL = (b"stack backtrace:", b"note: ", b" ", b"\t")
FLUSHED = b"lakejoin-stderr-flushed\n"  # written last, so leaving waits until every earlier line is through


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
        sys.stderr.flush()
        os.write(2, FLUSHED)
        flushed.wait(timeout=5)
        os.dup2(terminal, 2)  # child processes that still hold the pipe (Spark's JVM) keep being forwarded


def _forward(read: int, terminal: int, flushed: threading.Event) -> None:
    message_next = in_tail = False
    with os.fdopen(read, "rb") as lines, os.fdopen(terminal, "wb", closefd=False) as out:
        for line in lines:
            if line == FLUSHED:
                flushed.set()
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
            out.write(line)
            out.flush()
