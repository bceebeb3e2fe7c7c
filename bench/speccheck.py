"""spec-check: the same bench without and with the drafter, and whether the drafter pays.

It passes when, at every concurrency level, the speculative server's output tokens/s is at least
--min-speedup times the base server's, and its accept length (read from the server) reaches
--min-accept-length. Otherwise it refuses and names the likely causes from the table below.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bwstack.bench.levels import BenchSettings
from bwstack.bench.session import Measurement, bench_report
from bwstack.report import Check, Report, Status


@dataclass(frozen=True)
class Cause:
    when: str  # "low-acceptance" | "slower" | "slower-at-load"
    label: str  # a few words for the verdict line
    cause: str
    remedy: str


# Why speculative serving does not pay, by what was measured. Data, not code: add rows as they are learned.
CAUSES = (
    Cause(
        "low-acceptance",
        "attention backend breaking spec-verify on this CC",
        "the attention backend breaks spec-verify on this GPU's compute capability (target-verify runs, but "
        "its results do not match the draft's, so nearly every draft is rejected)",
        "try another --attention-backend or --speculative-draft-attention-backend (e.g. triton or fa3 "
        "instead of the default on this CC) and spec-check again",
    ),
    Cause(
        "low-acceptance",
        "drafter trained for another model/tokenizer",
        "the drafter was trained for another target model or tokenizer (EAGLE/EAGLE-3 heads read the target's "
        "hidden states and share its vocabulary; a drafter for another checkpoint proposes tokens the target "
        "rejects)",
        "use the drafter published for exactly this target checkpoint (same tokenizer and vocabulary)",
    ),
    Cause(
        "slower",
        "too many draft tokens for the batch",
        "too many draft tokens for the batch: every verify step scores num_draft_tokens per request, which "
        "costs more than the accepted tokens save, most of all at high concurrency",
        "lower [speculative] num_steps / num_draft_tokens (or eagle_topk), or serve large batches without a drafter",
    ),
    Cause(
        "slower-at-load",
        "speculation only pays at low concurrency",
        "speculation pays at low concurrency but not under load: the batch is already compute-bound and verify "
        "steps take the GPU from other requests",
        "keep speculation for latency-bound serving, or cap the batch size it is used for",
    ),
)


@dataclass(frozen=True)
class LevelJudgement:
    concurrency: int
    base_tok_s: float
    spec_tok_s: float

    @property
    def speedup(self) -> float:
        return self.spec_tok_s / self.base_tok_s if self.base_tok_s > 0 else 0.0


def _accept_length(measurement: Measurement) -> float | None:
    found = [lv.acceptance.accept_length for lv in measurement.levels if lv.acceptance.accept_length is not None]
    return round(statistics.fmean(found), 3) if found else None


def judge(
    base: Measurement,
    spec: Measurement,
    settings: BenchSettings,
    *,
    min_speedup: float = 1.1,
    min_accept_length: float = 2.0,
) -> Report:
    report = Report(kind="spec-check", subject=spec.target.describe())  # the base is the first check
    runs = {"base": bench_report(base, settings), "speculative": bench_report(spec, settings)}
    for name, run in runs.items():
        failed = run.failures()
        report.add(
            Check(
                name,
                Status.FAIL if failed or not run.data["levels"] else Status.PASS,
                "; ".join(f"{c.name}: {c.finding}" for c in failed)
                or ", ".join(f"c{lv['concurrency']} {lv['output_tok_s']:.1f} tok/s" for lv in run.data["levels"])
                or "no level was measured",
                evidence={"levels": run.data["levels"], "smoke": run.data["smoke"]},
                remedy=next((c.remedy for c in failed if c.remedy), None),
            )
        )
    base_levels = {lv.concurrency: lv for lv in base.levels}
    judged = [
        LevelJudgement(lv.concurrency, base_levels[lv.concurrency].output_tok_s, lv.output_tok_s)
        for lv in spec.levels
        if lv.concurrency in base_levels
    ]
    for level in judged:
        ok = level.speedup >= min_speedup
        report.add(
            Check(
                f"speedup c{level.concurrency}",
                Status.PASS if ok else Status.FAIL,
                f"{level.speedup:.2f}x: {level.spec_tok_s:.1f} against {level.base_tok_s:.1f} output tok/s"
                + ("" if ok else f" (needs >= {min_speedup:g}x)"),
                evidence={"speedup": round(level.speedup, 3), "base": level.base_tok_s, "spec": level.spec_tok_s},
            )
        )
    accept = _accept_length(spec)
    base_accept = _accept_length(base)
    if accept is None:
        accept_check = Check(
            "accept-length",
            Status.WARN,
            "the speculative server reported no acceptance: no /metrics with sglang:spec_accept_length or "
            "vllm:spec_decode_* and no decode log lines bench could read",
            remedy="start SGLang with --enable-metrics (recipes do), or let spec-check start the server",
        )
    else:
        ok = accept >= min_accept_length
        accept_check = Check(
            "accept-length",
            Status.PASS if ok else Status.FAIL,
            f"{accept:g} tokens per verify step" + ("" if ok else f" (needs >= {min_accept_length:g})"),
            evidence={"accept_length": accept, "levels": [lv.acceptance.to_dict() for lv in spec.levels]},
        )
    report.add(accept_check)
    slower = [lv for lv in judged if lv.speedup < min_speedup]
    low = accept is not None and accept < min_accept_length
    conditions = set()
    if low:
        conditions.add("low-acceptance")
    if slower and (low or len(slower) == len(judged)):
        conditions.add("slower")
    elif slower:
        conditions.add("slower-at-load")
    causes = [c for c in CAUSES if c.when in conditions]
    measured = bool(judged) and all(r.data["levels"] for r in runs.values())
    refused = bool(conditions) or not measured or any(c.status is Status.FAIL for c in report.checks)
    speedups = ", ".join(f"{lv.speedup:.2f}x at c{lv.concurrency}" for lv in judged) or "nothing measured"
    accept_text = f"accept length {accept:g}" if accept is not None else "accept length unknown"
    report.add(
        Check(
            "verdict",
            Status.FAIL if refused else Status.PASS,
            ("refuse the drafter: " if refused else "the drafter pays: ")
            + f"{speedups}; {accept_text}"
            + (f"; likely: {', '.join(c.label for c in causes)}" if causes else ""),
            evidence={"likely_causes": [c.cause for c in causes], "remedies": [c.remedy for c in causes]},
            remedy="; ".join(f"{c.cause} -> {c.remedy}" for c in causes) or None,
        )
    )
    report.data.update(
        {
            "verdict": "refuse" if refused else "pass",
            "speedup": {f"c{lv.concurrency}": round(lv.speedup, 3) for lv in judged},
            "accept_length": accept,
            "base_accept_length": base_accept,
            "likely_causes": [c.cause for c in causes],
            "base": runs["base"].data,
            "speculative": runs["speculative"].data,
            "min_speedup": min_speedup,
            "min_accept_length": min_accept_length,
        }
    )
    return report
