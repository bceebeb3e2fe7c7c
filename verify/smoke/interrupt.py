"""SIGTERM during a smoke run: stop the server first, then stop smoke.

Python's default for SIGTERM ends the process at once: no `finally` runs, and the server's process
group (or its container) is left running. A CI job that times out and `systemctl stop` both send
SIGTERM. For the length of a run, `TerminationGuard` turns SIGTERM into `SmokeInterrupted` (a
KeyboardInterrupt, so `except Exception` does not swallow it and invoke exits non-zero), which unwinds
through the clean-up. Inside `deferred()` (the launch's bookkeeping and the clean-up itself) a SIGTERM
is only recorded, and raised once the section is done, so it never cuts a clean-up short. The previous
handler is restored when the run ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any


class SmokeInterrupted(KeyboardInterrupt):
    """smoke received SIGTERM; the server was stopped before this propagated."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"smoke received {signal.Signals(signum).name}")


class TerminationGuard:
    """SIGTERM raises SmokeInterrupted while the guard is entered (main thread only; elsewhere a no-op)."""

    def __init__(self) -> None:
        self.received: int | None = None  # the signal, once one came
        self._raised = False
        self._deferring = 0
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> TerminationGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.received is not None:
            return  # a second SIGTERM: the first one is already stopping the run
        self.received = signum
        if not self._deferring:
            self._raise()

    def _raise(self) -> None:
        assert self.received is not None
        self._raised = True
        raise SmokeInterrupted(self.received)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A section SIGTERM must not cut short: the signal is raised when it ends (if not raised already)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if not self._deferring and self.received is not None and not self._raised:
            self._raise()
