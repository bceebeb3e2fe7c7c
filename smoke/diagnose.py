"""Evidence for a verdict, gathered before anything is stopped, and what to try next.

For a hang, a timeout or an unhealthy server: every process of the tree (state R/S/D, kernel wait
channel, threads and their states, CPU time, memory), a `py-spy dump` of every Python process when
py-spy is installed, GPU utilisation and memory through the NVML seam, and the likely causes for the
phase it stopped in with the flags and environment to try (docs/facts.md sections 6 and 7). For a
crash: known signatures in the log, each matched to its remedy.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bwstack.recipes.crash_signatures import KNOWN_CRASHES
from bwstack.recipes.serving_rules import rule_named
from bwstack.smoke.causes import (
    _ATTENTION,
    _BISECT_GRAPH,
    _NCCL_DEBUG,
    _NCCL_P2P,
    _PY_SPY,
    _SHM,
    LIKELY_CAUSES,
    SLOW_START,
    Cause,
    pointed_at,
)
from bwstack.smoke.gpu import GpuSampler


@dataclass(frozen=True)
class CrashSignature:
    name: str
    pattern: re.Pattern[str]
    meaning: str
    remedy: str
    avoided_by: str | None = None  # the `invoke advise` rule that avoids it (recipes/crash_signatures.py)


_GENERIC_SIGNATURES: tuple[CrashSignature, ...] = (
    CrashSignature(
        "no-kernel-image",
        re.compile(r"no kernel image is available for execution on the device"),
        "a binary has no SASS or compatible PTX for this GPU's compute capability",
        "run `invoke verify` on the image for this GPU and rebuild the offending binary with its arch (e.g. sm_120a)",
    ),
    CrashSignature(
        "cuda-out-of-memory",
        re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
        "a GPU ran out of memory",
        "lower --mem-fraction-static, raise --tp, or free the GPUs (nvidia-smi shows other processes)",
    ),
    CrashSignature(
        "nccl-error",
        re.compile(r"NCCL error|nccl(?:Internal|System|UnhandledCuda|Remote|InvalidUsage)Error|NCCL WARN"),
        "NCCL failed between ranks",
        f"{_NCCL_DEBUG}; try {_NCCL_P2P}; {_SHM}",
    ),
    CrashSignature(
        "missing-module",
        re.compile(r"No module named '?([\w.]+)'?"),
        "a Python module is not installed where the server runs",
        "install it in the image or environment that runs the server (is the recipe's stack complete?)",
    ),
    CrashSignature(
        "address-in-use",
        re.compile(r"Address already in use|\[Errno 98\]"),
        "another process holds the server's port",
        "stop the other server or pick another --port",
    ),
    CrashSignature(
        "undefined-symbol",
        re.compile(r"undefined symbol: \S+"),
        "a compiled extension was built against another torch or CUDA",
        "rebuild the extension against the torch in the image",
    ),
    CrashSignature(
        "driver-too-old",
        re.compile(r"driver version is insufficient for CUDA runtime version|CUDA driver version is insufficient"),
        "the NVIDIA driver is older than the CUDA runtime needs",
        "upgrade the driver (CUDA 13.x needs >= 580) or use an image built for an older CUDA",
    ),
)
# The sm_12x signatures each name the advisor rule that avoids them (the table lives in recipes/).
_ADVISED_SIGNATURES = tuple(
    CrashSignature(
        known.name,
        re.compile(known.pattern),
        known.meaning,
        f"`invoke advise` rule {known.avoided_by}: {rule.decides}" if (rule := rule_named(known.avoided_by)) else "",
        known.avoided_by,
    )
    for known in KNOWN_CRASHES
)
CRASH_SIGNATURES: tuple[CrashSignature, ...] = (*_GENERIC_SIGNATURES, *_ADVISED_SIGNATURES)


@dataclass(frozen=True)
class SignatureMatch:
    signature: CrashSignature
    line: str

    def to_dict(self) -> dict[str, str]:
        return {
            "name": self.signature.name,
            "line": self.line,
            "meaning": self.signature.meaning,
            "remedy": self.signature.remedy,
            "avoided_by": self.signature.avoided_by,
        }


def match_signatures(lines: Iterable[str]) -> list[SignatureMatch]:
    """Known failure signatures in log lines: one match per signature, the last line that shows it."""
    found: dict[str, SignatureMatch] = {}
    for line in lines:
        for signature in CRASH_SIGNATURES:
            if signature.pattern.search(line):
                found[signature.name] = SignatureMatch(signature, line.strip())
    order = [s.name for s in CRASH_SIGNATURES]
    return sorted(found.values(), key=lambda m: order.index(m.signature.name))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _state_letter(stat: str) -> str:
    """The state field of /proc/<pid>/stat (after the parenthesised command name)."""
    after = stat.rpartition(")")[2].split()
    return after[0] if after else "?"


def is_python(process: psutil.Process) -> bool:
    try:
        names = [Path(process.exe()).name, process.name()]
    except psutil.Error:
        return False
    return any(name.startswith("python") for name in names)


def snapshot_process(process: psutil.Process) -> dict[str, Any] | None:
    """One process as evidence: state letter, wait channel, thread states, CPU time, memory."""
    proc = Path("/proc") / str(process.pid)
    try:
        with process.oneshot():
            times = process.cpu_times()
            memory = process.memory_info()
            info = {
                "pid": process.pid,
                "ppid": process.ppid(),
                "name": process.name(),
                "cmdline": " ".join(process.cmdline())[:300],
                "state": _state_letter(_read(proc / "stat")),
                "status": process.status(),
                "wchan": _read(proc / "wchan").strip().strip("0") or "",
                "threads": process.num_threads(),
                "cpu_user_s": round(times.user, 2),
                "cpu_system_s": round(times.system, 2),
                "rss_mib": memory.rss // (1 << 20),
                "vms_mib": memory.vms // (1 << 20),
                "age_s": round(time.time() - process.create_time(), 1),
                "python": is_python(process),
            }
    except psutil.Error:
        return None
    states: Counter[str] = Counter()
    for task in (proc / "task").glob("*/stat"):
        states[_state_letter(_read(task))] += 1
    info["thread_states"] = dict(sorted(states.items()))
    return info


def snapshot_processes(processes: Sequence[psutil.Process]) -> list[dict[str, Any]]:
    return [s for s in (snapshot_process(p) for p in processes) if s is not None]


def find_py_spy() -> Path | None:
    """py-spy beside this interpreter (a venv) or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return beside
    found = shutil.which("py-spy")
    return Path(found) if found else None


