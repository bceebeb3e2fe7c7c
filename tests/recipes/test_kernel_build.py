"""The sgl-kernel build table against the released binaries, and what it renders per arch."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from bwstack.images.render import render, write
from bwstack.recipes.archs import parse_arch
from bwstack.recipes.kernel_build import MATCHES_RELEASES, UPSTREAM_DEFAULTS, plan, targets
from bwstack.recipes.recipe import load_recipe
from bwstack.verify.fatbin import read_entries
from tests.released import released_wheel

# The modules built from SGL_KERNEL_CUDA_FLAGS: both common_ops copies and spatial_ops.
MODULES = (
    "sgl_kernel/sm90/common_ops.abi3.so",
    "sgl_kernel/sm100/common_ops.abi3.so",
    "sgl_kernel/spatial_ops.abi3.so",
)


@pytest.mark.parametrize("version", MATCHES_RELEASES)
def test_the_rules_with_upstream_defaults_give_the_released_binaries_targets(tmp_path: Path, version: str) -> None:
    """PyPI's wheels are built with the defaults and CUDA 13: the table must reproduce their SASS exactly."""
    expected = set(targets(UPSTREAM_DEFAULTS, Version("13.0")))
    with zipfile.ZipFile(released_wheel("sglang-kernel", version)) as wheel:
        for member in MODULES:
            path = tmp_path / member.replace("/", "_")
            path.write_bytes(wheel.read(member))
            assert {e.arch for e in read_entries(path) if e.kind == "sass"} == expected, member


def test_sm120_drops_below_sm90_and_fa3_and_compiles_three_targets() -> None:
    build = plan(parse_arch("sm120"), Version("13.1"))
    assert build.defines == {"ENABLE_BELOW_SM90": "OFF", "SGL_KERNEL_ENABLE_FA3": "OFF"}
    assert build.targets == ["sm_90", "sm_100f", "sm_120a"]
    assert len(build.upstream_targets) == 6
    assert build.extra_gencode == ""  # sm_120a is in sgl-kernel's own list: adding it again only duplicates


def test_hopper_keeps_fa3_and_sm_90a() -> None:
    build = plan(parse_arch("sm90"), Version("13.1"))
    assert build.defines["SGL_KERNEL_ENABLE_FA3"] == "ON"
    assert "sm_90a" in build.targets and "sm_80" not in build.targets


@pytest.mark.parametrize("arch", ["sm103", "sm110", "sm121"])
def test_a_build_target_the_list_lacks_is_added_through_cmake_cuda_flags(arch: str) -> None:
    row = parse_arch(arch)
    build = plan(row, Version("13.1"))
    assert build.extra_gencode == row.gencode
    assert build.targets[-1] == row.build_target
    assert f'-Ccmake.define.CMAKE_CUDA_FLAGS="{row.gencode}"' in render(load_recipe("sglang"), arch).dockerfile


def test_build_json_reports_the_gencode_targets_the_build_compiles(tmp_path: Path) -> None:
    manifest = json.loads((write(render(load_recipe("sglang"), "sm120"), tmp_path).parent / "build.json").read_text())
    build = manifest["sgl_kernel_build"]
    assert build["gencode_count"] == 3 and build["gencode_targets"] == ["sm_90", "sm_100f", "sm_120a"]
    assert build["flash_ops"] is False
    assert build["cmake_defines"] == {"ENABLE_BELOW_SM90": "OFF", "SGL_KERNEL_ENABLE_FA3": "OFF"}
