"""Every start-up scenario as a real process tree (the SGLang emulator, multi-rank): verdict, phase,
evidence, and nothing left running afterwards."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bwstack.report import Status
from bwstack.smoke import SmokeRequest, run_smoke
from bwstack.smoke.gpu import GpuReading
from bwstack.smoke.phases import vocabulary
from tests.emulator.support import emulator_command, free_port, processes_mentioning

STALL = 1.5


@pytest.fixture
def port() -> Iterator[int]:
    """A free port; after the test no process mentioning it may be alive."""
    chosen = free_port()
    yield chosen
    left = processes_mentioning(f"--port {chosen}")
    assert not left, f"left running: {[p.pid for p in left]}"


def smoke(command: tuple[str, ...], port: int, logs: Path, *, startup: float = 10.0, stall: float = STALL, **kw: Any):
    """One run; its server log under `logs` (the test's tmp_path): the default, a new folder under the temp
    folder that is kept for people to read, would pile up with every test run."""
    lines: list[str] = []
    gpu = kw.pop("gpu", None)
    request = SmokeRequest(
        command=command,
        port=port,
        startup_timeout_s=startup,
        stall_timeout_s=stall,
        grace_s=2.0,
        log_path=logs / "server.log",
        **kw,
    )
    report = run_smoke(request, progress=lines.append, gpu=gpu)
    data = report.to_dict()
    assert data["cleanup"]["clean"], data["cleanup"]
    assert not [p for p in data["processes"] if _alive(p["pid"])], "a process of the tree survived"
    return report, data, lines


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"


def checks(report) -> dict[str, Status]:
    return {c.name: c.status for c in report.checks}


def test_healthy_start_is_ready_with_every_probe_passed(port: int, tmp_path: Path) -> None:
    report, data, lines = smoke(emulator_command(port, "healthy", "--warmup-s", "1.0"), port, tmp_path)
    assert (data["verdict"], data["phase"]) == ("ready", "ready")
    assert report.exit_code == 0
    assert 0 < data["listening_after_s"] <= data["ready_after_s"] <= data["elapsed_s"]
    assert checks(report) == {
        "verdict": Status.PASS,
        "launch": Status.PASS,
        "startup": Status.PASS,
        "tcp": Status.PASS,
        "health": Status.PASS,
        "models": Status.PASS,
        "completion": Status.PASS,
        "cleanup": Status.PASS,
    }
    assert data["completion_text"].strip().startswith("Paris")
    phases = [h["phase"] for h in data["phase_history"]]
    order = list(vocabulary("sglang").names)
    # forward only, but for shards-loaded (a state) undone when a drifting rank's bar starts after the others closed
    undone = [i for i, p in enumerate(phases) if p == "loading-weights" and "shards-loaded" in phases[:i]]
    phases = [p for i, p in enumerate(phases) if i not in undone]
    assert phases == sorted(phases, key=order.index)
    # shards-loaded may be passed over: one rank's `Load weight end` can come before the other rank's 64/64;
    # the draft phases and the deferred weight commit belong to speculative and overlapped starts only
    skipped = ("shards-loaded", "draft-loading-weights", "draft-cuda-graph", "weights-committed")
    assert [p for p in order if p not in skipped] == [p for p in phases if p not in skipped]
    assert data["probes"]["health"]["attempts"] >= 2  # it saw the warm-up 503 first
    assert any("smoke: phase cuda-graph: " in line for line in lines)  # progress lines as phases change
    assert len([p for p in data["processes"] if p["python"]]) == 3  # main + two ranks


def test_incident_is_a_hang_in_shards_loaded_named_within_stall_timeout(port: int, tmp_path: Path) -> None:
    report, data, lines = smoke(emulator_command(port, "incident"), port, tmp_path)
    last_output = Path(data["log_path"]).stat().st_mtime
    assert (data["verdict"], data["phase"]) == ("hang", "shards-loaded")
    assert data["summary"].startswith("hang in shards-loaded: checkpoint fully read on every rank")
    assert "(bars: 2 bars closed at 64/64)" in data["summary"]
    assert STALL <= data["verdict_at"] - last_output <= STALL + 2
    assert report.exit_code == 1
    # the log ends as in the incident: both ranks' bars at 64/64, nothing after them
    assert [line.split("|")[1].split("[")[0].strip() for line in data["log_tail"][-2:]] == ["64/64", "64/64"]
    processes = data["processes"]
    assert len(processes) == 3 and {p["state"] for p in processes} == {"S"}
    assert all(p["wchan"] and p["threads"] >= 1 and p["cpu_user_s"] >= 0 for p in processes)
    dumps = data["diagnosis"]["py_spy"]["dumps"]
    assert len(dumps) == 3 and all(d["ok"] for d in dumps)
    assert sum("process_weights_after_loading" in d["text"] for d in dumps) == 2  # both ranks, asleep there
    assert "main threads in process_weights_after_loading x2" in data["diagnosis"]["summary"]
    assert sum("main thread in process_weights_after_loading" in line for line in lines) == 2
    assert any(n.startswith("py-spy points at: kernels for this GPU missing") for n in data["diagnosis"]["notes"])
    assert data["diagnosis"]["gpu"]["available"] is False and data["diagnosis"]["gpu"]["reason"]
    tries = [t for cause in data["diagnosis"]["likely_causes"] for t in cause["try"]]
    assert any("invoke verify" in t for t in tries) and any("NCCL_P2P_DISABLE=1" in t for t in tries)
    assert checks(report)["diagnosis"] is Status.WARN
    assert any(line.endswith(data["summary"]) for line in lines)


def test_a_capture_hang_is_named_as_the_target_capture_that_never_ended(port: int, tmp_path: Path) -> None:
    report, data, _ = smoke(emulator_command(port, "capture-hang", "--bars", "rank0"), port, tmp_path)
    assert (data["verdict"], data["phase"]) == ("hang", "cuda-graph")
    assert "capture began, never ended (target decode)" in data["summary"]
    tries = [t for cause in data["diagnosis"]["likely_causes"] for t in cause["try"]]
    assert any("--cuda-graph-backend-decode disabled" in t for t in tries)
    assert report.exit_code == 1


def test_a_draft_capture_hang_is_its_own_phase_after_the_drafts_load(port: int, tmp_path: Path) -> None:
    report, data, _ = smoke(emulator_command(port, "draft-capture-hang", "--bars", "rank0"), port, tmp_path)
    assert (data["verdict"], data["phase"]) == ("hang", "draft-cuda-graph")
    assert "the draft model's CUDA graph capture began, never ended (draft decode)" in data["summary"]
    phases = [h["phase"] for h in data["phase_history"]]
    assert phases[phases.index("weights-loaded") :] == [
        "weights-loaded", "draft-loading-weights", "memory-pool", "cuda-graph", "draft-cuda-graph"
    ]  # fmt: skip
    tries = [t for cause in data["diagnosis"]["likely_causes"] for t in cause["try"]]
    assert any("--speculative-draft-attention-backend" in t for t in tries)
    assert report.exit_code == 1


def test_crash_with_no_kernel_image_names_the_signature_and_invoke_verify(port: int, tmp_path: Path) -> None:
    report, data, _ = smoke(emulator_command(port, "crash-no-kernel-image"), port, tmp_path)
    assert (data["verdict"], data["phase"]) == ("crash", "cuda-graph")
    assert data["exit"]["code"] == 1
    signatures = data["diagnosis"]["signatures"]
    assert [s["name"] for s in signatures] == ["no-kernel-image"]
    assert "invoke verify" in signatures[0]["remedy"]
    verdict = report.checks[0]
    assert verdict.name == "verdict" and "invoke verify" in (verdict.remedy or "")
    assert any("no kernel image is available" in line for line in data["log_tail"])


def test_slow_but_steady_start_is_not_a_hang(port: int, tmp_path: Path) -> None:
    # 5 shards at 0.45 s (2.25 s of loading) and a 2 s silent-but-busy capture: each longer than the stall timeout
    command = emulator_command(port, "slow-progress", "--shards", "5", "--shard-s", "0.45", "--busy-s", "2.0")
    _, data, _ = smoke(command, port, tmp_path, startup=15.0)
    assert (data["verdict"], data["phase"]) == ("ready", "ready")
    history = {h["phase"]: h["at_s"] for h in data["phase_history"]}
    assert history["weights-loaded"] - history["loading-weights"] > STALL
    assert history["http-startup"] - history["cuda-graph"] > STALL


def test_busy_silent_start_ends_as_timeout_not_hang(port: int, tmp_path: Path) -> None:
    _, data, _ = smoke(emulator_command(port, "busy-silent"), port, tmp_path, startup=3.5)
    assert (data["verdict"], data["phase"]) == ("timeout", "loading-weights")
    assert "still working (CPU" in data["summary"]
    assert any(p["state"] == "R" for p in data["processes"])
    assert data["diagnosis"]["likely_causes"][0]["try"] == ["raise --startup-timeout"]


def test_health_503_forever_is_unhealthy(port: int, tmp_path: Path) -> None:
    report, data, _ = smoke(emulator_command(port, "health-503"), port, tmp_path, startup=3.5)
    assert (data["verdict"], data["phase"]) == ("unhealthy", "listening")
    assert data["listening_after_s"] is not None and data["ready_after_s"] is None
    assert checks(report)["health"] is Status.FAIL and checks(report)["models"] is Status.SKIP
    assert "503" in data["probes"]["health"]["detail"]
    assert "but GET /health kept failing until" in data["summary"]  # the failing probe, by its request


def test_a_completion_that_never_returns_is_a_hang_named_within_the_stall_timeout(port: int, tmp_path: Path) -> None:
    # /health and /v1/models answer, the completion request sleeps forever: the request used to block the
    # watch loop for 30 s (twice), and the finding said "/health never answered"
    report, data, _ = smoke(emulator_command(port, "completion-never-returns"), port, tmp_path, startup=30.0)
    last_output = Path(data["log_path"]).stat().st_mtime  # the access-log line of the /v1/models reply
    assert (data["verdict"], data["phase"]) == ("hang", "listening")
    assert STALL <= data["verdict_at"] - last_output <= STALL + 2
    assert data["summary"].startswith(
        "hang in listening: the server listens and GET /health, GET /v1/models passed, "
        "but POST /v1/completions never returned a completion (no log output, no CPU progress, no HTTP reply"
    )
    assert "/health never answered" not in data["summary"]
    assert checks(report)["health"] is Status.PASS and checks(report)["models"] is Status.PASS
    assert data["probes"]["completion"]["detail"].startswith("no reply within")
    assert data["probes"]["completion"]["seconds"] <= STALL + 0.5  # bounded by the stall window, not 30 s
    assert "completion probe fails" in data["diagnosis"]["likely_causes"][0]["cause"]


def test_a_log_that_says_listening_on_a_port_that_never_accepts_names_the_tcp_probe(tmp_path: Path) -> None:
    port = free_port()
    marker = f"{time.time_ns() % 10_000_000 + 5_000_000}"
    said = f"INFO:     Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C to quit)"
    _, data, _ = smoke(("sh", "-c", f"echo '{said}'; exec sleep {marker}"), port, tmp_path)
    assert (data["verdict"], data["phase"]) == ("hang", "listening")
    assert data["summary"].startswith(
        f"hang in listening: the log says it listens, but a TCP connection to 127.0.0.1:{port} was never accepted"
    )
    assert not processes_mentioning(f"sleep {marker}")


def test_a_completion_without_choices_is_unhealthy(port: int, tmp_path: Path) -> None:
    report, data, _ = smoke(emulator_command(port, "bad-completion"), port, tmp_path, startup=3.0)
    assert (data["verdict"], data["phase"]) == ("unhealthy", "listening")
    assert checks(report)["health"] is Status.PASS and checks(report)["completion"] is Status.FAIL
    assert "reply has no choices" in data["probes"]["completion"]["detail"]


def test_exit_at_once_is_a_crash_in_launching(port: int, tmp_path: Path) -> None:
    _, data, _ = smoke(emulator_command(port, "exit-at-once"), port, tmp_path)
    assert (data["verdict"], data["phase"]) == ("crash", "launching")
    assert data["exit"]["code"] == 2 and data["elapsed_s"] < 3
    assert "invalid int value" in data["log_tail"][-1]


def test_gpu_activity_through_the_nvml_seam_keeps_a_silent_server_from_being_called_hung(
    port: int, tmp_path: Path
) -> None:
    class BusyGpu:
        available = True
        reason = ""

        def read(self) -> list[GpuReading]:
            return [GpuReading(0, "RTX PRO 6000", 97, 90_000, 97_887)]

        def close(self) -> None:
            return None

    _, data, _ = smoke(emulator_command(port, "incident"), port, tmp_path, startup=4.0, gpu=BusyGpu())
    assert (data["verdict"], data["phase"]) == ("timeout", "shards-loaded")
    assert "GPU" in data["summary"]
    assert data["diagnosis"]["gpu"]["gpus"][0]["util_percent"] == 97


def test_a_server_silent_from_the_start_hangs_in_launching_and_a_setsid_child_is_still_stopped(tmp_path: Path) -> None:
    port = free_port()
    marker = f"{time.time_ns() % 10_000_000 + 7_000_000}"  # a unique sleep length to find stragglers by
    command = ("sh", "-c", f"setsid sleep {marker} & exec sleep {marker}")
    _, data, _ = smoke(command, port, tmp_path)
    assert (data["verdict"], data["phase"]) == ("hang", "launching")
    assert len(data["processes"]) == 2
    assert data["diagnosis"]["py_spy"]["note"] == "no Python process in the tree"
    assert not processes_mentioning(f"sleep {marker}")


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    port = free_port()
    marker = f"{time.time_ns() % 10_000_000 + 3_000_000}"
    command = (
        sys.executable,
        "-c",
        f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep({marker})",
    )
    request = SmokeRequest(
        command=command, port=port, startup_timeout_s=5, stall_timeout_s=1.0, grace_s=0.5, log_path=tmp_path / "s.log"
    )
    data = run_smoke(request).to_dict()
    assert data["verdict"] == "hang"
    assert data["cleanup"]["killed"] and data["cleanup"]["clean"]
    assert "SIGKILL after 0.5 s" in data["cleanup"]["method"]
    assert not processes_mentioning(f"time.sleep({marker})")


def test_env_reaches_the_server(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    command = ("sh", "-c", 'echo "NCCL_P2P_DISABLE=$NCCL_P2P_DISABLE"; exit 3')
    request = SmokeRequest(command=command, port=port, env={"NCCL_P2P_DISABLE": "1"}, log_path=log)
    data = run_smoke(request).to_dict()
    assert (data["verdict"], data["exit"]["code"]) == ("crash", 3)
    assert log.read_text() == "NCCL_P2P_DISABLE=1\n" and data["log_path"] == str(log)


def test_a_port_that_accepts_but_never_answers_is_a_hang_in_listening(tmp_path: Path) -> None:
    port = free_port()
    server = f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(600)"
    _, data, _ = smoke((sys.executable, "-c", server), port, tmp_path)
    assert (data["verdict"], data["phase"]) == ("hang", "listening")
    assert "no HTTP reply" in data["summary"] and data["probes"]["health"]["detail"].startswith("no reply within")
    assert data["elapsed_s"] <= data["listening_after_s"] + STALL + 2
    assert not processes_mentioning(f"s.bind(('127.0.0.1', {port}))")
