"""The busybox demo server (images/demo/server) run as a plain process: it removes its state folder
(TMPDIR/bwstack-demo-<pid>) however it ends, and a SIGTERM to it alone stops its ranks too."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import psutil

from tests.conftest import wait_until
from tests.emulator.support import DEMO_SERVER, free_port


def _start(tmp_path: Path, scenario: str) -> subprocess.Popen[bytes]:
    command = ["sh", str(DEMO_SERVER / "entrypoint.sh"), "--port", str(free_port()), "--scenario", scenario]
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "STEP_S": "0.01"}
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, start_new_session=True)  # a log < 64 KiB


def _state_folders(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.glob("bwstack-demo-*"))


def _alive(processes: list[psutil.Process]) -> list[int]:
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
    return alive


def _sleeping(processes: list[psutil.Process]) -> int:
    """How many of the processes are a rank's long `sleep 3600` (the short sleeps between bar updates come
    and go, and a process may exit while we look: neither counts)."""
    count = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            count += process.cmdline()[-2:] == ["sleep", "3600"] and process.status() != psutil.STATUS_ZOMBIE
    return count


def test_a_sigterm_stops_the_whole_server_and_removes_its_state_folder(tmp_path: Path) -> None:
    server = _start(tmp_path, "incident")  # bars to N/N, then asleep until stopped, like the incident
    try:
        tree: list[psutil.Process] = []

        def both_ranks_asleep() -> bool:  # after their bars, each rank sleeps in its own `sleep`
            nonlocal tree
            with contextlib.suppress(psutil.Error):
                tree = psutil.Process(server.pid).children(recursive=True)
            return _sleeping(tree) >= 2

        wait_until(both_ranks_asleep, 10)
        assert _sleeping(tree) == 2, tree  # two ranks, each asleep in its own sleep
        assert _state_folders(tmp_path) == [f"bwstack-demo-{server.pid}"]
        server.send_signal(signal.SIGTERM)  # to the server alone, not to its process group
        assert server.wait(timeout=10) == 143
        wait_until(lambda: not _alive(tree), 5)  # under load the ranks take a moment to go
        assert not _alive(tree), "a rank or its sleep outlived the server"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)  # whatever a failed run left
        server.wait()
    assert _state_folders(tmp_path) == []


def test_the_state_folder_goes_when_the_server_crashes(tmp_path: Path) -> None:
    server = _start(tmp_path, "crash-no-kernel-image")
    _, log = server.communicate(timeout=20)
    assert server.returncode == 1 and b"no kernel image is available" in log
    assert _state_folders(tmp_path) == []
