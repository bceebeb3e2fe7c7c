"""NVIDIA's which-code-runs-where rules (FIELD-NOTES.md section 2), entry by entry and per binary."""

from __future__ import annotations

import re

import pytest

from bwstack.recipes.archs import all_archs
from bwstack.verify.compat import RULES, Runs, best_runs, rule_for, runs_on
from bwstack.verify.fatbin import FatbinEntry, read_entries
from tests.paths import package


def entry(arch: str) -> FatbinEntry:
    """A header-only entry from its name: sm_120a, compute_80, lto_90."""
    match = re.fullmatch(r"(sm|compute|lto)_(\d+)([af]?)", arch)
    assert match, arch
    kind = {"sm": "sass", "compute": "ptx", "lto": "lto"}[match.group(1)]
    return FatbinEntry(kind, int(match.group(2)), match.group(3), "none", 64, 64, 64, 0, "1.8")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arch", "cc", "expected"),
    [
        # plain SASS: same major, equal or higher minor
        ("sm_80", (8, 0), Runs.SASS),
        ("sm_80", (8, 6), Runs.SASS),
        ("sm_86", (8, 0), Runs.NONE),
        ("sm_80", (9, 0), Runs.NONE),
        ("sm_100", (10, 3), Runs.SASS),
        ("sm_100", (12, 0), Runs.NONE),  # never across majors
        ("sm_120", (12, 1), Runs.SASS),
        # arch-specific: exactly one CC
        ("sm_90a", (9, 0), Runs.SASS),
        ("sm_100a", (10, 3), Runs.NONE),
        ("sm_120a", (12, 0), Runs.SASS),
        ("sm_120a", (12, 1), Runs.NONE),
        ("sm_121a", (12, 1), Runs.SASS),
        # family: the members recipes/archs.py lists
        ("sm_100f", (10, 0), Runs.SASS_FAMILY),
        ("sm_100f", (10, 3), Runs.SASS_FAMILY),
        ("sm_100f", (12, 0), Runs.NONE),
        ("sm_103f", (10, 0), Runs.NONE),
        ("sm_110f", (11, 0), Runs.SASS_FAMILY),
        ("sm_120f", (12, 0), Runs.SASS_FAMILY),
        ("sm_120f", (12, 1), Runs.SASS_FAMILY),
        ("sm_121f", (12, 0), Runs.NONE),
        ("sm_107f", (10, 7), Runs.SASS_FAMILY),  # not in the table: trusted on its own CC only
        ("sm_107f", (10, 0), Runs.NONE),
        # plain PTX: any CC at or above, across majors
        ("compute_80", (12, 0), Runs.PTX_JIT),
        ("compute_80", (7, 5), Runs.NONE),
        ("compute_100", (12, 1), Runs.PTX_JIT),
        ("compute_120", (10, 0), Runs.NONE),
        # arch-specific and family PTX are as restricted as their SASS
        ("compute_120a", (12, 0), Runs.PTX_JIT),
        ("compute_120a", (12, 1), Runs.NONE),
        ("compute_120f", (12, 1), Runs.PTX_JIT),
        ("compute_100f", (12, 0), Runs.NONE),
        # LTO-IR must be linked into a cubin first
        ("lto_90", (9, 0), Runs.NONE),
        ("lto_120", (12, 0), Runs.NONE),
    ],
)
def test_runs_on(arch: str, cc: tuple[int, int], expected: Runs) -> None:
    assert runs_on(entry(arch), cc) is expected


@pytest.mark.parametrize("arch", [a for a in all_archs() if a.family_runs_on], ids=lambda a: a.name)
def test_family_membership_is_the_arch_tables(arch) -> None:
    family = entry(f"sm_{arch.number}f")
    every_cc = {a.cc for a in all_archs()} | set(arch.family_runs_on)
    running = {cc for cc in every_cc if runs_on(family, cc) is Runs.SASS_FAMILY}
    assert running == set(arch.family_runs_on)


