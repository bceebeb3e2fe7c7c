"""SIGTERM, SIGINT and SIGHUP to smoke: raised as SmokeInterrupted while a run holds the guard, never inside a
clean-up, and the previous handlers back afterwards; end to end, the server is gone before smoke exits."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from bwstack.smoke import SmokeInterrupted
from bwstack.smoke.interrupt import TerminationGuard
from tests.emulator.support import free_port, processes_mentioning, signal_smoke_when


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


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_sigint_and_sighup_raise_inside_the_guard_carrying_their_signal(signum: signal.Signals) -> None:
    before = signal.getsignal(signum)
    try:
        signal.signal(signum, signal.SIG_DFL if signum == signal.SIGHUP else signal.default_int_handler)
        restored = signal.getsignal(signum)
        with pytest.raises(SmokeInterrupted, match=f"smoke received {signum.name}") as caught, TerminationGuard():
            os.kill(os.getpid(), signum)
            time.sleep(0.2)
        assert caught.value.signum == signum
        assert signal.getsignal(signum) == restored
    finally:
        signal.signal(signum, before)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_sigint_and_sighup_during_a_deferred_section_wait_for_its_end(signum: signal.Signals) -> None:
    finished: list[str] = []
    with pytest.raises(SmokeInterrupted) as caught, TerminationGuard() as guard:
        with guard.deferred():
            os.kill(os.getpid(), signum)
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGTERM)  # a second, different signal changes nothing
            time.sleep(0.2)
            finished.append("clean-up")
        finished.append("after the clean-up")
    assert finished == ["clean-up"] and caught.value.signum == signum


def test_an_ignored_signal_stays_ignored() -> None:
    # `nohup invoke smoke ...`: the user asked for smoke to outlive the terminal
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with TerminationGuard():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGHUP, before)


def test_interruptible_raises_at_once_inside_a_deferred_section() -> None:
    # an image pull inside the launch's bookkeeping: a Ctrl-C must not wait minutes for it
    with pytest.raises(SmokeInterrupted), TerminationGuard() as guard, guard.deferred(), guard.interruptible():
        _sigterm()
        pytest.fail("not interrupted")  # pragma: no cover


def test_a_signal_pending_when_an_interruptible_stretch_begins_is_raised_there() -> None:
    reached: list[str] = []
    with pytest.raises(SmokeInterrupted), TerminationGuard() as guard, guard.deferred():
        _sigterm()
        reached.append("deferred")
        with guard.interruptible():
            reached.append("interruptible")  # pragma: no cover
    assert reached == ["deferred"]


# --- end to end: `invoke smoke` and a signal --------------------------------------------------------

STUBBORN = (  # a server that ignores SIGTERM and says one line, then sleeps: a hang that needs SIGKILL
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('stubborn up', flush=True); time.sleep(300)  # {tag}"
)
SLEEPY = "import sys, time; print('sleepy up', flush=True); time.sleep(300)  # {tag}"


def _run_and_collect(args: list[str], tag: str, marker: str, signum: signal.Signals, delay_s: float) -> tuple:
    try:
        code, stderr = signal_smoke_when(args, marker, signum, delay_s=delay_s)
        left = processes_mentioning(tag)
    finally:
        for process in processes_mentioning(tag):  # whatever a failed run left: not for the next
            process.kill()
    return code, stderr, left


def test_ctrl_c_during_the_clean_up_waits_for_it_and_the_server_is_gone(tmp_path: Path) -> None:
    # the clean-up had sent SIGTERM (ignored) and was waiting out the grace period; the KeyboardInterrupt
    # cut it before SIGKILL and the server stayed behind
    tag = f"bwstack-test-stubborn-{uuid.uuid4().hex[:8]}"
    command = shlex.join([sys.executable, "-c", STUBBORN.format(tag=tag)])
    args = [
        "--command", command, "--port", str(free_port()), "--stall-timeout", "1", "--grace", "4",
        "--log", str(tmp_path / "s.log"),
    ]  # fmt: skip
    code, stderr, left = _run_and_collect(args, tag, "smoke: stopping pid", signal.SIGINT, 1.0)
    assert not left, f"left running after Ctrl-C: {[p.pid for p in left]}\n{stderr}"
    assert code == 130, stderr
    assert "smoke: stopped: nothing left running" in stderr and "bwstack: interrupted by SIGINT" in stderr
    assert "Traceback" not in stderr


def test_sighup_stops_the_server_before_smoke_exits(tmp_path: Path) -> None:
    # a closed terminal or a dropped ssh session: Python's default for SIGHUP ended smoke with no clean-up
    tag = f"bwstack-test-sleepy-{uuid.uuid4().hex[:8]}"
    command = shlex.join([sys.executable, "-c", SLEEPY.format(tag=tag)])
    args = ["--command", command, "--port", str(free_port()), "--stall-timeout", "60", "--grace", "3",
            "--log", str(tmp_path / "s.log")]  # fmt: skip
    code, stderr, left = _run_and_collect(args, tag, "smoke: started pid", signal.SIGHUP, 0.3)
    assert not left, f"left running after SIGHUP: {[p.pid for p in left]}\n{stderr}"
    assert code == 129, stderr  # 128 + SIGHUP
    assert "smoke: received SIGHUP: stopping the server before exiting" in stderr
    assert "smoke: stopped: nothing left running" in stderr and "Traceback" not in stderr
