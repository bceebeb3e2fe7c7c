"""Image facts from an image's (or a folder's) files: which ptxas Triton runs and which archs it knows, the
CUDA toolkit's ptxas, and whether flashinfer's compiled binaries hold code for the GPU.

Nothing is executed: a ptxas lists the `sm_XY` names it accepts as strings in its binary. Triton asks
ptxas for `--gpu-name=sm_XYa` from CC 9.0 on (`sm_arch_from_capability`) and picks `bin/ptxas-blackwell`
for CC >= 10 when the wheel ships one (`get_ptxas`, both triton/backends/nvidia/compiler.py 3.6.0), each
overridable by TRITON_<TOOL>_PATH (triton/knobs.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bwstack.advise.facts import ImageFacts
from bwstack.errors import FatbinError
from bwstack.recipes.archs import CC
from bwstack.verify.compat import Runs, best_runs
from bwstack.verify.sources import Tree

TRITON_BIN = "triton/backends/nvidia/bin/"
CUDA_PTXAS = "usr/local/cuda/bin/ptxas"
# What advise asks open_image to extract beyond the package's own files: every ptxas, because in NVIDIA's
# CUDA images /usr/local/cuda is a link (which the export refuses) to /usr/local/cuda-X.Y.
IMAGE_FILES = (TRITON_BIN + "ptxas-blackwell", "bin/ptxas")
_CHUNK = 1 << 20
_MAX_PTXAS = 256 << 20  # a real ptxas is ~35 MB; a larger file is not read to the end


def ptxas_archs(path: Path) -> set[str]:
    """The `sm_XY[a|f]` names a ptxas binary carries, read in chunks (a name may straddle two)."""
    found: set[str] = set()
    tail = b""
    pattern = re.compile(rb"sm_(\d{2,3}[af]?)(?![0-9a-z])")
    with path.open("rb") as stream:
        read = 0
        while read < _MAX_PTXAS and (chunk := stream.read(_CHUNK)):
            read += len(chunk)
            block = tail + chunk
            found.update("sm_" + m.decode() for m in pattern.findall(block))
            tail = block[-8:]
    return found


def triton_gpu_name(cc: CC) -> str:
    """The --gpu-name Triton passes to ptxas for a GPU of this CC."""
    number = cc[0] * 10 + cc[1]
    return f"sm_{number}{'a' if number >= 90 else ''}"


def _find(root: Path, suffix: str) -> Path | None:
    hits = sorted(
        (p for p in root.rglob(Path(suffix).name) if p.as_posix().endswith(suffix) and p.is_file()),
        key=lambda p: len(p.parts),
    )
    return hits[0] if hits else None


def _cuda_ptxas(root: Path) -> Path | None:
    """/usr/local/cuda/bin/ptxas, else the newest /usr/local/cuda-X.Y/bin/ptxas (the link's usual target)."""
    if (root / CUDA_PTXAS).is_file():
        return root / CUDA_PTXAS
    found = [p for p in (root / "usr" / "local").glob("cuda-*/bin/ptxas") if p.is_file()]
    return max(found, key=lambda p: _version_key(p.parent.parent.name), default=None)


def _version_key(folder: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", folder))


def image_facts(tree: Tree, cc: CC | None) -> ImageFacts:
    """What the tree says for a GPU of compute capability `cc` (everything unknown without a cc)."""
    if cc is None:
        return ImageFacts(evidence={"note": "no compute capability: image facts not read"})
    arch = triton_gpu_name(cc)
    evidence: dict[str, Any] = {"gpu_name": arch}
    blackwell = _find(tree.root, TRITON_BIN + "ptxas-blackwell")
    plain = _find(tree.root, TRITON_BIN + "ptxas")
    triton_ptxas, env = (blackwell, "TRITON_PTXAS_BLACKWELL_PATH") if cc[0] >= 10 and blackwell else (plain, None)
    env = env or "TRITON_PTXAS_PATH"
    knows = None
    if triton_ptxas is not None:
        archs = ptxas_archs(triton_ptxas)
        knows = arch in archs
        evidence["triton_ptxas"] = {"path": triton_ptxas.relative_to(tree.root).as_posix(), "archs": sorted(archs)}
    cuda = _cuda_ptxas(tree.root)
    cuda_knows = None
    if cuda is not None:
        cuda_archs = ptxas_archs(cuda)
        cuda_knows = arch in cuda_archs
        evidence["cuda_ptxas"] = {"path": "/" + cuda.relative_to(tree.root).as_posix(), "archs": sorted(cuda_archs)}
    flashinfer = [b for b in tree.binaries if "flashinfer" in b]
    runs: bool | None = None
    if flashinfer:
        runs = False
        for binary in flashinfer:
            try:
                verdict, _via = best_runs(tree.read(binary), cc)
            except FatbinError:
                continue
            if verdict is not Runs.NONE:
                runs = True
                evidence["flashinfer_binary"] = binary
                break
        evidence["flashinfer_binaries"] = len(flashinfer)
    return ImageFacts(
        flashinfer_runs=runs,
        triton_ptxas_knows=knows,
        triton_ptxas_env=env if triton_ptxas is not None else None,
        cuda_ptxas="/" + cuda.relative_to(tree.root).as_posix() if cuda is not None else None,
        cuda_ptxas_knows=cuda_knows,
        evidence=evidence,
    )