def test_rule_table_covers_sass_and_ptx_and_never_lto() -> None:
    assert {(r.kind, r.suffix) for r in RULES} == {(k, s) for k in ("sass", "ptx") for s in ("", "a", "f")}
    assert rule_for(entry("lto_90")) is None
    assert all(r.why for r in RULES)
    assert {str(r) for r in Runs} == {"sass", "sass-family", "ptx-jit", "none"}


def best(archs: list[str], cc: tuple[int, int]) -> tuple[Runs, str | None]:
    runs, via = best_runs([entry(a) for a in archs], cc)
    return runs, via.arch if via else None


def test_a_cubin_beats_ptx() -> None:
    assert best(["compute_120", "sm_120a"], (12, 0)) == (Runs.SASS, "sm_120a")
    assert best(["compute_80", "sm_100f"], (10, 3)) == (Runs.SASS_FAMILY, "sm_100f")


def test_ptx_only_when_no_cubin_fits() -> None:
    assert best(["compute_120", "sm_120a"], (12, 1)) == (Runs.PTX_JIT, "compute_120")
    assert best(["compute_80", "compute_90", "sm_100a"], (12, 0)) == (Runs.PTX_JIT, "compute_90")


def test_the_closest_cubin_is_reported() -> None:
    assert best(["sm_80", "sm_86", "sm_89"], (8, 9)) == (Runs.SASS, "sm_89")
    assert best(["sm_80", "sm_86"], (8, 7)) == (Runs.SASS, "sm_86")
    assert best(["sm_120", "sm_120a"], (12, 0)) == (Runs.SASS, "sm_120a")


def test_nothing_fits() -> None:
    assert best(["sm_80", "sm_90", "sm_100a"], (12, 0)) == (Runs.NONE, None)
    assert best([], (12, 0)) == (Runs.NONE, None)
    assert best(["lto_120"], (12, 0)) == (Runs.NONE, None)


@pytest.mark.parametrize(
    ("binary", "cc", "expected"),
    [
        # a recent release: runs on 12.0 (sm_120a), not on 12.1; sm_100f covers 10.3
        ("good/sgl_kernel/sm100/common_ops.abi3.so", (12, 0), (Runs.SASS, "sm_120a")),
        ("good/sgl_kernel/sm100/common_ops.abi3.so", (12, 1), (Runs.NONE, None)),
        ("good/sgl_kernel/sm100/common_ops.abi3.so", (10, 3), (Runs.SASS_FAMILY, "sm_100f")),
        ("good/sgl_kernel/sm90/common_ops.abi3.so", (9, 0), (Runs.SASS, "sm_90a")),
        # the incident: the sm100 build has nothing for 12.x
        ("incident/sgl_kernel/sm100/common_ops.abi3.so", (12, 0), (Runs.NONE, None)),
        ("incident/sgl_kernel/sm100/common_ops.abi3.so", (10, 3), (Runs.NONE, None)),
        ("own-sm120-dir/sgl_kernel/sm120/common_ops.abi3.so", (12, 0), (Runs.SASS, "sm_120a")),
        # plain compute_100 PTX rescues 10.3 and 12.x through the JIT
        ("ptx-fallback/sgl_kernel/sm100/common_ops.abi3.so", (12, 0), (Runs.PTX_JIT, "compute_100")),
        ("ptx-fallback/sgl_kernel/sm100/common_ops.abi3.so", (10, 3), (Runs.PTX_JIT, "compute_100")),
        ("ptx-fallback/sgl_kernel/sm100/common_ops.abi3.so", (10, 0), (Runs.SASS, "sm_100a")),
        ("good/sgl_kernel/flash_ops.abi3.so", (12, 0), (Runs.NONE, None)),
        ("good/sgl_kernel/flash_ops.abi3.so", (9, 0), (Runs.SASS, "sm_90a")),
    ],
)
def test_fixture_packages(binary: str, cc: tuple[int, int], expected: tuple[Runs, str | None]) -> None:
    runs, via = best_runs(read_entries(package(binary.split("/")[0]) / binary.split("/", 1)[1]), cc)
    assert (runs, via.arch if via else None) == expected
