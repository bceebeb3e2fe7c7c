"""The seam to the GPUs: utilisation, memory and compute processes per GPU through NVML, or 'unavailable'.

Everything smoke knows about GPUs comes through `GpuSampler`. `open_gpu_sampler()` returns the NVML
one when `import pynvml` (nvidia-ml-py) and `nvmlInit()` both work, and otherwise one that reports
why not; tests pass their own sampler to drive the hang detector.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    util_percent: int
    memory_used_mib: int
    memory_total_mib: int
    pids: tuple[int, ...] = field(default=())  # compute processes on this GPU (host pids)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "util_percent": self.util_percent,
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "pids": list(self.pids),
        }


class GpuSampler(Protocol):
    @property
    def available(self) -> bool: ...

    @property
    def reason(self) -> str:
        """Why it is unavailable ('' when available)."""
        ...

    def read(self) -> list[GpuReading]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class UnavailableGpuSampler:
    """No NVML here: reads nothing and says why."""

    reason: str

    @property
    def available(self) -> bool:
        return False

    def read(self) -> list[GpuReading]:
        return []

    def close(self) -> None:
        return None


class NvmlGpuSampler:
    """Reads every GPU NVML sees. One instance per smoke run; `close()` shuts NVML down."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        self._count = nvml.nvmlDeviceGetCount()

    @property
    def available(self) -> bool:
        return True

    @property
    def reason(self) -> str:
        return ""

    def read(self) -> list[GpuReading]:
        nvml = self._nvml
        readings = []
        for index in range(self._count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                pids = tuple(p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            except nvml.NVMLError:
                pids = ()
            readings.append(
                GpuReading(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    util_percent=int(util.gpu),
                    memory_used_mib=int(memory.used) // (1 << 20),
                    memory_total_mib=int(memory.total) // (1 << 20),
                    pids=pids,
                )
            )
        return readings

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def open_gpu_sampler() -> GpuSampler:
    """NVML when it initialises, else a sampler that says why not."""
    try:
        import pynvml
    except ImportError:
        return UnavailableGpuSampler("nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return UnavailableGpuSampler(f"NVML did not initialise: {error}")
    try:
        return NvmlGpuSampler(pynvml)
    except pynvml.NVMLError as error:
        pynvml.nvmlShutdown()
        return UnavailableGpuSampler(f"NVML could not count GPUs: {error}")
