"""Nothing a task starts outlives it, even when the task is killed with SIGKILL (after testcontainers' Ryuk).

A task's `finally` blocks cannot run after SIGKILL, so clean-up must live in processes that outlive it
and notice its death. The task opens a `Lifeline`: a pipe whose write end only the task holds (it is
close-on-exec, so no child inherits it). The kernel closes it when the task dies, however it dies.
- Processes: each command the task starts runs under `reaper_shim.py`, a child subreaper holding the
  read end; on the pipe's close it SIGKILLs every descendant, double-forked ones included.
- Containers: a small watcher process holds the read end too and, on the close, removes every container
  labelled with this run's id.
When the task ends normally it writes a goodbye byte first, and the watchers leave things to it.

A second net: what a killed run left (containers and processes marked with an owner that no longer
runs) is found and removed at the next start (`sweep_stale`), and `invoke clean` removes everything
carrying bwstack's labels on request.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bwstack.errors import BwstackError

RUN_LABEL = "io.bwstack.run"  # one id per task run: what its container watcher removes
OWNER_LABEL = "io.bwstack.owner"  # pid:start-time of the task, to tell a live run's things from a dead one's
KIND_LABELS = ("bwstack.smoke", "io.bwstack.verify")  # every container bwstack creates carries one of these
OWNER_ENV = "BWSTACK_OWNER"  # the same mark on every process a task starts
EXTRA_LABELS_ENV = "BWSTACK_LABELS"  # k=v[,k=v]: more labels for every container (e.g. to group CI runs)
SHIM = Path(__file__).with_name("reaper_shim.py")
GOODBYE = b"."


def owner_mark(pid: int | None = None) -> str:
    process = psutil.Process(pid)
    return f"{process.pid}:{process.create_time():.2f}"


def owner_alive(mark: str) -> bool:
    pid, _, started = mark.partition(":")
    try:
        return f"{psutil.Process(int(pid)).create_time():.2f}" == started
    except (ValueError, psutil.Error):
        return False


def extra_labels() -> dict[str, str]:
    pairs = [p for p in os.environ.get(EXTRA_LABELS_ENV, "").split(",") if p.strip()]
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BwstackError(f"{EXTRA_LABELS_ENV} {pair!r} is not KEY=VALUE")
        labels[key.strip()] = value.strip()
    return labels


@dataclass
class Lifeline:
    """This task's end of the pipe the reapers watch. Use as a context manager around the whole run."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    _read: int = -1
    _write: int = -1
    _watchers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> Lifeline:
        self._read, self._write = os.pipe()  # both close-on-exec; only pass_fds hands the read end on
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The normal end: say goodbye so the reapers stand down, then close."""
        if self._write >= 0:
            with contextlib.suppress(OSError):
                os.write(self._write, GOODBYE * 64)  # one byte per reader that may still look
            os.close(self._write)
            self._write = -1
        if self._read >= 0:
            os.close(self._read)
            self._read = -1
        for watcher in self._watchers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                watcher.wait(timeout=5)

    def cut(self) -> None:
        """End it as a death would: no goodbye, so the reapers kill and remove everything of this run."""
        for fd in (self._write, self._read):
            if fd >= 0:
                os.close(fd)
        self._write = self._read = -1

    def labels(self, kind: str) -> dict[str, str]:
        """Labels for a container this run creates: its kind, the run id, the owner, and any extras."""
        return {**extra_labels(), kind: "1", RUN_LABEL: self.run_id, OWNER_LABEL: owner_mark()}

    def environment(self) -> dict[str, str]:
        """Environment marks for a process this run starts (found by the stale sweep if it outlives us)."""
        return {OWNER_ENV: owner_mark()}

    def guarded(self, argv: list[str]) -> tuple[list[str], tuple[int, ...]]:
        """`argv` wrapped in the process reaper, and the fds Popen must pass (pass_fds=...)."""
        shim = [sys.executable, "-I", "-S", "-B", str(SHIM), str(self._read), "--"]
        return [*shim, *argv], (self._read,)

    def watch_containers(self) -> None:
        """Start the container watcher for this run (once): it removes this run's containers if we die."""
        if self._watchers:
            return
        code = (
            "from bwstack.reaper import _watch_containers; import sys; _watch_containers(int(sys.argv[1]), sys.argv[2])"
        )
        self._watchers.append(
            subprocess.Popen(
                [sys.executable, "-c", code, str(self._read), self.run_id],
                pass_fds=(self._read,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C to the terminal's group must not take the net down too
            )
        )


def _watch_containers(fd: int, run_id: str) -> None:
    """The container watcher's body: block on the lifeline; on a close without goodbye, remove our containers."""
    if os.read(fd, 1) == GOODBYE:
        return
    import docker

    client = docker.from_env(timeout=30)
    for container in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
        with contextlib.suppress(Exception):
            container.remove(force=True)


@dataclass(frozen=True)
class Leftover:
    what: str  # "container" or "process"
    ident: str
    detail: str

    def describe(self) -> str:
        return f"{self.what} {self.ident} ({self.detail})"


def find_leftovers(client: Any | None, *, stale_only: bool = True) -> list[Leftover]:
    """Containers with bwstack's labels and processes with its owner mark; only a dead owner's if stale_only."""
    found: list[Leftover] = []
    if client is not None:
        seen = set()
        for kind in KIND_LABELS:
            for container in client.containers.list(all=True, filters={"label": kind}):
                owner = container.labels.get(OWNER_LABEL, "")
                if container.id in seen or (stale_only and (not owner or owner_alive(owner))):
                    continue
                seen.add(container.id)
                found.append(Leftover("container", container.name, f"{kind}, {container.status}, owner {owner}"))
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            owner = process.environ().get(OWNER_ENV)
            if owner and not (stale_only and owner_alive(owner)) and process.pid != os.getpid():
                found.append(
                    Leftover("process", str(process.pid), f"{' '.join(process.cmdline())[:80]}, owner {owner}")
                )
    return found


def remove(leftovers: list[Leftover], client: Any | None) -> None:
    for item in leftovers:
        with contextlib.suppress(Exception):
            if item.what == "container" and client is not None:
                client.containers.get(item.ident).remove(force=True)
            elif item.what == "process":
                psutil.Process(int(item.ident)).kill()


def sweep_stale(client: Any | None) -> list[str]:
    """Remove what earlier, killed runs left; one line per thing removed, for the task to report."""
    leftovers = find_leftovers(client, stale_only=True)
    remove(leftovers, client)
    return [f"removed {item.describe()}, left by a run that was killed" for item in leftovers]
