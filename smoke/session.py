"""One smoke run, start to finish: refuse a busy port, launch, watch, diagnose, stop everything, report."""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bwstack.errors import SmokeError
from bwstack.report import Report
from bwstack.smoke import diagnose as dx
from bwstack.smoke.activity import ActivityMonitor
from bwstack.smoke.cleanup import CleanupResult
from bwstack.smoke.gpu import GpuSampler, open_gpu_sampler
from bwstack.smoke.history import HistoryOptions, file_run, image_id, run_key
from bwstack.smoke.interrupt import TerminationGuard
from bwstack.smoke.launch import (
    ContainerServer,
    LaunchSpec,
    ProcessServer,
    Server,
    check_log_path,
    docker_client,
    unique_name,
)
from bwstack.smoke.logfollow import FileFollower
from bwstack.smoke.phases import PhaseTracker, vocabulary
from bwstack.smoke.probe import ReadinessProbe, port_open, resolve_host
from bwstack.smoke.reporting import build_report
from bwstack.smoke.request import ServerCommand, SmokeRequest, resolve_command
from bwstack.smoke.watch import Outcome, Verdict, WatchConfig, Watcher

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReadyServer:
    """A server smoke found ready, handed to `on_ready` while it still runs (bench measures it there)."""

    host: str
    port: int
    log_path: Path
    engine: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def _stamped(progress: Progress | None) -> Progress:
    """Progress lines for people watching a long start: seconds since the run began, then the text.

    A line that cannot be written (the terminal closed: SIGHUP, then EIO on every write) is dropped:
    it must never cut the clean-up short."""
    if progress is None:
        return lambda _line: None
    started = time.monotonic()
    target = progress

    def say(line: str) -> None:
        with contextlib.suppress(OSError):
            target(f"[{time.monotonic() - started:7.1f}s] smoke: {line}")

    return say


def _gpus(request: SmokeRequest, gpu: GpuSampler) -> str:
    if request.gpus != "auto":
        return request.gpus
    return "all" if gpu.available and gpu.read() else "none"


def _log_tail_text(path: Path, limit: int = 1 << 20) -> list[str]:
    """The last `limit` bytes of the log as lines (a crash's traceback can sit above the last 50 lines)."""
    if not path.is_file():  # a FIFO or a device put in its place must not block or spin the diagnosis
        return []
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            data = handle.read()
    except OSError:
        return []
    return re.split(r"\r\n|\r|\n", data.decode("utf-8", errors="replace"))


