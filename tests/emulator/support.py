"""Helpers for smoke's tests: the emulator's command line, free ports, and leftover hunting."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil

from tests.paths import EMULATOR, REPO

DEMO_SERVER = REPO / "images" / "demo" / "server"


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def emulator_command(port: int, scenario: str, *extra: str) -> tuple[str, ...]:
    return (sys.executable, str(EMULATOR), "--port", str(port), "--scenario", scenario, *extra)


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line contains `text`, other than this test process."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.pid == psutil.Process().pid or process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if text in " ".join(process.info["cmdline"] or []):
                found.append(process)
        except psutil.Error:
            continue
    return found


def _default_signals() -> None:  # a test run from a non-interactive shell may hand SIGINT on ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def signal_smoke_when(
    args: list[str], marker: str, signum: signal.Signals, *, delay_s: float = 0.0, timeout_s: float = 45.0
) -> tuple[int, str]:
    """Run `invoke smoke ARGS`, send it `signum` `delay_s` after `marker` shows on its stderr, wait for it:
    its exit status and its stderr. The marker must come within `timeout_s`."""
    smoke = subprocess.Popen(
        [sys.executable, "-m", "invoke", "smoke", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=_default_signals,
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert smoke.stderr is not None
        for line in smoke.stderr:
            lines.append(line)
            if marker in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not seen.wait(0.05):
            if smoke.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{marker!r} never came: {''.join(lines)}")
        time.sleep(delay_s)
        smoke.send_signal(signum)
        code = smoke.wait(timeout=timeout_s)
    finally:
        if smoke.poll() is None:
            smoke.kill()
            smoke.wait()
    reader.join(5.0)
    return code, "".join(lines)
