"""What a command leaves on the terminal: a native library's panic text stays off it unless ``--verbose``."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO

# What delta-rs printed before lakejoin's error when a disk filled up (RUST_BACKTRACE=1 set), then the error.
PANIC = (
    "thread 'tokio-rt-worker' (22420) panicked at /home/runner/.cargo/registry/src/object_store-0.13.2/src/buffered.rs:369:41:\n"
    "Already shut down\n"
    "stack backtrace:\n"
    "note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n"
)
ERROR = (
    "lakejoin: error: cannot ingest big.jsonl: cannot append to wh/bronze/r: No space left on device (os error 28)\n"
)


def stderr_of(script: str) -> str:
    """The stderr of a fresh Python process running ``script``, whose native writes go straight to descriptor 2."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60).stderr


def test_a_rust_panic_is_dropped_and_every_other_line_reaches_the_terminal():
    script = f"""
import os, sys
from pipelines.commands.terminal import without_native_panics
with without_native_panics():
    print("before", file=sys.stderr)
    os.write(2, {PANIC.encode()!r})  # as Rust's panic hook writes: to the descriptor, past Python
    print({ERROR!r}, end="", file=sys.stderr)
    os.write(2, {PANIC.encode()!r}.replace(b"note: ", b"other: ").split(b"other: ")[0])  # a panic without its note
    print("after", file=sys.stderr)
print("outside", file=sys.stderr)
"""
    assert stderr_of(script) == "before\n" + ERROR + "after\noutside\n"


def test_without_the_filter_the_panic_text_is_there():
    """What ``--verbose`` shows: the filter is what removes it."""
    assert stderr_of(f"import os; os.write(2, {PANIC.encode()!r})") == PANIC


def test_leaving_is_prompt_keeps_a_partial_line_and_blank_lines_and_leaves_no_descriptor_open():
    script = """
import os, sys, threading, time
from pipelines.commands.terminal import without_native_panics
before, started = len(os.listdir("/proc/self/fd")), time.monotonic()
for _ in range(3):
    with without_native_panics():
        print("a\\n\\nb", file=sys.stderr)
        os.write(2, b"partial")  # no newline: the last write of a native library, say
seconds = time.monotonic() - started
for forwarder in [thread for thread in threading.enumerate() if thread.name == "lakejoin-stderr"]:
    forwarder.join(5)  # each ends once the pipe's last writer closed it, closing what it held
print(f"{len(os.listdir('/proc/self/fd')) - before} {seconds < 3}", file=sys.stderr)
"""
    assert stderr_of(script) == "a\n\nb\npartial\n" * 3 + "0 True\n"
