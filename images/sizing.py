"""How much of the build host one sgl-kernel compile may take.

Compiling sgl-kernel's CUDA sources takes 3-5 GB of RAM per nvcc thread (the kernels are template-heavy
CUTLASS code); a build that runs out is killed by the kernel with exit 137. bwstack sizes for the middle
of that range. Source: docs/build-sizing.md."""

from __future__ import annotations

GB = 1 << 30
NVCC_GB_PER_THREAD = 4


def size_build_jobs(ram_bytes: int, cpus: int, nvcc_threads: int) -> int:
    """MAX_JOBS such that MAX_JOBS x NVCC_THREADS x 4 GB fits in RAM (and no more jobs than CPUs)."""
    by_ram = ram_bytes // (NVCC_GB_PER_THREAD * GB * max(1, nvcc_threads))
    return max(1, min(cpus, by_ram))


def jobs_that_fit(ram_bytes: int, nvcc_threads: int) -> int:
    """The largest MAX_JOBS whose compile fits in `ram_bytes` (at least 1)."""
    return max(1, (ram_bytes // GB) // (NVCC_GB_PER_THREAD * max(1, nvcc_threads)))
