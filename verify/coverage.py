"""Coverage per container: which parts of a binary have no code, or only PTX, for one GPU.

The driver loads a fatbin container by container (nvcc writes one per translation unit), and a kernel
runs only if its own container has code for the GPU: a file whose other containers hold `sm_120a` SASS
does not help. So a file-level "runs via sm_120a" can hide translation units with nothing for the GPU.
Sometimes that is by design (arch-specific kernels behind a runtime check), sometimes it is a gap; the
report shows it either way, and the user says which with --allow-partial or --allow-missing GLOB.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bwstack.recipes.archs import CC
from bwstack.verify.compat import Runs, best_runs
from bwstack.verify.fatbin import FatbinEntry

_SHOWN = 20  # kernel names listed in a finding; the JSON evidence has them all


@dataclass(frozen=True)
class Coverage:
    """For one binary and one CC: containers (and, when read, kernel names) with no code or only PTX."""

    containers: int  # containers that hold kernels (kernel-free ones are never launched)
    missing: tuple[int, ...]  # containers with nothing that runs on the CC
    ptx_only: tuple[int, ...]  # containers that run only through PTX JIT
    missing_kernels: tuple[str, ...]
    ptx_only_kernels: tuple[str, ...]
    kernels_read: bool

    @property
    def partial(self) -> bool:
        return bool(self.missing) and len(self.missing) < self.containers

    def allowed_by(self, globs: Sequence[str]) -> bool:
        """True when every kernel of every container with nothing matches one of the globs."""
        if not globs or not self.kernels_read or not self.missing:
            return False
        return all(any(fnmatch.fnmatchcase(k, g) for g in globs) for k in self.missing_kernels)

    def describe(self, cc_text: str, unit: str = "containers") -> str:
        """`unit`: "containers" (of a fatbin) or "files" (a folder of bare cubins, one container each)."""
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} of {self.containers} {unit} have no code for CC {cc_text}")
            if self.missing_kernels:
                parts.append("kernels without code: " + _names(self.missing_kernels))
        if self.ptx_only:
            parts.append(f"{len(self.ptx_only)} of {self.containers} {unit} run only through PTX JIT")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "containers": self.containers,
            "missing": len(self.missing),
            "ptx_only": len(self.ptx_only),
            "missing_kernels": list(self.missing_kernels),
            "ptx_only_kernels": list(self.ptx_only_kernels),
            "kernels_read": self.kernels_read,
        }


def coverage(entries: Sequence[FatbinEntry], cc: CC, *, kernels_read: bool) -> Coverage:
    by_container: dict[int, list[FatbinEntry]] = {}
    for entry in entries:
        if not entry.kernel_free:
            by_container.setdefault(entry.container, []).append(entry)
    missing, ptx_only = [], []
    missing_kernels: dict[str, None] = {}
    ptx_kernels: dict[str, None] = {}
    for index, group in by_container.items():
        runs, _via = best_runs(group, cc)
        names = dict.fromkeys(k for e in group for k in e.kernels)
        if runs is Runs.NONE:
            missing.append(index)
            missing_kernels.update(names)
        elif runs is Runs.PTX_JIT:
            ptx_only.append(index)
            ptx_kernels.update(names)
    return Coverage(
        len(by_container), tuple(missing), tuple(ptx_only), tuple(missing_kernels), tuple(ptx_kernels), kernels_read
    )


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
