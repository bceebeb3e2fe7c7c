"""The process half of bwstack's reaper: runs one command and makes sure nothing it started outlives it.

    python -I -S -B reaper_shim.py LIFELINE_FD -- COMMAND [ARG...]

It makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so every process the command starts
stays its descendant even after double-forking out of the session (an orphan is re-parented to the
nearest subreaper, not to PID 1). It holds the read end of a pipe whose write end only the task holds:
when that pipe closes without a goodbye byte (the task died, even by SIGKILL, which no handler sees), or
when the command itself ends, it SIGKILLs every descendant, reaps them, and exits as the command did
(the same code, or the same signal). Signals the task sends the process group reach the command
directly; the shim only absorbs them so it stays to clean up.

Standard library only, and run with -I -S: it must start fast and load nothing of the package it guards.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
GOODBYE = b"."  # the task ends normally: written before the pipe closes


def descendants(root: int) -> list[int]:
    """Every live process under `root`, from /proc's parent links (zombies included, to be reaped)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        parent = int(stat.rsplit(b")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap() -> dict[int, int]:
    """Collect every exited child without blocking: {pid: wait status}."""
    statuses = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return statuses
        if pid == 0:
            return statuses
        statuses[pid] = status


def kill_all(deadline_s: float = 5.0) -> None:
    """SIGKILL all descendants until none is left (a fork racing the kill is caught on the next pass)."""
    me = os.getpid()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
        reap()


def exit_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # mirror the signal, not a core dump
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def main(argv: list[str]) -> None:
    lifeline = int(argv[1])
    command = argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: exec resets it for the command
    child = os.fork()
    if child == 0:
        os.close(lifeline)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as error:
            os.write(2, f"bwstack reaper: cannot run {command[0]!r}: {error.strerror}\n".encode())
            os._exit(127)
    status, watching = None, [lifeline]
    while status is None:
        ready, _, _ = select.select(watching, [], [], 0.1)
        if ready:
            if os.read(lifeline, 1) != GOODBYE:
                kill_all()  # the task is gone: take everything down with it
                os._exit(128 + signal.SIGKILL)
            watching = []  # the task said goodbye: the command may finish in its own time
        status = reap().get(child)
    kill_all()  # what the command left running (double-forked daemons) ends with it
    exit_like(status)


if __name__ == "__main__":
    main(sys.argv)