def py_spy_dumps(pids: Sequence[int], py_spy: Path | None, *, timeout_s: float = 15.0) -> dict[str, Any]:
    """`py-spy dump` of each pid, in parallel; says so when py-spy is not installed."""
    if py_spy is None:
        return {
            "available": False,
            "note": "py-spy is not installed (pip install py-spy): no Python stacks",
            "dumps": [],
        }
    if not pids:
        return {"available": True, "note": "no Python process in the tree", "dumps": []}

    def dump(pid: int) -> dict[str, Any]:
        try:
            done = subprocess.run(
                [str(py_spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return {"pid": pid, "ok": False, "text": f"py-spy dump did not finish in {timeout_s:g} s"}
        text = done.stdout if done.returncode == 0 else (done.stderr or done.stdout).strip()
        if done.returncode != 0 and "ptrace" in text.lower():
            text += " (py-spy needs ptrace permission: run as root or with CAP_SYS_PTRACE)"
        return {"pid": pid, "ok": done.returncode == 0, "text": text}

    with ThreadPoolExecutor(max_workers=min(4, len(pids))) as pool:
        dumps = list(pool.map(dump, pids))
    ok = sum(d["ok"] for d in dumps)
    return {"available": True, "note": f"{ok} of {len(dumps)} Python processes dumped", "dumps": dumps}


def main_thread_frame(dump: str) -> str | None:
    """The innermost frame of the main thread in a `py-spy dump` ("function (file.py:line)").

    The main thread is the one named MainThread, or (unnamed when `threading` was never imported)
    the one whose thread id is the process id.
    """
    lines = dump.splitlines()
    pid = re.match(r"Process (\d+):", lines[0]) if lines else None
    for index, line in enumerate(lines):
        main = '"MainThread"' in line or (pid is not None and line.startswith(f"Thread {pid.group(1)} "))
        if line.startswith("Thread ") and main and index + 1 < len(lines):
            return lines[index + 1].strip() or None
    return None


def gpu_evidence(gpu: GpuSampler) -> dict[str, Any]:
    if not gpu.available:
        return {"available": False, "reason": gpu.reason, "gpus": []}
    return {"available": True, "reason": "", "gpus": [r.to_dict() for r in gpu.read()]}


@dataclass
class Diagnosis:
    summary: str
    processes: list[dict[str, Any]] = field(default_factory=list)
    py_spy: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    likely_causes: list[Cause] = field(default_factory=list)
    signatures: list[SignatureMatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def remedy(self) -> str | None:
        """The first thing to try, one line."""
        if self.signatures:
            return self.signatures[0].signature.remedy
        for cause in self.likely_causes:
            if cause.tries and cause.tries[0] != _PY_SPY:
                return cause.tries[0]
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "likely_causes": [c.to_dict() for c in self.likely_causes],
            "signatures": [s.to_dict() for s in self.signatures],
            "py_spy": self.py_spy,
            "gpu": self.gpu,
            "notes": self.notes,
        }


def process_summary(processes: Sequence[dict[str, Any]]) -> str:
    if not processes:
        return "no process left"
    states = Counter(p["state"] for p in processes)
    cpu = sum(p["cpu_user_s"] + p["cpu_system_s"] for p in processes)
    waits = Counter(p["wchan"] for p in processes if p["wchan"])
    text = f"{len(processes)} processes ({', '.join(f'{n} {s}' for s, n in sorted(states.items()))}), {cpu:.1f} s CPU"
    if waits:
        text += f", waiting in {', '.join(w for w, _ in waits.most_common(3))}"
    return text


def causes_for(
    phase: str, *, busy: bool = False, failing_probe: str | None = None, stacks: Sequence[str] = ()
) -> list[Cause]:
    """Likely causes of a stop in `phase`; a busy server may just be slow; a failing API probe is its own cause.
    Causes whose py-spy frames appear in `stacks` (the dumps' text) come first."""
    if failing_probe in ("models", "completion"):
        return [
            Cause(
                f"/health passes but the {failing_probe} probe fails: the model or its API is broken",
                (f"read the {failing_probe} check's reply and the log tail", _BISECT_GRAPH, _ATTENTION),
            )
        ]
    causes = list(LIKELY_CAUSES.get(phase, ()))
    pointed = [cause for cause, _frame in pointed_at(causes, list(stacks))]
    causes = pointed + [c for c in causes if c not in pointed]
    return [SLOW_START, *causes] if busy else causes


def evidence_notes(phase: str, stacks: Sequence[str]) -> list[str]:
    """One note per likely cause that the py-spy dumps point at, quoting the frame."""
    notes = []
    for cause, frame in pointed_at(list(LIKELY_CAUSES.get(phase, ())), list(stacks)):
        notes.append(f"py-spy points at: {cause.cause} (frame: {frame})")
    return notes


def crash_causes(log_path: str) -> list[Cause]:
    """A crash whose log shows no known signature."""
    return [Cause("the server exited without a known failure signature", (f"read the log tail and {log_path}",))]
