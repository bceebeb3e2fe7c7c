"""How much of the build host one sgl-kernel compile may take.

Compiling sgl-kernel's CUDA sources takes 3-5 GB of RAM per nvcc thread (the kernels are template-heavy
CUTLASS code); a build that runs out is killed by the kernel with exit 137. bwstack sizes for the middle
of that range. Source: docs/build-sizing.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bwstack.recipes.recipe import Recipe

GB = 1 << 30
NVCC_GB_PER_THREAD = 4


def size_build_jobs(ram_bytes: int, cpus: int, nvcc_threads: int) -> int:
    """MAX_JOBS such that MAX_JOBS x NVCC_THREADS x 4 GB fits in RAM (and no more jobs than CPUs)."""
    by_ram = ram_bytes // (NVCC_GB_PER_THREAD * GB * max(1, nvcc_threads))
    return max(1, min(cpus, by_ram))


def jobs_that_fit(ram_bytes: int, nvcc_threads: int) -> int:
    """The largest MAX_JOBS whose compile fits in `ram_bytes` (at least 1)."""
    return max(1, (ram_bytes // GB) // (NVCC_GB_PER_THREAD * max(1, nvcc_threads)))


def decide_build_args(
    recipe: Recipe,
    *,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    host: tuple[int, int] | None = None,
) -> dict[str, str]:
    """MAX_JOBS and NVCC_THREADS, decided here and nowhere else. A flag wins; NVCC_THREADS is otherwise the
    recipe's; MAX_JOBS is otherwise sized to the Docker host (`host`: RAM bytes, CPUs) for a build, or the
    recipe's for a render (the Dockerfile's ARG default, so build.json depends on the recipe alone).
    A recipe without an sgl-kernel compile has neither."""
    kernel = recipe.sgl_kernel
    if kernel is None:
        return {}
    threads = nvcc_threads or kernel.nvcc_threads
    if max_jobs:
        jobs = max_jobs
    elif host is not None:
        jobs = size_build_jobs(host[0], host[1], threads)
    else:
        jobs = kernel.max_jobs
    return {"MAX_JOBS": str(jobs), "NVCC_THREADS": str(threads)}
