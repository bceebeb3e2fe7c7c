"""The reaper's pieces: the shim mirrors its command and kills what it leaves; the stale sweep and
`invoke clean` remove only what carries bwstack's marks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bwstack.reaper import OWNER_ENV, OWNER_LABEL, Lifeline, find_leftovers, owner_alive, owner_mark, sweep_stale
from tests.conftest import TEST_RUN_LABEL, wait_until
from tests.helpers import invoke


def run_guarded(lifeline: Lifeline, argv: list[str], **kwargs) -> subprocess.Popen:
    command, fds = lifeline.guarded(argv)
    return subprocess.Popen(command, pass_fds=fds, start_new_session=True, **kwargs)


@pytest.mark.parametrize(("script", "code"), [("raise SystemExit(3)", 3), ("import os; os.kill(os.getpid(), 15)", -15)])
def test_the_shim_ends_as_its_command_did(script: str, code: int) -> None:
    with Lifeline() as lifeline:
        assert run_guarded(lifeline, [sys.executable, "-c", script]).wait(timeout=30) == code


def test_what_the_command_double_forked_dies_when_the_command_ends(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "        os.execve('/bin/sleep', ['sleep', '301'], {})\n"
        "    os._exit(0)\n"
        "os.wait()\n"
        "import time\n"
        "while not os.path.exists(" + repr(str(pid_file)) + "): time.sleep(0.01)\n"
    )
    with Lifeline() as lifeline:
        assert run_guarded(lifeline, [sys.executable, "-c", script]).wait(timeout=30) == 0
    escaped = int(pid_file.read_text())
    assert wait_until(lambda: not _alive(escaped), 5), "the double-forked sleeper outlived its command"


def test_cutting_the_lifeline_kills_the_command_and_its_tree() -> None:
    lifeline = Lifeline().__enter__()
    shim = run_guarded(lifeline, ["/bin/sh", "-c", "sleep 302 & sleep 302 & wait"])
    assert wait_until(lambda: len(psutil.Process(shim.pid).children(recursive=True)) >= 3, 10)
    tree = [p.pid for p in psutil.Process(shim.pid).children(recursive=True)]
    lifeline.cut()  # as the task's death would
    assert shim.wait(timeout=10) == 128 + signal.SIGKILL
    assert wait_until(lambda: not [p for p in tree if _alive(p)], 5)


def test_goodbye_lets_the_command_finish() -> None:
    with Lifeline() as lifeline:
        shim = run_guarded(lifeline, [sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert shim.wait(timeout=10) == 0  # the lifeline closed with a goodbye: not killed


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_owner_marks_tell_a_live_owner_from_a_dead_one() -> None:
    assert owner_alive(owner_mark())
    dead = subprocess.Popen(["true"])
    mark = owner_mark(dead.pid) if _alive(dead.pid) else f"{dead.pid}:0.00"
    dead.wait()
    assert not owner_alive(mark) and not owner_alive("") and not owner_alive("x:y")


def test_a_stale_marked_process_is_swept_and_a_live_owners_is_not() -> None:
    stale = subprocess.Popen(["sleep", "303"], env={**os.environ, OWNER_ENV: "1:0.00"})  # pid 1 never started at 0
    live = subprocess.Popen(["sleep", "303"], env={**os.environ, OWNER_ENV: owner_mark()})
    try:
        lines = sweep_stale(None)
        assert any(f"process {stale.pid} " in line and "killed" in line for line in lines), lines
        assert stale.wait(timeout=5) == -signal.SIGKILL
        assert live.poll() is None
    finally:
        for process in (stale, live):
            if process.poll() is None:
                process.kill()
            process.wait()


@pytest.mark.docker
def test_stale_containers_are_found_and_invoke_clean_removes_them(
    docker_client, static_busybox, tracked_images, run_label
):
    import io
    import tarfile

    repo = tracked_images.repo("clean")
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        tar.add(str(static_busybox), arcname="busybox")
        dockerfile = b'FROM scratch\nCOPY busybox /bin/busybox\nCMD ["/bin/busybox", "sleep", "300"]\n'
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    docker_client.images.build(
        fileobj=io.BytesIO(context.getvalue()),
        custom_context=True,
        tag=f"{repo}:x",
        labels=run_label,
        rm=True,
        forcerm=True,
    )
    labels = {**run_label, "bwstack.smoke": "1", OWNER_LABEL: "1:0.00"}
    container = docker_client.containers.run(f"{repo}:x", detach=True, labels=labels, network_mode="none")
    try:
        assert any(item.ident == container.name for item in find_leftovers(docker_client))
        listed = invoke("clean", "--dry-run", "--no-running")
        assert listed.returncode == 0 and f"would remove container {container.name}" in listed.stdout
        container.reload()  # still there after a dry run
        done = invoke("clean", "--no-running")
        assert done.returncode == 0 and f"removed container {container.name}" in done.stdout
        assert not docker_client.containers.list(
            all=True, filters={"label": f"{TEST_RUN_LABEL}={run_label[TEST_RUN_LABEL]}"}
        )
    finally:
        for leftover in docker_client.containers.list(
            all=True, filters={"label": f"{TEST_RUN_LABEL}={run_label[TEST_RUN_LABEL]}"}
        ):
            leftover.remove(force=True)


def test_the_next_run_reports_and_removes_what_a_killed_run_left() -> None:
    from tests.paths import package

    stale = subprocess.Popen(["sleep", "304"], env={**os.environ, OWNER_ENV: "1:0.00"})
    try:
        result = invoke("verify", "--arch", "sm120", "--path", str(package("good")))
        assert result.returncode == 0, result.stderr
        assert f"bwstack: verify: removed process {stale.pid} (sleep 304" in result.stderr
        assert stale.wait(timeout=5) == -signal.SIGKILL
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait()
