"""Is the server doing anything? CPU time anywhere in its process tree, and GPU activity through NVML.

`ProcessTree` knows the server's processes: everything below the root pid, everything in the root's
session (a launched server gets its own), and every process ever seen in either, so a child that
escaped (re-parented, setsid) is still found, and stopped, at clean-up. `ActivityMonitor` turns
successive samples into "progress or not" for the hang detector.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from bwstack.smoke.gpu import GpuReading, GpuSampler

_Key = tuple[int, float]  # (pid, create_time): a pid alone can be reused


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class ProcessTree:
    """The server's processes, found from its root pid(s) and session, remembered once seen."""

    def __init__(
        self, roots: Callable[[], list[int]], *, session: int | None = None, exclude: frozenset[int] = frozenset()
    ) -> None:
        self._roots = roots
        self._session = session
        self._exclude = exclude  # bwstack's own reaper shim: in the tree, but not the server's
        self._known: dict[_Key, psutil.Process] = {}

    def _add(self, process: psutil.Process) -> None:
        if process.pid in self._exclude:
            return
        try:
            key = (process.pid, process.create_time())
        except psutil.Error:
            return
        self._known.setdefault(key, process)

    def refresh(self) -> list[psutil.Process]:
        """Every live member now, oldest first (new descendants and session members are added)."""
        for pid in self._roots():
            try:
                root = psutil.Process(pid)
                self._add(root)
                for child in root.children(recursive=True):
                    self._add(child)
            except psutil.Error:
                continue
        if self._session is not None:
            for process in psutil.process_iter():
                try:
                    if os.getsid(process.pid) == self._session:
                        self._add(process)
                except (OSError, psutil.Error):
                    continue
        return self.alive()

    def alive(self) -> list[psutil.Process]:
        """Known members still running (zombies count as gone: they hold nothing but a pid)."""
        live = [p for key, p in sorted(self._known.items(), key=lambda kv: kv[0][1]) if _alive(p)]
        return live

    def known_pids(self) -> list[int]:
        return sorted({pid for pid, _ in self._known})


@dataclass(frozen=True)
class ActivitySample:
    at: float
    processes: int
    cpu_total_s: float
    cpu_delta_s: float
    cpu_progress: bool
    gpu_active: bool | None  # None: no GPU reading this time (NVML absent, or not due yet)
    gpu: tuple[GpuReading, ...] = ()


@dataclass
class ActivityMonitor:
    """CPU progress in the tree and GPU activity, sample by sample.

    CPU progress: the tree used more than `cpu_min_s` and more than `cpu_rate` of one core since the
    last sample (a sleeping server's housekeeping threads stay below both). GPU activity: a GPU used by
    the tree (or any GPU, when NVML names none of the tree's pids) is busy, or its memory moved by
    `gpu_memory_step_mib` since the last reading.
    """

    tree: ProcessTree
    gpu: GpuSampler
    cpu_min_s: float = 0.02
    cpu_rate: float = 0.05
    gpu_interval_s: float = 1.0
    gpu_memory_step_mib: int = 64
    _cpu: dict[_Key, float] = field(default_factory=dict)
    _last_at: float | None = None
    _gpu_at: float | None = None
    _gpu_memory: dict[int, int] = field(default_factory=dict)

    def sample(self, now: float) -> ActivitySample:
        members = self.tree.refresh()
        total = 0.0
        delta = 0.0
        current: dict[_Key, float] = {}
        for process in members:
            try:
                key = (process.pid, process.create_time())
                times = process.cpu_times()
            except psutil.Error:
                continue
            cpu = times.user + times.system
            current[key] = cpu
            total += cpu
            delta += max(0.0, cpu - self._cpu.get(key, 0.0))
        elapsed = now - self._last_at if self._last_at is not None else 0.0
        progress = delta > max(self.cpu_min_s, self.cpu_rate * elapsed)
        self._cpu = current
        self._last_at = now
        gpu_active, readings = self._sample_gpu(now, {k[0] for k in current})
        return ActivitySample(now, len(members), total, delta, progress, gpu_active, readings)

    def _sample_gpu(self, now: float, pids: set[int]) -> tuple[bool | None, tuple[GpuReading, ...]]:
        if not self.gpu.available or (self._gpu_at is not None and now - self._gpu_at < self.gpu_interval_s):
            return None, ()
        self._gpu_at = now
        readings = tuple(self.gpu.read())
        ours = [r for r in readings if pids & set(r.pids)] or list(readings)
        active = False
        for reading in ours:
            moved = abs(reading.memory_used_mib - self._gpu_memory.get(reading.index, reading.memory_used_mib))
            active |= reading.util_percent > 0 or moved >= self.gpu_memory_step_mib
            self._gpu_memory[reading.index] = reading.memory_used_mib
        return active, readings
