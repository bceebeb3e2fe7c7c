"""A smoke run as the shared Report: checks for people and CI, the evidence under `data`."""

from __future__ import annotations

from bwstack.report import Check, Report, Status
from bwstack.smoke.cleanup import CleanupResult
from bwstack.smoke.diagnose import Diagnosis
from bwstack.smoke.launch import Server
from bwstack.smoke.probe import ReadinessProbe
from bwstack.smoke.request import ServerCommand, SmokeRequest
from bwstack.smoke.watch import Outcome, Verdict

_PROBE_FINDINGS = {
    "tcp": "a TCP connection to {where}",
    "health": "GET /health answered 200",
    "models": "GET /v1/models named a model",
    "completion": "POST /v1/completions returned a completion",
}


def _subject(request: SmokeRequest, command: ServerCommand) -> str:
    text = request.image or " ".join(command.argv)
    return text if len(text) <= 80 else text[:77] + "..."


def _startup_check(outcome: Outcome) -> Check:
    path = " -> ".join(f"{h['phase']} {h['at_s']:.1f}s" for h in outcome.phase_history)
    reached = any(h["phase"] in ("listening", "ready") for h in outcome.phase_history)
    return Check(
        "startup",
        Status.PASS if reached else Status.FAIL,
        f"reached {outcome.phase}: {path}",
        evidence={"phase_history": outcome.phase_history, "last_activity_s": outcome.last_activity},
    )


def _probe_checks(probe: ReadinessProbe, where: str) -> list[Check]:
    checks = []
    for name in probe.STEPS:
        result = probe.results.get(name)
        if result is None:
            checks.append(Check(name, Status.SKIP, "not reached"))
        elif result.ok:
            finding = f"{_PROBE_FINDINGS[name].format(where=where)} ({result.detail})"
            checks.append(Check(name, Status.PASS, finding, evidence=result.to_dict()))
        else:
            finding = f"failing after {result.attempts} attempts: {result.detail}"
            checks.append(Check(name, Status.FAIL, finding, evidence=result.to_dict()))
    return checks


def build_report(
    *,
    request: SmokeRequest,
    command: ServerCommand,
    server: Server,
    outcome: Outcome,
    diagnosis: Diagnosis,
    cleanup: CleanupResult,
    probe: ReadinessProbe,
    log_tail: list[str],
) -> Report:
    ready = outcome.verdict is Verdict.READY
    where = f"{request.host}:{command.port}"
    report = Report(kind="smoke", subject=_subject(request, command))
    report.add(
        Check(
            "verdict",
            Status.PASS if ready else Status.FAIL,
            outcome.summary,
            evidence={
                "verdict": str(outcome.verdict),
                "phase": outcome.phase,
                "elapsed_s": outcome.elapsed_s,
                "exit": outcome.exit.to_dict() if outcome.exit else None,
            },
            remedy=None if ready else diagnosis.remedy,
        )
    )
    report.add(
        Check(
            "launch",
            Status.PASS,
            f"{command.source}: {server.describe()}",
            evidence={"argv": list(command.argv), "log": str(server.log_path), "env": sorted(request.env)},
        )
    )
    report.add(_startup_check(outcome))
    for check in _probe_checks(probe, where):
        report.add(check)
    if not ready:
        report.add(
            Check(
                "diagnosis",
                Status.WARN,
                diagnosis.summary,
                evidence={"causes": [c.to_dict() for c in diagnosis.likely_causes], "notes": diagnosis.notes},
                remedy=diagnosis.remedy,
            )
        )
    report.add(
        Check(
            "cleanup",
            Status.PASS if cleanup.clean else Status.FAIL,
            f"{cleanup.method}: "
            + ("nothing left running" if cleanup.clean else f"still running: {cleanup.left_running}"),
            evidence=cleanup.to_dict(),
            remedy=None if cleanup.clean else f"kill {' '.join(map(str, cleanup.left_running))} by hand",
        )
    )
    report.data.update(
        {
            "verdict": str(outcome.verdict),
            "phase": outcome.phase,
            "summary": outcome.summary,
            "elapsed_s": outcome.elapsed_s,
            "listening_after_s": outcome.listening_after_s,
            "ready_after_s": outcome.ready_after_s,
            "stalled_for_s": outcome.stalled_for_s,
            "verdict_at": outcome.verdict_at,
            "exit": outcome.exit.to_dict() if outcome.exit else None,
            "engine": command.engine,
            "command": list(command.argv),
            "image": request.image,
            "host": request.host,
            "port": command.port,
            "startup_timeout_s": request.startup_timeout_s,
            "stall_timeout_s": request.stall_timeout_s,
            "phase_history": outcome.phase_history,
            "probes": {name: r.to_dict() for name, r in probe.results.items()},
            "completion_text": probe.completion_text,
            "diagnosis": diagnosis.to_dict(),
            "log_tail": log_tail,
            "log_path": str(server.log_path),
            "processes": diagnosis.processes,
            "cleanup": cleanup.to_dict(),
        }
    )
    return report