def _diagnose(
    outcome: Outcome, server: Server, tracker: PhaseTracker, probe: ReadinessProbe, gpu: GpuSampler, progress: Progress
) -> dx.Diagnosis:
    processes = dx.snapshot_processes(server.tree.refresh())
    gpu_info = dx.gpu_evidence(gpu)
    notes: list[str] = []
    if tracker.listen_url:
        said = re.search(r":(\d+)(?:/|$)", tracker.listen_url)
        if said and int(said.group(1)) != probe.port:
            notes.append(f"the server says it runs on {tracker.listen_url}, but smoke probes port {probe.port}")
    signatures = dx.match_signatures(_log_tail_text(server.log_path))
    if outcome.verdict is Verdict.READY:
        return dx.Diagnosis(summary="ready", processes=processes, gpu=gpu_info, py_spy={}, notes=notes)
    if outcome.verdict is Verdict.CRASH:
        exit_text = outcome.exit.describe() if outcome.exit else "exited"
        causes = [] if signatures else dx.crash_causes(str(server.log_path))
        if outcome.exit and (outcome.exit.oom_killed or outcome.exit.signal == 9 or outcome.exit.code == 137):
            notes.append("killed by SIGKILL: often the kernel's OOM killer (check dmesg) or a container memory limit")
        matched = f"; matched {', '.join(s.signature.name for s in signatures)}" if signatures else ""
        return dx.Diagnosis(
            summary=f"{exit_text}{matched}",
            processes=processes,
            gpu=gpu_info,
            py_spy={},
            likely_causes=causes,
            signatures=signatures,
            notes=notes,
        )
    python = [p["pid"] for p in processes if p["python"]]
    progress(f"diagnosing: {len(processes)} processes, py-spy on {len(python)} Python processes")
    py_spy = dx.py_spy_dumps(python, dx.find_py_spy())
    frames = {d["pid"]: dx.main_thread_frame(d["text"]) for d in py_spy["dumps"] if d["ok"]}
    for p in processes:
        where = f"; main thread in {frames[p['pid']]}" if frames.get(p["pid"]) else ""
        progress(
            f"  pid {p['pid']} {p['state']} wchan={p['wchan'] or '-'} threads={p['threads']} "
            f"cpu={p['cpu_user_s'] + p['cpu_system_s']:.2f}s {p['name']}{where}"
        )
    functions = Counter(f.split(" (")[0] for f in frames.values() if f)
    stacks = ", ".join(f"{name} x{count}" if count > 1 else name for name, count in functions.most_common())
    gpu_text = (
        ", ".join(f"GPU{g['index']} {g['util_percent']}% {g['memory_used_mib']} MiB" for g in gpu_info["gpus"])
        if gpu_info["available"]
        else f"GPU unavailable ({gpu_info['reason']})"
    )
    dumps = [d["text"] for d in py_spy["dumps"] if d["ok"]]
    causes = dx.causes_for(
        outcome.phase,
        busy=outcome.verdict is Verdict.TIMEOUT,
        failing_probe=probe.current if outcome.verdict in (Verdict.UNHEALTHY, Verdict.HANG) else None,
        stacks=dumps,
    )
    notes += dx.evidence_notes(outcome.phase, dumps)
    for number, cause in enumerate(causes, 1):
        progress(f"  likely cause {number}: {cause.cause}; try: {' | '.join(cause.tries)}")
        if cause.evidence:
            progress(f"    evidence that tells it apart: {cause.evidence}")
    for note in notes:
        progress(f"  {note}")
    return dx.Diagnosis(
        summary=f"{dx.process_summary(processes)}; py-spy: {py_spy['note']}"
        + (f" (main threads in {stacks})" if stacks else "")
        + f"; {gpu_text}",
        processes=processes,
        py_spy=py_spy,
        gpu=gpu_info,
        likely_causes=causes,
        signatures=signatures,
        notes=notes,
    )


def _launch(
    request: SmokeRequest, command: ServerCommand, log_path: Path, gpus: str, client: Any, guard: TerminationGuard
) -> Server:
    spec = LaunchSpec(
        argv=command.argv,
        log_path=log_path,
        env=dict(request.env),
        image=request.image,
        model_dir=request.model,
        gpus=gpus,
        shm_size=request.shm_size,
        name=unique_name(command.port),
    )
    if client is not None:
        return ContainerServer.start(spec, client, interruptible=guard.interruptible)
    return ProcessServer.start(spec)


