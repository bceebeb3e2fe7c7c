"""SIGTERM, SIGHUP or Ctrl-C during a smoke run: stop the server first, then stop smoke.

Python's default for SIGTERM and SIGHUP ends the process at once: no `finally` runs, and the server's
process group (or its container) is left running. A CI job that times out and `systemctl stop` send
SIGTERM; a closed terminal or a dropped ssh session sends SIGHUP. Ctrl-C (SIGINT) raises a
KeyboardInterrupt wherever the main thread happens to be, which can be in the middle of the clean-up,
between its SIGTERM and its SIGKILL. For the length of a run, `TerminationGuard` turns each of the three
into `SmokeInterrupted` (a KeyboardInterrupt carrying the signal in `signum`, so `except Exception` does
not swallow it and the task exits 128 + signum), which unwinds through the clean-up.

Inside `deferred()` (the launch's bookkeeping and the clean-up itself) a signal is only recorded, and
raised once the section is done, so it never cuts a clean-up short; `interruptible()` reopens a stretch
inside a deferred section that may take long and undoes itself when cut (an image pull). Only the first
signal counts: later ones, of any of the three kinds, wait for the run to unwind. A signal that was
ignored when the run began (`nohup`) stays ignored. The previous handlers are restored when the run ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class SmokeInterrupted(KeyboardInterrupt):
    """smoke received SIGTERM, SIGHUP or SIGINT; the server was stopped before this propagated."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"smoke received {signal.Signals(signum).name}")


class TerminationGuard:
    """SIGTERM, SIGHUP and SIGINT raise SmokeInterrupted while the guard is entered (main thread only;
    elsewhere a no-op)."""

    def __init__(self) -> None:
        self.received: int | None = None  # the signal, once one came
        self._raised = False
        self._deferring = 0
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> TerminationGuard:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                if signal.getsignal(signum) == signal.SIG_IGN:
                    continue  # nohup, or a background job: the user asked not to be stopped by it
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        while self._previous:
            signum, previous = self._previous.popitem()
            signal.signal(signum, previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.received is not None:
            return  # a second signal: the first one is already stopping the run
        self.received = signum
        if not self._deferring:
            self._raise()

    def _raise(self) -> None:
        assert self.received is not None
        self._raised = True
        raise SmokeInterrupted(self.received)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A section a signal must not cut short: the signal is raised when it ends (if not raised already),
        even when the section ends with another exception."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
            if not self._deferring and self.received is not None and not self._raised:
                self._raise()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """Inside a deferred section, a stretch a signal may cut (raised at once, or as it begins when one
        is pending); the caller must undo what the stretch started when it is cut."""
        saved, self._deferring = self._deferring, 0
        try:
            if self.received is not None and not self._raised:
                self._raise()
            yield
        finally:
            self._deferring = saved
