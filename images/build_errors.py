"""Turn a failed build step into the one finding people need: what failed, why, and what to change.

The classic builder reports a failure as a message and, for RUN steps, the exit code. Three cases
cover what actually happens to sgl-kernel builds: the base image cannot be pulled (no registry,
credentials or tag: the surroundings, exit 2), a compile killed by the kernel's OOM killer
(exit 137: too many parallel nvcc threads for the RAM), and any other failing step.
"""

from __future__ import annotations

import re
from typing import Any

from bwstack.images.build_log import StepLog
from bwstack.images.render import RenderedImage
from bwstack.images.sizing import GB, NVCC_GB_PER_THREAD, jobs_that_fit
from bwstack.report import Check, Status

_EXIT_CODE = re.compile(r"returned a non-zero code: (\d+)")
_PULL_SIGNS = (
    "pull access denied",
    "manifest unknown",
    "not found: manifest",
    "manifest for",
    "no such host",
    "dial tcp",
    "unauthorized",
    "authentication required",
    "toomanyrequests",
    "tls handshake timeout",
    "i/o timeout",
    "connection refused",
    "no basic auth credentials",
)


def classify_failure(
    arch: str,
    rendered: RenderedImage,
    message: str,
    code: int | None,
    log: StepLog,
    build_args: dict[str, str],
    client: Any,
) -> Check:
    step = f"step {log.current}/{log.total}" if log.total else "before the first step"
    evidence: dict[str, Any] = {
        "step": log.current,
        "steps_total": log.total,
        "instruction": log.instruction,
        "message": message,
        "last_lines": list(log.tail),
    }
    exit_code = _exit_code(message, code)
    if log.instruction.upper().startswith("FROM") or (not log.total and _looks_like_pull(message)):
        base = rendered.recipe.base.ref
        return Check(
            f"{arch} build",
            Status.FAIL,
            f"cannot pull base image {base}: {message.splitlines()[0][:240]}",
            {**evidence, "base": base},
            remedy=f"check the tag exists and the registry is reachable (`docker pull {base}`); "
            "`docker login` for private registries; or pull/load the base image on this host first",
            infrastructure=True,
        )
    if exit_code == 137:
        jobs = int(build_args.get("MAX_JOBS", "1"))
        threads = int(build_args.get("NVCC_THREADS", "1"))
        ram = _host_ram(client)
        need_gb = jobs * threads * NVCC_GB_PER_THREAD
        lower = jobs_that_fit(ram, threads) if ram else max(1, jobs // 2)
        return Check(
            f"{arch} build",
            Status.FAIL,
            f"{step} was killed (exit 137, out of memory): {log.instruction[:160]}",
            evidence | {"max_jobs": jobs, "nvcc_threads": threads, "host_ram_bytes": ram, "estimated_need_gb": need_gb},
            remedy=f"MAX_JOBS={jobs} x NVCC_THREADS={threads} x ~4 GB = ~{need_gb} GB, host RAM "
            f"{(ram or 0) / GB:.0f} GB: rebuild with --max-jobs {min(lower, max(1, jobs - 1))} (or fewer NVCC_THREADS)",
        )
    return Check(
        f"{arch} build",
        Status.FAIL,
        f"{step} failed{f' with exit code {exit_code}' if exit_code is not None else ''}: {log.instruction[:160]}",
        evidence,
        remedy="read last_lines in the evidence (or rerun with --verbose); fix the step, then build again",
    )


def _exit_code(message: str, code: int | None) -> int | None:
    match = _EXIT_CODE.search(message)
    if match:
        return int(match.group(1))
    return code if isinstance(code, int) and code > 1 else None


def _looks_like_pull(message: str) -> bool:
    lowered = message.lower()
    return any(sign in lowered for sign in _PULL_SIGNS)


def _host_ram(client: Any) -> int | None:
    """RAM of the machine the daemon builds on (not necessarily this one)."""
    try:
        return int(client.info().get("MemTotal") or 0) or None
    except Exception:  # info is best-effort evidence; the finding stands without it
        return None
