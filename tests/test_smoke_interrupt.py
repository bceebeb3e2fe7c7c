"""SIGTERM to smoke: raised as SmokeInterrupted while a run holds the guard, never inside a clean-up, and
the previous handler back afterwards."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from verify.smoke import SmokeInterrupted
from verify.smoke.interrupt import TerminationGuard


def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the handler runs here, in the main thread


def test_sigterm_raises_inside_the_guard_and_the_old_handler_comes_back() -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with pytest.raises(SmokeInterrupted, match="smoke received SIGTERM") as caught, TerminationGuard():
            _sigterm()
        assert isinstance(caught.value, KeyboardInterrupt) and caught.value.signum == signal.SIGTERM
        _sigterm()  # the handler from before the run is back
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_sigterm_during_a_deferred_section_waits_for_its_end() -> None:
    finished: list[str] = []
    with pytest.raises(SmokeInterrupted), TerminationGuard() as guard:
        with guard.deferred():
            _sigterm()
            _sigterm()  # a second one is not raised either
            finished.append("clean-up")
        finished.append("after the clean-up")  # never: the deferred SIGTERM is raised as the section ends
    assert finished == ["clean-up"]


def test_off_the_main_thread_the_guard_changes_nothing() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def run() -> None:
        with TerminationGuard():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [before]
