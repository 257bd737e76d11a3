"""``lakejoin run --follow``: one process that keeps joining new arrivals, trigger after trigger, until stopped.

It keeps what a scheduled run pays for again each time: the Spark session, the engine's open Delta tables and
the planned Spark code paths. Stopping is safe at any moment (the batch protocol resumes an unfinished batch),
and polite on the first signal: the batch under way commits, then the process exits 0.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """SIGTERM or SIGINT asks the loop to stop after the batch under way; a second one abandons that batch
    (``KeyboardInterrupt``), which the next run resumes with its own plan."""

    def __init__(self) -> None:
        self._asked = threading.Event()
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignal:
        self._previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type] - what signal.signal returned

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self._asked.is_set():
            raise KeyboardInterrupt
        self._asked.set()

    def asked(self) -> bool:
        return self._asked.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep until the next trigger; True when a stop was asked (at once, without waiting it out)."""
        return self._asked.wait(seconds)
