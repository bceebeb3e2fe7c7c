"""`--arch` means the same in every task: any spelling, repeats, commas; `all` = the recipe's archs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bwstack.errors import RecipeError
from bwstack.nodes.preflight import request_for_recipe
from tests.core.test_cli import assert_one_line_error
from tests.helpers import invoke


def folders(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


def test_render_takes_all_as_the_recipes_archs(tmp_path: Path) -> None:
    result = invoke("render", "--recipe", "demo", "--arch", "all", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert folders(tmp_path) == ["demo-sm120", "demo-sm90"]
    assert result.stdout.split() == [str(tmp_path / f"demo-{a}" / "Dockerfile") for a in ("sm90", "sm120")]


def test_render_takes_commas_repeats_and_every_spelling(tmp_path: Path) -> None:
    result = invoke("render", "--recipe", "demo", "--arch", "12.0,sm_120", "--arch", "sm90", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert folders(tmp_path) == ["demo-sm120", "demo-sm90"]


def test_one_bad_arch_in_a_list_writes_nothing(tmp_path: Path) -> None:
    result = invoke("render", "--recipe", "demo", "--arch", "sm120,sm100", "--out", str(tmp_path))
    assert_one_line_error(result, "recipe demo does not build sm100; it builds sm90, sm120")
    assert not any(tmp_path.iterdir())


def test_build_parses_arch_lists_like_render_before_any_build() -> None:
    """build used to refuse commas and `all`; now a list reaches the recipe's check (no Docker needed)."""
    assert_one_line_error(invoke("build", "--recipe", "demo", "--arch", "sm_120,10.0"), "does not build sm100")


def test_fleet_renders_one_daemonset_per_arch(tmp_path: Path) -> None:
    result = invoke("fleet", "--arch", "sm120,sm121", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert folders(tmp_path / "fleet") == ["sglang-sm120", "sglang-sm121"]
    doc = yaml.safe_load((tmp_path / "fleet/sglang-sm121/daemonset.yaml").read_text())
    terms = doc["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    expressions = terms["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.compute.minor", "operator": "In", "values": ["1"]} in expressions


def test_fleet_refuses_one_image_for_several_archs(tmp_path: Path) -> None:
    result = invoke("fleet", "--arch", "all", "--image", "registry.example.com/x:1", "--out", str(tmp_path))
    assert_one_line_error(result, "--image names one image, so it takes one --arch")
    assert not any(tmp_path.iterdir())


def test_preflight_requests_take_the_same_forms() -> None:
    everything = request_for_recipe("sglang").archs
    assert request_for_recipe("sglang", archs=["all"]).archs == everything
    assert [a.name for a in request_for_recipe("sglang", archs=["12.0,sm_121", "sm120"]).archs] == ["sm120", "sm121"]
    assert [a.name for a in request_for_recipe(None, archs=["all"]).archs][-2:] == ["sm120", "sm121"]
    with pytest.raises(RecipeError, match="recipe demo does not build sm100"):
        request_for_recipe("demo", archs=["sm100"])


def test_verify_takes_the_same_forms() -> None:
    result = invoke("verify", "--arch", "sm999,sm120", "--path", ".")
    assert_one_line_error(result, "unknown arch 'sm999'")
