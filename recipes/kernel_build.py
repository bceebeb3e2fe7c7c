"""What sgl-kernel's own CMake compiles for one target GPU, and the options that trim it: data, not patches.

sglang-kernel's CMakeLists.txt hard-codes its -gencode list (SGL_KERNEL_CUDA_FLAGS) and strips every
`-gencode arch=...` that torch adds, so TORCH_CUDA_ARCH_LIST cannot narrow it. Two CMake options can:
ENABLE_BELOW_SM90 and SGL_KERNEL_ENABLE_FA3. The rules below are that file's, line by line
(docs/sgl-kernel-build.md cites them); what remains after the options is what the image compiles.
No option drops sm_90 or, with CUDA >= 12.8, sm_100f and sm_120a: those stay, and the source is not
patched to remove them.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from bwstack.recipes.archs import Arch

# The CMakeLists.txt these rules were read from, and the releases whose binaries they reproduce exactly.
READ_AT = "sgl-project/sglang@086ab8b7d78483759363246077c01b76285f720b:python/sglang/kernels/aot/CMakeLists.txt"
MATCHES_RELEASES = ("0.4.9", "0.4.10")


@dataclass(frozen=True)
class Rule:
    """One -gencode of SGL_KERNEL_CUDA_FLAGS (x86_64) and when CMake adds it."""

    target: str  # SASS target: "sm_90a"
    option: str  # the CMake option that must be ON, "" for none
    min_cuda: str  # the toolkit the line also requires, "" for none
    line: int  # where in CMakeLists.txt


RULES: tuple[Rule, ...] = (
    Rule("sm_90", "", "", 131),
    Rule("sm_80", "ENABLE_BELOW_SM90", "", 201),
    Rule("sm_89", "ENABLE_BELOW_SM90", "", 202),
    Rule("sm_100f", "", "12.9", 216),  # sm_100a below 12.9 (line 220); bwstack's recipes use 13.x
    Rule("sm_120a", "", "12.8", 224),
    Rule("sm_90a", "SGL_KERNEL_ENABLE_FA3", "12.4", 248),
)
# Both options default ON on x86_64 (lines 100-115), which is what PyPI's wheels are built with.
UPSTREAM_DEFAULTS = {"ENABLE_BELOW_SM90": "ON", "SGL_KERNEL_ENABLE_FA3": "ON"}


def options_for(arch: Arch) -> dict[str, str]:
    """The options a build for this arch sets. ENABLE_BELOW_SM90 only adds sm_80/sm_89 (and FA3's sm_80/sm_86
    instantiations); FA3 (flash_ops) runs only on CC 8.x and 9.x: sgl_kernel/flash_attn.py is_fa3_supported."""
    return {
        "ENABLE_BELOW_SM90": "ON" if arch.cc < (9, 0) else "OFF",
        "SGL_KERNEL_ENABLE_FA3": "ON" if arch.cc[0] in (8, 9) else "OFF",
    }


def targets(options: dict[str, str], cuda: Version) -> list[str]:
    """The SASS targets of SGL_KERNEL_CUDA_FLAGS under these options, in CMake's order."""
    return [
        rule.target
        for rule in RULES
        if (not rule.option or options.get(rule.option) == "ON")
        and (not rule.min_cuda or cuda >= Version(rule.min_cuda))
    ]


@dataclass(frozen=True)
class KernelBuild:
    """One arch's sgl-kernel build: the CMake defines, the extra gencode, and the targets that result."""

    defines: dict[str, str]
    extra_gencode: str  # passed as CMAKE_CUDA_FLAGS when the list lacks the arch's build target, else ""
    targets: list[str]
    upstream_targets: list[str]  # what the same CMake compiles with its defaults (PyPI's wheels)

    @property
    def config_settings(self) -> list[str]:
        """pip wheel -C arguments (scikit-build-core's cmake.define.*)."""
        settings = [f"-Ccmake.define.{name}={value}" for name, value in self.defines.items()]
        if self.extra_gencode:
            settings.append(f'-Ccmake.define.CMAKE_CUDA_FLAGS="{self.extra_gencode}"')
        return settings

    def manifest(self) -> dict[str, object]:
        return {
            "cmake_defines": self.defines,
            "cmake_cuda_flags": self.extra_gencode,
            "gencode_targets": self.targets,
            "gencode_count": len(self.targets),
            "upstream_gencode_targets": self.upstream_targets,
            "flash_ops": self.defines["SGL_KERNEL_ENABLE_FA3"] == "ON",
            "rules_read_at": READ_AT,
            "rules_match_releases": list(MATCHES_RELEASES),
        }


def plan(arch: Arch, cuda: Version) -> KernelBuild:
    """The build for `arch`: options that drop what it never runs; its build target added only if missing.
    A `-gencode=arch=...` in CMAKE_CUDA_FLAGS survives clear_cuda_arches (its regex wants a space after
    -gencode), so it ADDS that target to every nvcc call: needed for sm_103a, sm_110a, sm_121a, which the
    x86_64 list lacks, and a duplicate for the rest, so it is left out there."""
    options = options_for(arch)
    remaining = targets(options, cuda)
    extra = "" if arch.build_target in remaining else arch.gencode
    compiled = remaining + ([arch.build_target] if extra else [])
    upstream = targets(UPSTREAM_DEFAULTS, cuda)
    return KernelBuild(options, extra, compiled, upstream)
