"""Recipe loading: the real recipes load, and every kind of broken recipe is one clear RecipeError."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from bwstack.errors import RecipeError
from bwstack.recipes.recipe import RECIPES_DIR, available_recipes, load_recipe

SGLANG = (RECIPES_DIR / "sglang.toml").read_text()


def write_recipe(tmp_path: Path, text: str, name: str = "sglang") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_sglang_recipe_describes_the_incident_stack() -> None:
    recipe = load_recipe("sglang")
    assert recipe.base.ref == "nvidia/cuda:13.1.0-devel-ubuntu24.04"
    assert recipe.cuda_version == Version("13.1.0")
    assert recipe.python.version == "3.12"
    assert recipe.torch.index_url.endswith("/cu130")
    assert recipe.sgl_kernel.import_name == "sgl_kernel"
    assert recipe.serve.tp == 8
    assert recipe.serve.tool_call_parser == recipe.serve.reasoning_parser == "kimi_k2"
    assert "sm120" in recipe.archs
    assert len(recipe.digest) == 64


def test_serve_command_carries_the_kimi_flags() -> None:
    command = load_recipe("sglang").serve_command("/models/kimi", host="127.0.0.1", port=8000)
    assert command[:5] == ["python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi"]
    joined = " ".join(command)
    for flag in ("--tp 8", "--port 8000", "--host 127.0.0.1", "--trust-remote-code", "--tool-call-parser kimi_k2"):
        assert flag in joined


def test_every_shipped_recipe_loads() -> None:
    names = available_recipes()
    assert "sglang" in names
    for name in names:
        assert load_recipe(name).name == name


def test_digest_ignores_comments_but_not_values(tmp_path: Path) -> None:
    base = load_recipe(str(write_recipe(tmp_path, SGLANG)))
    commented = load_recipe(str(write_recipe(tmp_path, "# a note\n" + SGLANG)))
    bumped = load_recipe(str(write_recipe(tmp_path, SGLANG.replace('version = "0.5.23"', 'version = "0.5.24"'))))
    assert base.digest == commented.digest
    assert base.digest != bumped.digest


def test_digest_pin_is_used_in_the_base_ref(tmp_path: Path) -> None:
    pinned = SGLANG.replace('digest = ""', f'digest = "sha256:{"a" * 64}"')
    recipe = load_recipe(str(write_recipe(tmp_path, pinned)))
    assert recipe.base.ref == f"nvidia/cuda:13.1.0-devel-ubuntu24.04@sha256:{'a' * 64}"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.replace("tp = 8", 'tp = "eight"'), r"field serve\.tp: expected integer, got str 'eight'"),
        (lambda s: s.replace("tp = 8", "tp = true"), r"field serve\.tp: expected integer, got bool"),
        (lambda s: s.replace('ref = "v0.5.23"\n', ""), r"field sgl_kernel\.ref: missing \(required\)"),
        (lambda s: s.replace("tp = 8", "tp = 8\ntpp = 8"), r"field serve\.tpp: unknown field"),
        (lambda s: s.replace("[serve]", "[serve"), r"TOML syntax error"),
        (lambda s: s.replace('"sm120",', '"sm999",'), r"field archs\[4\]: unknown arch 'sm999'"),
        (lambda s: s.replace('digest = ""', 'digest = "latest"'), r"field base\.digest: expected sha256"),
        (lambda s: s.replace("schema = 1", "schema = 2"), r"field schema: version 2"),
        (
            lambda s: s.replace('archs = ["sm90",', 'archs = "sm120"\nx = ["sm90",').replace("x = [", "# ["),
            r"field archs: expected a list",
        ),
        (
            lambda s: s.replace("schema = 1", "schema = 1\npython = 3").replace('[python]\nversion = "3.12"\n', ""),
            r"field python: expected a table",
        ),
    ],
)
def test_broken_recipe_names_file_and_field(tmp_path: Path, mutate, message: str) -> None:
    path = write_recipe(tmp_path, mutate(SGLANG))
    with pytest.raises(RecipeError, match=message) as caught:
        load_recipe(str(path))
    assert str(path) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_arch_beyond_the_recipes_cuda_is_refused_at_load(tmp_path: Path) -> None:
    old = SGLANG.replace("13.1.0-devel", "12.8.1-devel")
    with pytest.raises(
        RecipeError, match=r"archs\[\d\]: sm100 \(sm_100f\) needs CUDA >= 12.9, recipe uses CUDA 12.8.1"
    ):
        load_recipe(str(write_recipe(tmp_path, old)))


@pytest.mark.parametrize("arch", ["sm110", "sm121"])
def test_arch_beyond_the_recipes_cuda_is_refused_at_render_time(tmp_path: Path, arch: str) -> None:
    old = SGLANG.replace("13.1.0-devel", "12.8.1-devel").replace(
        'archs = ["sm90", "sm100", "sm103", "sm110", "sm120", "sm121"]', 'archs = ["sm90", "sm120"]'
    )
    recipe = load_recipe(str(write_recipe(tmp_path, old)))
    with pytest.raises(RecipeError, match=rf"{arch} .* needs CUDA >= 1[23]\.\d, recipe sglang uses CUDA 12\.8\.1"):
        recipe.resolve_arch(arch)


def test_unknown_recipe_lists_the_known_ones() -> None:
    with pytest.raises(RecipeError, match=r"unknown recipe 'nope': .* holds .*sglang"):
        load_recipe("nope")


def test_name_must_match_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match=r"field name: 'sglang' must match the file name 'other'"):
        load_recipe(str(write_recipe(tmp_path, SGLANG, name="other")))


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ('["srv", "--model", "{modle}"]', r"serve\.command\[2\]: unknown placeholder \{modle\}"),
        ('["srv", "--port", "{port"]', r"serve\.command\[2\]: .*in '\{port'"),
    ],
)
def test_serve_command_placeholders_are_checked_at_load(tmp_path: Path, command: str, message: str) -> None:
    text = SGLANG.replace("extra_args = []", f"extra_args = []\ncommand = {command}")
    with pytest.raises(RecipeError, match=message):
        load_recipe(str(write_recipe(tmp_path, text)))


def test_serve_command_fills_its_placeholders(tmp_path: Path) -> None:
    text = SGLANG.replace("extra_args = []", 'extra_args = []\ncommand = ["srv", "{model}", "{host}:{port}"]')
    recipe = load_recipe(str(write_recipe(tmp_path, text)))
    assert recipe.serve_command("/m", host="127.0.0.1", port=9) == ["srv", "/m", "127.0.0.1:9"]


def test_resolve_archs_reads_all_as_the_recipes_archs_and_checks_each() -> None:
    recipe = load_recipe("demo")
    assert [a.name for a in recipe.resolve_archs(["all"])] == ["sm90", "sm120"]
    assert [a.name for a in recipe.resolve_archs("12.0,sm_120")] == ["sm120"]
    with pytest.raises(RecipeError, match="recipe demo does not build sm100; it builds sm90, sm120"):
        recipe.resolve_archs(["sm120", "sm100"])
