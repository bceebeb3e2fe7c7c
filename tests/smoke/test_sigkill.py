"""SIGKILL the task itself, at random points: nothing it started may survive it for more than a few seconds.

No clean-up code runs after SIGKILL, so this is the reaper's test: smoke's server process (and what it
double-forked with an empty environment), smoke's container, and verify's loader probe (and what the
loader double-forked). Leftovers are found by PID and by container label, never by name.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from bwstack.reaper import OWNER_ENV, OWNER_LABEL, owner_alive
from tests.conftest import TEST_RUN_LABEL, wait_until
from tests.emulator.support import emulator_command, free_port, signal_smoke_when
from tests.paths import REPO, package
from tests.smoke.test_smoke_container import demo_image, incident_container_args  # noqa: F401 - demo_image: the fixture

GONE_WITHIN_S = 5.0
RNG = random.Random()  # the points differ from run to run; the seed is in the test id's output on failure


def alive(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def orphaned() -> list[int]:
    """Processes carrying a bwstack owner mark whose owner no longer runs."""
    found = []
    for process in psutil.process_iter():
        try:
            mark = process.environ().get(OWNER_ENV)
            if mark and not owner_alive(mark):
                found.append(process.pid)
        except psutil.Error:
            continue
    return alive(found)


def sleepers_started_after(started: float) -> list[int]:
    """`sleep 300` processes (the double-forked escapees) created after `started`."""
    found = []
    for process in psutil.process_iter(["cmdline", "create_time"]):
        try:
            if process.info["cmdline"] == ["sleep", "300"] and process.info["create_time"] >= started - 1:
                found.append(process.pid)
        except psutil.Error:
            continue
    return alive(found)


def escaping_server(tmp_path: Path, port: int) -> str:
    script = tmp_path / "server.py"
    script.write_text(
        textwrap.dedent(
            """\
            import os, sys
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execve("/bin/sleep", ["sleep", "300"], {})
                os._exit(0)
            os.wait()
            os.execv(sys.argv[1], sys.argv[1:])
            """
        )
    )
    return " ".join([sys.executable, str(script), *emulator_command(port, "incident")])


@pytest.mark.parametrize("point", ["starting", "loading", "hung"])
def test_sigkill_of_smoke_leaves_no_process(tmp_path: Path, point: str) -> None:
    port = free_port()
    marker, delay = {
        "starting": ("smoke:", RNG.uniform(0, 0.3)),
        "loading": ("smoke:", RNG.uniform(0.3, 2.0)),
        "hung": ("shards-loaded", RNG.uniform(0, 1.0)),
    }[point]
    started = time.time()
    args = ["--command", escaping_server(tmp_path, port), "--port", str(port), "--stall-timeout", "60"]
    code, stderr = signal_smoke_when([*args, "--log", str(tmp_path / "s.log")], marker, signal.SIGKILL, delay_s=delay)
    assert code == -signal.SIGKILL, stderr
    survivors = lambda: orphaned() + sleepers_started_after(started)  # noqa: E731
    assert wait_until(lambda: not survivors(), GONE_WITHIN_S), f"left after SIGKILL at {point}: {survivors()}"


@pytest.mark.docker
@pytest.mark.parametrize("point", ["created", "running"])
def test_sigkill_of_smoke_removes_its_container(
    demo_image: str,  # noqa: F811
    docker_client: Any,
    run_id: str,
    tmp_path: Path,
    point: str,
) -> None:
    port = free_port()
    args = incident_container_args(demo_image, port, tmp_path / "s.log")
    marker, delay = ("smoke:", RNG.uniform(0, 0.5)) if point == "created" else ("shards-loaded", RNG.uniform(0, 1))
    code, stderr = signal_smoke_when(args, marker, signal.SIGKILL, delay_s=delay, timeout_s=60)
    assert code == -signal.SIGKILL, stderr

    def ours() -> list[Any]:
        found = docker_client.containers.list(all=True, filters={"label": f"{TEST_RUN_LABEL}={run_id}"})
        return [c for c in found if not owner_alive(c.labels.get(OWNER_LABEL, ""))]

    try:
        assert wait_until(lambda: not ours(), 15), f"left after SIGKILL: {[(c.name, c.status) for c in ours()]}"
    finally:
        for container in ours():  # not for the next run to find
            container.remove(force=True)


def test_sigkill_of_verify_kills_the_loader_and_what_it_double_forked(tmp_path: Path) -> None:
    root = tmp_path / "site"
    root.mkdir()
    shutil.copytree(package("good") / "sgl_kernel", root / "sgl_kernel")
    pids_file = tmp_path / "pids.json"
    (root / "sgl_kernel" / "__init__.py").write_text(
        textwrap.dedent(
            f"""\
            import json, os, time
            read, write = os.pipe()
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execve("/bin/sleep", ["sleep", "300"], {{}})
                os._exit(0)
            os.wait()
            with open({str(pids_file)!r}, "w") as f:
                json.dump([os.getpid()], f)
            time.sleep(60)
            """
        )
    )
    started = time.time()
    verify = subprocess.Popen(
        [sys.executable, "-m", "invoke", "verify", "--arch", "sm120", "--path", str(root), "--timeout", "60"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(pids_file.exists, 30), "the loader never ran"
        time.sleep(RNG.uniform(0, 1.0))
        verify.kill()
        verify.wait()
        loader = json.loads(pids_file.read_text())
        survivors = lambda: alive(loader) + orphaned() + sleepers_started_after(started)  # noqa: E731
        assert wait_until(lambda: not survivors(), GONE_WITHIN_S), f"left after SIGKILL: {survivors()}"
    finally:
        if verify.poll() is None:
            verify.kill()
            verify.wait()
