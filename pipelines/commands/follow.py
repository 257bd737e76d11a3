"""``lakejoin run --follow``: one process that keeps joining new arrivals, trigger after trigger, until stopped.

It keeps what a scheduled run pays for again each time: the Spark session and Spark's planned code paths. Stopping
is safe at any moment (the batch protocol resumes an unfinished batch), and polite on the first signal: the batch
under way commits, then the process exits 0.
"""

from __future__ import annotations

import signal
import time
from types import FrameType, TracebackType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
NAP = 0.2  # seconds: how soon a stop asked during the wait between triggers is seen


class StopSignal:
    """SIGTERM or SIGINT asks the loop to stop after the batch under way; a second one abandons that batch
    (``KeyboardInterrupt``), which the next run resumes with its own plan. The handler only sets a flag: it runs
    between two bytecodes of whatever the process was doing, where taking a lock could deadlock."""

    def __init__(self) -> None:
        self._asked = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignal:
        try:
            self._previous = {number: signal.signal(number, self._handle) for number in STOP_SIGNALS}
        except ValueError:  # not the main thread (a host that runs the entry point in a thread of its own): no handlers
            self._previous = {}
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type] - what signal.signal returned

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if self._asked:
            raise KeyboardInterrupt
        self._asked = True

    def asked(self) -> bool:
        return self._asked

    def wait(self, seconds: float) -> bool:
        """Sleep until the next trigger; True when a stop was asked (seen within ``NAP`` seconds, not waited out)."""
        deadline = time.monotonic() + seconds
        while not self._asked and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(NAP, left))
        return self._asked
