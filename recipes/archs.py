"""The one table of GPU architectures. Render and verify both read it; a GPU fact lives only here.

Facts from docs/facts.md sections 1-2 (NVIDIA's compatibility rules, ptxas-measured
family membership). `build_target` is what bwstack compiles for when a recipe asks for that arch:
arch-specific (`a`) where the kernels need the arch's special instructions (wgmma, tcgen05, ...),
family (`f`) where the family runs one binary across several CCs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.version import Version

from bwstack.errors import ArchError

CC = tuple[int, int]


def cc_text(cc: CC) -> str:
    """A compute capability as NVIDIA writes it: (12, 0) -> "12.0"."""
    return f"{cc[0]}.{cc[1]}"


@dataclass(frozen=True)
class Arch:
    """One GPU architecture: its compute capability and what the toolkits can target on it."""

    name: str  # "sm120": the spelling recipes, tasks and reports use
    cc: CC  # (12, 0)
    gpus: str
    first_cuda: Version  # first toolkit that can target plain sm_XY
    specific_since: Version | None  # first toolkit with sm_XYa (None: no arch-specific variant)
    family_since: Version | None  # first toolkit with sm_XYf (None: no family variant)
    family_runs_on: tuple[CC, ...]  # CCs whose GPUs run sm_XYf code (ptxas-measured)
    build_target: str  # the SASS target a recipe builds by default: "sm_120a"

    @property
    def number(self) -> int:
        """The arch number nvcc and the fatbin headers use: 120 for CC 12.0."""
        return self.cc[0] * 10 + self.cc[1]

    @property
    def cc_str(self) -> str:
        return cc_text(self.cc)

    @property
    def gencode(self) -> str:
        """The nvcc flag that compiles SASS for build_target, e.g. arch=compute_120a,code=sm_120a."""
        suffix = self.build_target.removeprefix(f"sm_{self.number}")
        return f"-gencode=arch=compute_{self.number}{suffix},code={self.build_target}"

    @property
    def torch_arch(self) -> str:
        """TORCH_CUDA_ARCH_LIST spelling: 12.0a, 10.0f, 8.6."""
        suffix = self.build_target.removeprefix(f"sm_{self.number}")
        return f"{self.cc_str}{suffix}"

    def supported_by(self, cuda: Version) -> bool:
        """Can a toolkit of this version compile the arch's build_target?"""
        return cuda >= self.min_cuda()

    def min_cuda(self) -> Version:
        """The first toolkit that can compile build_target."""
        floor = self.first_cuda
        if self.build_target.endswith("a") and self.specific_since:
            floor = max(floor, self.specific_since)
        if self.build_target.endswith("f") and self.family_since:
            floor = max(floor, self.family_since)
        return floor


def _v(text: str) -> Version:
    return Version(text)


ARCHS: tuple[Arch, ...] = (
    Arch("sm80", (8, 0), "A100", _v("11.0"), None, None, (), "sm_80"),
    Arch("sm86", (8, 6), "A10, RTX 30xx", _v("11.1"), None, None, (), "sm_86"),
    Arch("sm89", (8, 9), "L40S, L4, RTX 40xx", _v("11.8"), None, None, (), "sm_89"),
    Arch("sm90", (9, 0), "H100, H200, GH200", _v("11.8"), _v("12.0"), None, (), "sm_90a"),
    Arch("sm100", (10, 0), "B200, GB200", _v("12.8"), _v("12.8"), _v("12.9"), ((10, 0), (10, 3), (10, 7)), "sm_100f"),
    Arch("sm103", (10, 3), "B300, GB300", _v("12.9"), _v("12.9"), _v("12.9"), ((10, 3), (10, 7)), "sm_103a"),
    # sm_110 was called sm_101 up to CUDA 12.9; CUDA 13.0 renamed it.
    Arch("sm110", (11, 0), "Jetson Thor", _v("13.0"), _v("13.0"), _v("13.0"), ((11, 0),), "sm_110a"),
    Arch(
        "sm120",
        (12, 0),
        "RTX PRO 6000 Blackwell, RTX 5090",
        _v("12.8"),
        _v("12.8"),
        _v("12.9"),
        ((12, 0), (12, 1)),
        "sm_120a",
    ),
    Arch("sm121", (12, 1), "GB10 / DGX Spark", _v("12.9"), _v("12.9"), _v("12.9"), ((12, 1),), "sm_121a"),
)

_BY_NAME = {a.name: a for a in ARCHS}
_BY_CC = {a.cc: a for a in ARCHS}
_SPELLINGS = re.compile(r"^(?:sm_?|compute_?)?(\d{2,3})[af]?$")
_CC_SPELLING = re.compile(r"^(\d{1,2})\.(\d)$")


def all_archs() -> tuple[Arch, ...]:
    return ARCHS


def parse_arch(text: str) -> Arch:
    """Accept `sm120`, `sm_120`, `sm_120a`, `120` and `12.0`; raise ArchError for anything else."""
    spelled = text.strip().lower()
    cc_match = _CC_SPELLING.match(spelled)
    suffix = ""
    if cc_match:
        arch = _BY_CC.get((int(cc_match.group(1)), int(cc_match.group(2))))
    else:
        match = _SPELLINGS.match(spelled)
        arch = _BY_NAME.get(f"sm{match.group(1)}") if match else None
        suffix = spelled[-1] if arch and spelled[-1] in "af" else ""
    if arch is None:
        known = ", ".join(a.name for a in ARCHS)
        raise ArchError(f"unknown arch {text!r}: known archs are {known} (also spelled sm_120 or 12.0)")
    if suffix and not arch.build_target.endswith(suffix):
        # sm_80a does not exist; sm_100a does, but bwstack builds sm100 as sm_100f: say so, never swap silently.
        raise ArchError(
            f"arch {text!r}: bwstack builds {arch.name} as {arch.build_target}, not as sm_{arch.number}{suffix}",
            remedy=f"pass --arch {arch.name} (or {arch.cc_str})",
        )
    return arch


def arch_for_cc(cc: CC) -> Arch | None:
    """The table row for a compute capability, or None for a GPU the table does not know."""
    return _BY_CC.get(cc)


def parse_arch_list(
    values: str | Arch | Iterable[str | Arch] | None, recipe_archs: Iterable[str] | None = None
) -> list[Arch]:
    """`--arch` as every task takes it: any spelling `parse_arch` accepts, repeated and/or comma-separated,
    and `all`: the recipe's archs where a recipe is involved (`recipe_archs`), else the whole table. Arch
    rows pass through, so a request that already holds them can be parsed again.

    Duplicates collapse and table order is kept, so `--arch 12.0,sm_120 --arch sm121` is [sm120, sm121].
    Nothing given is an ArchError; callers for which "no arch" means "any" check before calling.
    """
    items = [values] if isinstance(values, str | Arch) else list(values or [])
    parts = [p.strip() for i in items for p in ([i.name] if isinstance(i, Arch) else i.split(",")) if p.strip()]
    if not parts:
        raise ArchError(
            "no --arch given (e.g. --arch sm120)",
            remedy="repeat --arch or separate archs with commas; --arch all is every arch the recipe builds "
            "(for verify: every arch bwstack knows)",
        )
    everything = [a.name for a in ARCHS] if recipe_archs is None else [parse_arch(n).name for n in recipe_archs]
    wanted = {name for part in parts for name in (everything if part.lower() == "all" else [parse_arch(part).name])}
    return [a for a in ARCHS if a.name in wanted]
