"""`invoke smoke` end to end: exit codes 0 / 1 / 2, progress on stderr, --json and --junit files."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.emulator.support import emulator_command, free_port, processes_mentioning, signal_smoke_when
from tests.paths import REPO

REQUIRED = ("verdict", "phase", "elapsed_s", "listening_after_s", "ready_after_s", "diagnosis", "log_tail", "processes")


def invoke_smoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "smoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_ready_exits_0_and_writes_json_and_junit(tmp_path: Path) -> None:
    port = free_port()
    command = shlex.join(emulator_command(port, "healthy"))
    done = invoke_smoke(
        "--command", command, "--port", str(port), "--stall-timeout", "3", "--startup-timeout", "20",
        "--json", str(tmp_path / "smoke.json"), "--junit", str(tmp_path / "smoke.xml"),
        "--log", str(tmp_path / "s.log"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert all(key in report for key in REQUIRED)
    assert (report["kind"], report["ok"], report["verdict"]) == ("smoke", True, "ready")
    assert report["log_path"] == str(tmp_path / "s.log") and "fired up" in (tmp_path / "s.log").read_text()
    suite = ET.parse(tmp_path / "smoke.xml").getroot()
    assert suite.get("name") == "bwstack.smoke" and suite.get("failures") == "0"
    assert "verdict" in [case.get("name") for case in suite]
    assert "smoke: phase loading-weights" in done.stderr and "smoke: stopped: nothing left running" in done.stderr
    assert "PASS" in done.stdout
    assert not processes_mentioning(f"--port {port}")


def test_a_hang_exits_1_with_its_report(tmp_path: Path) -> None:
    port = free_port()
    command = shlex.join(emulator_command(port, "incident"))
    done = invoke_smoke(
        "--command", command, "--port", str(port), "--stall-timeout", "1.5", "--json", str(tmp_path / "r.json"),
        "--junit", str(tmp_path / "r.xml"), "--log", str(tmp_path / "s.log"),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["verdict"], report["phase"]) == ("hang", "shards-loaded")
    assert "smoke: hang in shards-loaded: checkpoint fully read on every rank" in done.stderr
    failures = ET.parse(tmp_path / "r.xml").getroot().findall("testcase/failure")
    assert failures[0].get("message", "").startswith("hang in shards-loaded")
    assert not processes_mentioning(f"--port {port}")


def test_a_busy_port_exits_2_without_starting_anything() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = invoke_smoke("--command", "sleep 4711.5", "--port", str(port))
    assert done.returncode == 2
    assert f"bwstack: error: something already listens on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert not processes_mentioning("sleep 4711.5")


def test_bad_input_and_a_missing_docker_engine_exit_2(tmp_path: Path) -> None:
    done = invoke_smoke("--model", str(tmp_path / "nope"))
    assert done.returncode == 2 and "model folder" in done.stderr and "does not exist" in done.stderr
    port = str(free_port())
    no_engine = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    done = invoke_smoke("--command", "serve", "--port", port, "--image", "stack:tag", env=no_engine)
    assert done.returncode == 2 and "Docker engine unreachable" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_run_that_starts_nothing_leaves_no_log_folder(tmp_path: Path) -> None:
    # the folder smoke makes for the server log was kept, empty, after an exit 2 that started nothing
    done = invoke_smoke(
        "--command", f"{tmp_path}/no-such-server", "--port", str(free_port()), env={"TMPDIR": str(tmp_path)}
    )  # fmt: skip
    assert done.returncode == 2 and "cannot start" in done.stderr, done.stderr
    assert not list(tmp_path.glob("bwstack-smoke-*"))


def test_a_bad_image_reference_leaves_no_log_folder(docker_client: object, tmp_path: Path) -> None:
    port = str(free_port())
    done = invoke_smoke(
        "--image", "Not A Reference!!", "--command", "serve", "--port", port, "--gpus", "none",
        env={"TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2 and "cannot create a container from Not A Reference!!" in done.stderr, done.stderr
    assert not list(tmp_path.glob("bwstack-smoke-*"))


def test_a_bad_shm_size_exits_2_with_one_line() -> None:
    # docker-py refused it while building the container's host config: a traceback, after the engine was asked
    done = invoke_smoke("--image", "stack:tag", "--command", "serve", "--port", str(free_port()), "--shm-size", "lots")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("bwstack: error: --shm-size 'lots'")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_an_unresolvable_host_exits_2_with_one_line() -> None:
    done = invoke_smoke("--command", "sleep 4711.875", "--port", str(free_port()), "--host", "no such host!!")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("bwstack: error: --host 'no such host!!' does not resolve")
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not processes_mentioning("sleep 4711.875")


def test_sigterm_to_smoke_stops_the_server_before_smoke_exits(tmp_path: Path) -> None:
    # a CI job's timeout or systemctl stop: Python's default for SIGTERM skipped every `finally`, and the
    # server's process group stayed behind
    port = free_port()
    command = shlex.join(emulator_command(port, "incident"))
    args = ["--command", command, "--port", str(port), "--stall-timeout", "60", "--log", str(tmp_path / "s.log")]
    try:
        code, stderr = signal_smoke_when(args, "smoke: phase shards-loaded", signal.SIGTERM)
        left = [p for p in processes_mentioning(f"--port {port}") if "sglang_emulator.py" in str(p.info["cmdline"])]
    finally:
        for process in processes_mentioning(f"--port {port}"):  # whatever a failed run left: not for the next
            process.kill()
    assert not left, f"left running after SIGTERM: {[p.pid for p in left]}"
    assert code == 143, stderr  # 128 + SIGTERM, and no report as if it had finished
    assert "bwstack: interrupted by SIGTERM" in stderr
    assert "smoke: received SIGTERM: stopping the server before exiting" in stderr
    assert "smoke: stopped: nothing left running" in stderr and "Traceback" not in stderr


def test_hostile_log_paths_are_one_line_and_exit_2_at_once(tmp_path: Path) -> None:
    """A FIFO would block smoke in open() (deaf to SIGTERM), /dev/full reads as endless zeros (a busy loop),
    a directory or a kernel file cannot hold a log, a path under a file cannot exist."""
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    (tmp_path / "file").write_text("x")
    cases = {
        str(fifo): "is a FIFO, not a regular file",
        "/dev/full": "is a device, not a regular file",
        str(tmp_path): "is a directory",
        "/proc/version": "cannot be written",
        str(tmp_path / "file" / "server.log"): "cannot be used: Not a directory",
    }
    port = free_port()
    for log, said in cases.items():
        done = invoke_smoke("--command", "sleep 60", "--port", str(port), "--log", log)
        assert done.returncode == 2, (log, done.stderr)
        assert done.stderr.count("\n") == 1 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not processes_mentioning("sleep 60")
