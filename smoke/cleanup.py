"""Stop everything a smoke run started, and prove it: SIGTERM, a grace period, SIGKILL, then look again.

A process server is stopped through its process group (the launch gave it its own session), plus any
member that left the group; a container through the Docker SDK (stop, then remove). Either way the
result lists what is still running afterwards, which should be nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from bwstack.smoke.activity import ProcessTree


@dataclass
class CleanupResult:
    method: str  # what was done, in words
    killed: list[int] = field(default_factory=list)  # pids that needed SIGKILL
    left_running: list[int] = field(default_factory=list)  # pids still alive at the end: should be empty
    container_removed: bool | None = None  # None for a process server
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.left_running and self.container_removed is not False

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "killed": self.killed,
            "left_running": self.left_running,
            "container_removed": self.container_removed,
            "seconds": round(self.seconds, 2),
            "clean": self.clean,
        }


def wait_gone(tree: ProcessTree, timeout_s: float, *, poll_s: float = 0.05) -> list[psutil.Process]:
    """Wait until no known member of the tree runs; the ones still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = tree.alive()
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(poll_s)


def _signal(process: psutil.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(psutil.Error):
        process.send_signal(sig)


def stop_process_group(popen: subprocess.Popen[bytes], tree: ProcessTree, grace_s: float) -> CleanupResult:
    """SIGTERM the group (and strays), SIGKILL what is left after `grace_s`, reap the root."""
    started = time.monotonic()
    tree.refresh()
    group = popen.pid  # start_new_session: the root leads its own process group
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGTERM)
    for process in tree.alive():
        _signal(process, signal.SIGTERM)  # members that moved to another group
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=grace_s)
    survivors = wait_gone(tree, max(0.0, grace_s - (time.monotonic() - started)))
    killed = [p.pid for p in survivors]
    if survivors:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
        for process in survivors:
            _signal(process, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=2.0)
    left = wait_gone(tree, 2.0)
    method = f"SIGTERM to process group {group}" + (f", SIGKILL after {grace_s:g} s" if killed else "")
    return CleanupResult(
        method=method,
        killed=killed,
        left_running=[p.pid for p in left],
        seconds=time.monotonic() - started,
    )


def stop_container(container: Any, tree: ProcessTree, grace_s: float) -> CleanupResult:
    """`docker stop` (SIGTERM, SIGKILL after `grace_s`), then remove the container and check it is gone."""
    import docker.errors

    started = time.monotonic()
    tree.refresh()
    members = sorted(p.pid for p in tree.alive())
    exit_code = None
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.stop(timeout=max(1, round(grace_s)))
        container.reload()
        exit_code = container.attrs.get("State", {}).get("ExitCode")
    with contextlib.suppress(docker.errors.NotFound):
        container.remove(force=True)
    removed = False
    try:
        container.reload()
    except docker.errors.NotFound:
        removed = True
    left = wait_gone(tree, 2.0)
    killed = members if exit_code == 128 + signal.SIGKILL else []
    method = f"docker stop (SIGTERM, SIGKILL after {grace_s:g} s), then remove container {container.short_id}"
    return CleanupResult(
        method=method,
        killed=killed,
        left_running=[p.pid for p in left],
        container_removed=removed,
        seconds=time.monotonic() - started,
    )
