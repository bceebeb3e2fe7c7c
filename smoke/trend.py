"""`invoke history`: the phase history as a report, one check per key, newest runs last."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from pathlib import Path

from bwstack.report import Check, Report, Status
from bwstack.smoke.history import WINDOW, HistoryStore, Run, regressions

_SHOWN = ("to-ready", "loading-weights", "cuda-graph")  # the phases people ask about first


def _trend(runs: list[Run]) -> tuple[str, list[str]]:
    """'to-ready 41.2 s (median 40.8 s), loading-weights ...' for the newest run, and its regressions."""
    newest = runs[-1]
    ready = [r.timings for r in runs[:-1] if r.verdict == "ready"]
    parts = []
    for phase in _SHOWN:
        if phase not in newest.timings:
            continue
        past = [t[phase] for t in ready[-WINDOW:] if phase in t]
        median = f" (median {statistics.median(past):g} s)" if past else ""
        parts.append(f"{phase} {newest.timings[phase]:g} s{median}")
    slow = [r.finding for r in regressions(newest.timings, ready)]
    return ", ".join(parts) or "no phase timings", slow


def trend_report(path: Path, *, last: int = 20) -> Report:
    store = HistoryStore(path)
    runs = store.runs(last=last)
    report = Report(kind="history", subject=str(path))
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(run.key.digest, []).append(run)
    if not runs:
        report.add(Check("history", Status.SKIP, "no runs recorded yet"))
    for digest, group in by_key.items():
        newest = group[-1]
        text, slow = _trend(group)
        verdicts = " ".join(r.verdict for r in group)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(newest.at))
        report.add(
            Check(
                f"{newest.key.describe()} [{digest[:8]}]",
                Status.WARN if slow else Status.PASS,
                f"{len(group)} run{'s' if len(group) > 1 else ''} ({verdicts}), newest {when} {newest.kind}: {text}"
                + (f"; regression: {'; '.join(slow)}" if slow else ""),
                evidence={"key": asdict(newest.key), "runs": [r.to_dict() for r in group]},
            )
        )
    report.data.update({"history": str(path), "runs": [r.to_dict() for r in runs], "keys": sorted(by_key)})
    return report