def run_smoke(
    request: SmokeRequest,
    *,
    progress: Progress | None = None,
    gpu: GpuSampler | None = None,
    on_ready: Callable[[ReadyServer], None] | None = None,
    history: HistoryOptions | None = None,
) -> Report:
    """Start the server, follow it to a verdict, diagnose, stop everything, and report.

    Raises SmokeError / DockerError / RecipeError (exit 2) when it cannot start at all: a busy port,
    a bad command, an unreachable engine, a missing model folder or recipe; a log folder it made for
    such a run is removed. A SIGTERM, SIGHUP or SIGINT during the run stops the server and then raises
    SmokeInterrupted (a KeyboardInterrupt carrying `signum`: the task exits 128 + signum).

    `on_ready` is called with the server once it is ready, before it is stopped (an exception from it
    still stops the server). With `history`, the run's phase timings are recorded and compared there.
    """
    say = _stamped(progress)
    command = resolve_command(request)
    if request.log_path is not None:
        check_log_path(request.log_path)  # a FIFO or /dev/full must fail now, not block or spin later
    vocab = vocabulary(command.engine)
    resolve_host(request.host, command.port)  # an unresolvable host is bad input, not a server that never listened
    if port_open(request.host, command.port):
        raise SmokeError(
            f"something already listens on {request.host}:{command.port}; smoke never tests a server it did not start",
            remedy="stop that server or pick another --port",
        )
    client = docker_client() if request.image else None  # an unreachable engine: exit 2 before anything starts
    sampler = gpu or open_gpu_sampler()
    # a request that never returns blocks the watch loop: keep every one inside the stall timeout (the
    # watcher also gives each only what is left of the stall window)
    probe = ReadinessProbe(
        request.host,
        command.port,
        request_timeout_s=min(5.0, max(0.5, request.stall_timeout_s / 2)),
        completion_timeout_s=min(30.0, max(0.5, request.stall_timeout_s)),
    )
    cleanup: CleanupResult | None = None
    log_path = request.log_path or Path(tempfile.mkdtemp(prefix="bwstack-smoke-")) / "server.log"
    created_folder = None if request.log_path else log_path.parent
    # SIGTERM (a CI job's timeout, systemctl stop), SIGHUP (a closed terminal) and Ctrl-C raise
    # SmokeInterrupted from here on, so the clean-up below stops the server; Python's default would end
    # smoke at once (or cut the clean-up short) and leave the server running
    with TerminationGuard() as guard:
        try:
            # deferred from the launch to the end of the clean-up: a signal that comes before the server is
            # held, between the watch and the clean-up, or during the clean-up waits until the server is
            # stopped; only the watch, the diagnosis and an image pull are cut at once
            with guard.deferred():
                try:
                    server = _launch(request, command, log_path, _gpus(request, sampler), client, guard)
                except BaseException:
                    if created_folder is not None:  # nothing started: no log to keep, no folder to leave
                        shutil.rmtree(created_folder, ignore_errors=True)
                    raise
                try:  # from here on, whatever happens, the server is stopped
                    tracker = PhaseTracker(vocab)
                    follower = FileFollower(log_path)
                    with guard.interruptible():
                        watcher = Watcher(
                            server,
                            follower,
                            tracker,
                            ActivityMonitor(server.tree, sampler),
                            probe,
                            WatchConfig(request.startup_timeout_s, request.stall_timeout_s, poll_s=request.poll_s),
                            progress=say,
                        )
                        outcome = watcher.run()
                        diagnosis = _diagnose(outcome, server, tracker, probe, sampler, say)
                        if on_ready is not None and outcome.verdict is Verdict.READY:
                            on_ready(ReadyServer(request.host, command.port, log_path, command.engine))
                finally:
                    announced = guard.received
                    if announced is not None:
                        say(f"received {signal.Signals(announced).name}: stopping the server before exiting")
                    say(f"stopping {server.describe()}")
                    cleanup = server.stop(request.grace_s)
                    say(
                        "stopped: nothing left running"
                        if cleanup.clean
                        else f"stopped, but still running: {cleanup.left_running or 'the container'}"
                    )
                    if announced is None and guard.received is not None:
                        say(f"received {signal.Signals(guard.received).name} during the clean-up: exiting")
            follower.read_all_new()
            report = build_report(
                request=request,
                command=command,
                server=server,
                outcome=outcome,
                diagnosis=diagnosis,
                cleanup=cleanup,
                probe=probe,
                log_tail=follower.tail(),
            )
            if history is not None:
                key = run_key(
                    recipe=request.recipe,
                    engine=command.engine,
                    model=request.model,
                    gpu_names=[g.name for g in sampler.read()] if sampler.available else [],
                    image=image_id(client, request.image),
                    command=command.argv if command.source == "--command" else (),
                )
                for found in file_run(history, key, report):
                    say(f"regression: {found.finding}")
            return report
        finally:
            probe.close()
            if client is not None:
                client.close()
            if gpu is None:
                sampler.close()  # only what this run opened
