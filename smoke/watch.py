"""The watcher: one loop that follows the log, samples activity, probes the port, and returns a verdict.

Verdicts, exactly these words:
  ready      every probe passed (TCP, /health 200, /v1/models, one checked completion)
  crash      the server exited before it was ready
  hang       for --stall-timeout seconds: no new log output, no CPU progress anywhere in the process tree,
             no GPU activity (where NVML is available) and no HTTP reply; named with the phase it stalled in
  timeout    --startup-timeout passed while it was still working (busy, not ready, never listening)
  unhealthy  it listened, but /health, /v1/models or the completion kept failing until --startup-timeout

A stall is detected within one poll interval of --stall-timeout (0.25 s by default): well inside the
2 s the issue allows. Once the port is open, every HTTP reply (even a 503) counts as a sign of life,
so a server that answers but never becomes healthy ends as `unhealthy`, not `hang`. An HTTP request
blocks the loop, so each one is given only what is left of the stall window (and of the startup
timeout): a request that never returns times out when the stall is due, and the loop looks again
(log, exit, activity) before it judges.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bwstack.smoke import phases as ph
from bwstack.smoke.activity import ActivityMonitor
from bwstack.smoke.launch import ExitStatus, Server
from bwstack.smoke.logfollow import FileFollower
from bwstack.smoke.phases import PhaseTracker
from bwstack.smoke.probe import REQUESTS, ReadinessProbe

Progress = Callable[[str], None]


class Verdict(StrEnum):
    READY = "ready"
    CRASH = "crash"
    HANG = "hang"
    TIMEOUT = "timeout"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class WatchConfig:
    startup_timeout_s: float
    stall_timeout_s: float
    poll_s: float = 0.25
    health_interval_s: float = 0.5
    heartbeat_s: float = 30.0


@dataclass
class Outcome:
    verdict: Verdict
    phase: str
    summary: str  # "hang in shards-loaded: checkpoint fully read, weights never finished (...)"
    elapsed_s: float
    verdict_at: float  # wall clock (epoch seconds) when the verdict was reached
    listening_after_s: float | None = None
    ready_after_s: float | None = None
    stalled_for_s: float | None = None
    busy: bool = False  # CPU or GPU activity during the last stall window (timeout: still working)
    exit: ExitStatus | None = None
    phase_history: list[dict[str, Any]] = field(default_factory=list)
    last_activity: dict[str, float | None] = field(default_factory=dict)  # seconds since start of each signal


class Watcher:
    def __init__(
        self,
        server: Server,
        follower: FileFollower,
        tracker: PhaseTracker,
        activity: ActivityMonitor,
        probe: ReadinessProbe,
        config: WatchConfig,
        *,
        progress: Progress | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.follower = follower
        self.tracker = tracker
        self.activity = activity
        self.probe = probe
        self.config = config
        self._progress = progress or (lambda _line: None)
        self._clock = clock
        self.started = clock()
        self.history: list[dict[str, Any]] = [{"phase": tracker.phase, "at_s": 0.0, "line": ""}]
        self.listening_at: float | None = None
        self.last_output = self.started
        self.last_cpu = self.started
        self.last_gpu: float | None = None
        self.last_reply: float | None = None
        self._last_health: float | None = None
        self._last_heartbeat = self.started
        self._last_probe_detail: dict[str, str] = {}

    # --- helpers -----------------------------------------------------------------------------------

    def _at(self, now: float) -> float:
        return round(now - self.started, 2)

    def say(self, now: float, text: str) -> None:
        del now  # the progress callback stamps its own time
        self._progress(text)

    def _advance(self, now: float, name: str, line: str = "") -> None:
        change = self.tracker.advance(name, line)
        if change:
            self._record(now, change.phase, change.line)

    def _record(self, now: float, phase: str, line: str) -> None:
        self.history.append({"phase": phase, "at_s": self._at(now), "line": line[:200]})
        shown = f": {line.strip()[:100]}" if line.strip() else ""
        self.say(now, f"phase {phase}{shown}")

    def _read_log(self, now: float) -> None:
        before = self.follower.bytes_read
        for line in self.follower.read_new():
            change = self.tracker.feed(line)
            if change:
                self._record(now, change.phase, change.line)
        if self.follower.bytes_read > before:
            self.last_output = now

    def _quiet_since(self) -> float:
        """When the last sign of life came: log output, CPU progress, GPU activity or an HTTP reply."""
        return max(self.last_output, self.last_cpu, self.last_gpu or 0.0, self.last_reply or 0.0)

    def _exited(self) -> Outcome | None:
        status = self.server.poll()
        if status is None:
            return None
        self.follower.read_all_new()
        self._read_log(self._clock())
        return self._crash(self._clock(), status)

    def _outcome(self, now: float, verdict: Verdict, summary: str, **extra: Any) -> Outcome:
        def ago(at: float | None) -> float | None:
            return None if at is None else round(at - self.started, 2)

        ready_after = extra.pop("ready_after_s", None)
        return Outcome(
            verdict=verdict,
            phase=self.tracker.phase,
            summary=summary,
            elapsed_s=round(now - self.started, 2),
            verdict_at=time.time(),
            listening_after_s=ago(self.listening_at),
            ready_after_s=ready_after,
            phase_history=self.history,
            last_activity={
                "log_output_s": ago(self.last_output),
                "cpu_progress_s": ago(self.last_cpu),
                "gpu_activity_s": ago(self.last_gpu),
                "http_reply_s": ago(self.last_reply),
            },
            **extra,
        )

    # --- the loop ----------------------------------------------------------------------------------

    def run(self) -> Outcome:
        config = self.config
        self.say(self.started, f"started {self.server.describe()}; log {self.server.log_path}")
        while True:
            now = self._clock()
            self._read_log(now)
            outcome = self._exited() or self._probe(now)
            if outcome is not None:
                return outcome

            # a probe may have blocked for seconds: look again (log, exit) before judging a stall
            now = self._clock()
            self._read_log(now)
            outcome = self._exited()
            if outcome is not None:
                return outcome

            sample = self.activity.sample(now)
            if sample.cpu_progress:
                self.last_cpu = now
            if sample.gpu_active:
                self.last_gpu = now

            quiet = now - self._quiet_since()
            if quiet >= config.stall_timeout_s:
                return self._hang(now, quiet)

            if now - self.started >= config.startup_timeout_s:
                return self._timeout(now)

            if now - self._last_heartbeat >= config.heartbeat_s:
                self._last_heartbeat = now
                self.say(
                    now,
                    f"still in {self.tracker.phase}: log {self.follower.bytes_read} bytes, "
                    f"{sample.processes} processes, {sample.cpu_total_s:.1f} s CPU, quiet {quiet:.1f} s",
                )
            time.sleep(max(0.0, config.poll_s - (self._clock() - now)))

    def _probe(self, now: float) -> Outcome | None:
        if self.listening_at is None:
            if self.probe.step() is None or not self.probe.results["tcp"].ok:
                return None
            self.listening_at = now
            self._advance(now, ph.LISTENING)
            self.say(now, f"listening on {self.probe.host}:{self.probe.port}")
        if self._last_health is not None and now - self._last_health < self.config.health_interval_s:
            return None
        self._last_health = now
        while not self.probe.ready:
            step = self.probe.current
            at = self._clock()
            self._read_log(at)  # output written before this request counts from now, not from its end
            # a request blocks the loop: it may use only what is left of the stall window and the startup
            # timeout, so a server that never replies is judged when its stall is due, not 30 s later
            budget = min(
                self.config.startup_timeout_s - (at - self.started),
                self.config.stall_timeout_s - (at - self._quiet_since()),
            )
            if budget <= 0:
                return None  # the loop names the hang or the timeout now
            result = self.probe.step(budget_s=budget)
            if result is None:
                break
            if result.answered:
                self.last_reply = self._clock()
            if self._last_probe_detail.get(result.name) != result.detail:
                self._last_probe_detail[result.name] = result.detail
                self.say(self._clock(), f"{step}: {'ok' if result.ok else 'not yet'} ({result.detail[:100]})")
            if not result.ok:
                return None
        done = self._clock()
        self._advance(done, ph.READY)
        return self._outcome(
            done,
            Verdict.READY,
            f"ready after {done - self.started:.1f} s (listening after {self.listening_at - self.started:.1f} s)",
            ready_after_s=round(done - self.started, 2),
        )

    def _crash(self, now: float, status: ExitStatus) -> Outcome:
        summary = f"crash in {self.tracker.phase}: {status.describe()} after {now - self.started:.1f} s"
        self.say(now, summary)
        return self._outcome(now, Verdict.CRASH, summary, exit=status)

    def _hang(self, now: float, quiet: float) -> Outcome:
        silent = ["no log output", "no CPU progress"]
        if self.activity.gpu.available:
            silent.append("no GPU activity")
        if self.listening_at is not None:
            silent.append("no HTTP reply")
        if self.listening_at is not None:  # name the probe that is failing, not a generic "never answered"
            passed = self.probe.passed_requests()
            stalled = "the server listens" + (f" and {', '.join(passed)} passed" if passed else "")
            stalled += f", but {self.probe.failing()}"
        elif self.tracker.phase == ph.LISTENING:  # its log says so, the port does not accept
            stalled = f"the log says it listens, but {self.probe.failing()}"
        else:
            stalled = self.tracker.stalled_description()
        summary = f"hang in {self.tracker.phase}: {stalled} ({', '.join(silent)} for {quiet:.1f} s)"
        self.say(now, summary)
        return self._outcome(now, Verdict.HANG, summary, stalled_for_s=round(quiet, 2))

    def _timeout(self, now: float) -> Outcome:
        elapsed = now - self.started
        window = now - self.config.stall_timeout_s
        signs = {"CPU": self.last_cpu, "log output": self.last_output, "GPU": self.last_gpu, "HTTP": self.last_reply}
        working = [name for name, at in signs.items() if at is not None and at > window]
        busy = self.last_cpu > window or (self.last_gpu is not None and self.last_gpu > window)
        if self.listening_at is not None:
            failing = self.probe.current or "completion"
            detail = self.probe.results[failing].detail if failing in self.probe.results else "no reply"
            summary = (
                f"unhealthy in {self.tracker.phase}: listening after {self.listening_at - self.started:.1f} s, "
                f"but {REQUESTS[failing]} kept failing until {elapsed:.1f} s (last: {detail[:120]})"
            )
            self.say(now, summary)
            return self._outcome(now, Verdict.UNHEALTHY, summary, busy=busy)
        summary = (
            f"timeout in {self.tracker.phase}: still working ({', '.join(working) or 'no sign'}) "
            f"but not ready after {elapsed:.1f} s"
        )
        self.say(now, summary)
        return self._outcome(now, Verdict.TIMEOUT, summary, busy=busy)
