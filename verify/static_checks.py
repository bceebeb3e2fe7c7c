"""Checks that catch known launch failures on new GPUs before a GPU is touched, from files alone.

- Triton compiles its kernels at run time with the `ptxas` it bundles. A ptxas older than the GPU's
  arch fails at the first Triton kernel ("ptxas fatal: Value 'sm_120a' is not defined"). Its version is
  read from the binary's own version string; the binary is never run (it came from a wheel or image).
  Which ptxas Triton uses, and for which target, are written below as data, from the Triton source
  (triton/backends/nvidia/compiler.py: `get_ptxas`, `sm_arch_from_capability`; knobs.py: the
  TRITON_<TOOL>_PATH overrides).
- torch's own libtorch_cuda.so must hold code for the GPU: a torch without it fails every op, so
  verify treats it as required whenever it is in the source (verify.py).
- The CUDA runtime in the source (libcudart.so.M.m.p, by file name) must be the major the stack was
  built for (`--cuda`, a recipe's CUDA): binaries link libcudart.so.M and do not load without it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import BinaryIO, Protocol

from packaging.version import Version

from bwstack.recipes.archs import Arch
from bwstack.report import Check, Status

TRITON_BIN = "triton/backends/nvidia/bin"
# (file, used for CC numbers >= this): Triton >= 3.4 ships a second, newer ptxas for Blackwell.
TRITON_PTXAS = (("ptxas-blackwell", 100), ("ptxas", 0))
TRITON_ARCH_SPECIFIC_FROM = 90  # Triton compiles sm_XYa for capability >= 90, plain sm_XY below
TORCH_CUDA = "torch/lib/libtorch_cuda.so"
_VERSION = re.compile(rb"Cuda compilation tools, release (\d+)\.(\d+), V(\d+(?:\.\d+)+)")
_CHUNK = 1 << 20
_OVERLAP = 128


class Readable(Protocol):
    def open(self, relative: str) -> BinaryIO: ...


@dataclass(frozen=True)
class Ptxas:
    path: str  # as the source names it (relative to the source root)
    release: Version | None  # 12.9
    full: str | None  # V12.9.86


def ptxas_version(stream: BinaryIO) -> tuple[Version, str] | None:
    """The CUDA release a ptxas binary reports, found in its bytes (one streamed pass, bounded memory)."""
    tail = b""
    while chunk := stream.read(_CHUNK):
        data = tail + chunk
        if match := _VERSION.search(data):
            return Version(f"{int(match.group(1))}.{int(match.group(2))}"), "V" + match.group(3).decode()
        tail = data[-_OVERLAP:]
    return None


def find_triton_ptxas(tree: Readable, files: Sequence[str]) -> dict[str, Ptxas]:
    """Triton's bundled ptxas binaries in the source, by file name, with their versions."""
    found: dict[str, Ptxas] = {}
    for relative in files:
        path = PurePosixPath(relative)
        if path.parent.as_posix().endswith(TRITON_BIN) and path.name in dict(TRITON_PTXAS):
            with tree.open(relative) as stream:
                version = ptxas_version(stream)
            found[path.name] = Ptxas(relative, *(version or (None, None)))
    return found


def triton_target(arch: Arch) -> tuple[str, Version]:
    """The target Triton compiles for on this arch, and the first CUDA release whose ptxas knows it."""
    specific = arch.number >= TRITON_ARCH_SPECIFIC_FROM
    floor = arch.first_cuda
    if specific and arch.specific_since:
        floor = max(floor, arch.specific_since)
    return f"sm_{arch.number}{'a' if specific else ''}", floor


def triton_ptxas_check(arch: Arch, bundled: dict[str, Ptxas]) -> Check | None:
    if not bundled:
        return None
    tool = next((name for name, since in TRITON_PTXAS if arch.number >= since and name in bundled), None)
    if tool is None:
        return None
    ptxas = bundled[tool]
    target, needs = triton_target(arch)
    env = "TRITON_" + tool.upper().replace("-", "_") + "_PATH"
    name = f"{arch.name} triton ptxas"
    evidence = {"ptxas": ptxas.path, "release": str(ptxas.release) if ptxas.release else None, "full": ptxas.full}
    evidence |= {"target": target, "needs": str(needs), "override": env}
    if ptxas.release is None:
        return Check(
            name,
            Status.WARN,
            f"CC {arch.cc_str}: Triton's {ptxas.path} carries no CUDA version string; cannot tell if it knows {target}",
            evidence,
            remedy=f"export {env}=/usr/local/cuda/bin/ptxas (a CUDA >= {needs} toolkit's ptxas)",
        )
    if ptxas.release < needs:
        return Check(
            name,
            Status.FAIL,
            f"CC {arch.cc_str}: Triton compiles {target} with its bundled {ptxas.path} (CUDA {ptxas.release}, "
            f"{ptxas.full}), which predates {target} (needs CUDA >= {needs}): every Triton kernel fails to compile",
            evidence,
            remedy=f"export {env}=/usr/local/cuda/bin/ptxas (a CUDA >= {needs} toolkit's ptxas), or a newer triton",
        )
    return Check(
        name,
        Status.PASS,
        f"CC {arch.cc_str}: Triton compiles {target} with {ptxas.path} (CUDA {ptxas.release}, {ptxas.full}; "
        f"needs >= {needs})",
        evidence,
    )


_RUNTIME = re.compile(r"libcudart\.so\.(\d+)(?:\.(\d+))?(?:\.\d+)*")


def cuda_runtime_check(files: Sequence[str], cuda: Version | None) -> Check | None:
    """The CUDA runtimes (libcudart.so.M[.m.p]) in the source against the CUDA the stack was built for.

    Binaries built with CUDA M link libcudart.so.M: without a runtime of that major they do not load;
    an older minor of the same major may lack what they call."""
    found: dict[str, tuple[int, int | None]] = {}
    for relative in files:
        if match := _RUNTIME.fullmatch(PurePosixPath(relative).name):
            found[relative] = (int(match.group(1)), int(match.group(2)) if match.group(2) else None)
    if cuda is None:
        return None
    evidence = {"runtimes": found, "cuda": str(cuda)}
    if not found:
        no_runtime = f"no CUDA runtime (libcudart.so.*) in the source to compare with CUDA {cuda}"
        return Check("cuda runtime", Status.WARN, no_runtime, evidence)
    listed = ", ".join(f"{path} ({_dotted(major, minor)})" for path, (major, minor) in found.items())
    same_major = [minor for major, minor in found.values() if major == cuda.major]
    if not same_major:
        return Check(
            "cuda runtime",
            Status.FAIL,
            f"built for CUDA {cuda}, but the only CUDA runtime here is {listed}: binaries linked against "
            f"libcudart.so.{cuda.major} do not load",
            evidence,
            remedy=f"use a base image with the CUDA {cuda.major}.x runtime, or build the recipe with this image's CUDA",
        )
    if all(minor is not None and minor < cuda.minor for minor in same_major):
        return Check(
            "cuda runtime",
            Status.WARN,
            f"built for CUDA {cuda}, but the CUDA runtime here is older: {listed}",
            evidence,
            remedy=f"use a CUDA >= {cuda} runtime; calls added after the older minor fail",
        )
    return Check("cuda runtime", Status.PASS, f"built for CUDA {cuda}; CUDA runtime here: {listed}", evidence)


def _dotted(major: int, minor: int | None) -> str:
    return str(major) if minor is None else f"{major}.{minor}"
