"""clean: remove what bwstack runs left behind (containers with its labels, processes with its mark)."""

from __future__ import annotations

import sys
from typing import Any

from bwstack.cli.program import Context, guarded, task


def docker_or_none() -> Any | None:
    """A Docker client if an engine answers; None otherwise (then only processes are looked at)."""
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except Exception:  # the SDK raises several unrelated types for "no daemon"
        return None


def report_stale(stage: str, *, containers: bool) -> None:
    """The second net, run as a task starts: what killed runs left is removed and said on stderr. Containers
    are looked for only by tasks that use Docker anyway (a process smoke run must not wait on an engine)."""
    from bwstack.reaper import sweep_stale

    for line in sweep_stale(docker_or_none() if containers else None):
        print(f"bwstack: {stage}: {line}", file=sys.stderr)


@task(
    help={
        "dry_run": "list what would be removed, remove nothing",
        "running": "also stop things whose bwstack run is still going (default: on; --no-running spares them "
        "and removes only what runs that died left)",
    }
)
@guarded
def clean(c: Context, dry_run: bool = False, running: bool = True) -> None:
    """Remove every container carrying bwstack's labels and kill processes bwstack started."""
    from bwstack.reaper import find_leftovers, remove

    client = docker_or_none()
    leftovers = find_leftovers(client, stale_only=not running)
    if not dry_run:
        remove(leftovers, client)
    for item in leftovers:
        print(f"{'would remove' if dry_run else 'removed'} {item.describe()}")
    if not leftovers:
        print("nothing to clean")
    if client is None:
        print("bwstack: clean: no Docker engine answered; only processes were looked at", file=sys.stderr)
