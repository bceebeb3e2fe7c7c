"""A bench against a running server (--url) or one smoke starts, measures while ready, and stops.

Starting goes through smoke, so a server that never becomes ready is named as smoke names it (crash,
hang, timeout) and its phase timings land in the history like any smoke run's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bwstack.bench.levels import BenchSettings, LevelResult, Progress, run_bench
from bwstack.errors import BenchError
from bwstack.report import Check, Report, Status
from bwstack.smoke import SmokeRequest, run_smoke
from bwstack.smoke.history import HistoryOptions
from bwstack.smoke.session import ReadyServer


@dataclass(frozen=True)
class Target:
    """Where to bench: a URL, or a smoke request whose server is started for the bench."""

    url: str | None = None
    smoke: SmokeRequest | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (self.smoke is None):
            raise BenchError("give exactly one of --url, --command or --model")

    def describe(self) -> str:
        if self.url:
            return self.url
        assert self.smoke is not None
        text = self.smoke.image or " ".join(self.smoke.command or ()) or str(self.smoke.model)
        return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class Measurement:
    target: Target
    levels: list[LevelResult] = field(default_factory=list)
    model: str = ""
    url: str = ""
    smoke: Report | None = None  # the smoke run that started the server, when one did

    @property
    def served(self) -> bool:
        return bool(self.levels)


def measure(
    target: Target,
    settings: BenchSettings,
    *,
    progress: Progress | None = None,
    say: Callable[[str], None] | None = None,
    history: HistoryOptions | None = None,
) -> Measurement:
    """Bench `target`; with a smoke request the server is started first and stopped after."""
    result = Measurement(target)
    if target.url:
        result.url = target.url
        result.levels, result.model = run_bench(target.url, settings, progress=progress)
        return result
    assert target.smoke is not None

    def bench_ready(server: ReadyServer) -> None:
        if say:
            say(f"bench: {server.url} is ready; measuring")
        result.url = server.url
        result.levels, result.model = run_bench(server.url, settings, log_path=server.log_path, progress=progress)

    result.smoke = run_smoke(target.smoke, progress=say, on_ready=bench_ready, history=history)
    return result


def _level_check(level: LevelResult, min_output_tok_s: float | None) -> Check:
    ttft, itl = level.ttft_ms["p50"], level.itl_ms["p50"]
    accept = f", accept length {level.acceptance.accept_length:g}" if level.acceptance.accept_length else ""
    finding = (
        f"{level.output_tok_s:.1f} output tok/s, {level.request_s:.2f} req/s, TTFT p50 {ttft} ms, "
        f"ITL p50 {itl} ms{accept} ({level.requests - level.errors}/{level.requests} requests)"
    )
    status, remedy = Status.PASS, None
    if level.errors:
        status = Status.FAIL
        finding = f"{level.errors} of {level.requests} requests failed: {'; '.join(level.error_samples[:2])}"
        remedy = "read the server log for the failed requests; lower --concurrency if it ran out of KV cache"
    elif min_output_tok_s is not None and level.output_tok_s < min_output_tok_s:
        status = Status.FAIL
        finding = f"{level.output_tok_s:.1f} output tok/s is under --min-output-tok-s {min_output_tok_s:g}"
        remedy = "compare with an earlier bench of the same recipe and image (invoke history)"
    return Check(f"concurrency {level.concurrency}", status, finding, evidence=level.to_dict(), remedy=remedy)


def bench_report(
    measurement: Measurement, settings: BenchSettings, *, min_output_tok_s: float | None = None, kind: str = "bench"
) -> Report:
    report = Report(kind=kind, subject=measurement.target.describe())
    smoke = measurement.smoke
    if smoke is not None:
        ready = smoke.data.get("verdict") == "ready"
        report.add(
            Check(
                "server",
                Status.PASS if ready else Status.FAIL,
                f"smoke: {smoke.data.get('summary', '')}",
                evidence={k: smoke.data.get(k) for k in ("verdict", "phase", "ready_after_s", "log_path", "history")},
                remedy=None if ready else next((c.remedy for c in smoke.failures() if c.remedy), None),
            )
        )
        cleanup = next((c for c in smoke.checks if c.name == "cleanup"), None)
        if cleanup is not None:
            report.add(cleanup)
        regression = next((c for c in smoke.checks if c.name == "regression"), None)
        if regression is not None:
            report.add(regression)
    for level in measurement.levels:
        report.add(_level_check(level, min_output_tok_s))
    report.data.update(
        {
            "url": measurement.url,
            "model": measurement.model,
            "settings": {
                "requests": settings.requests,
                "concurrency": list(settings.concurrency),
                "input_len": settings.input_len,
                "output_len": settings.output_len,
                "seed": settings.seed,
            },
            "levels": [level.to_dict() for level in measurement.levels],
            "smoke": _smoke_summary(smoke),
        }
    )
    return report


def _smoke_summary(smoke: Report | None) -> dict[str, Any] | None:
    if smoke is None:
        return None
    keys = ("verdict", "summary", "ready_after_s", "phase_history", "log_path", "history")
    return {k: smoke.data.get(k) for k in keys}
