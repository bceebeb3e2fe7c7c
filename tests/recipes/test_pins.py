"""The sglang recipe's pins against the released wheels themselves, and `invoke pins` as a user runs it.

The oracle is the metadata of the real wheels (tests/released.toml). `invoke pins` runs here against the
released-wheel cache only: PIP_NO_INDEX and PIP_FIND_LINKS are the user's pip configuration, and the
task must honour them like any other.
"""

from __future__ import annotations

import json
import re
import socket
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

from bwstack.errors import RecipeError
from bwstack.recipes.pins import bump
from bwstack.recipes.recipe import RECIPES_DIR, load_recipe
from tests.helpers import invoke
from tests.released import released_wheel

RECIPE = RECIPES_DIR / "sglang.toml"


def metadata(wheel: Path) -> HeaderParser:
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return HeaderParser().parsestr(archive.read(member).decode(), headersonly=True)


def pinned(requires: list[str], name: str) -> str:
    (version,) = [
        m.group(2)
        for r in requires
        if (m := re.match(r"^([\w.-]+)(?:\[[^\]]*\])?==([^;\s]+)", r))
        and re.sub(r"[-_.]+", "-", m.group(1)).lower() == name
    ]
    return version


def test_the_recipe_builds_sgl_kernel_from_where_its_release_says() -> None:
    """The source folder and version of the sgl-kernel build are read from the released wheels."""
    recipe = load_recipe("sglang")
    assert recipe.sglang and recipe.sgl_kernel and recipe.torch
    sglang = metadata(released_wheel("sglang", recipe.sglang.version))
    requires = sglang.get_all("Requires-Dist")
    assert recipe.sgl_kernel.version == pinned(requires, "sglang-kernel")
    assert recipe.torch.version == pinned(requires, "torch")
    assert recipe.sglang.flashinfer == pinned(requires, "flashinfer-python")
    kernel = metadata(released_wheel("sglang-kernel", recipe.sgl_kernel.version))
    (homepage,) = [u.split(",", 1)[1].strip() for u in kernel.get_all("Project-URL") if u.startswith("Homepage,")]
    assert homepage.endswith(f"/tree/main/{recipe.sgl_kernel.subdir}"), homepage
    assert homepage.startswith(recipe.sgl_kernel.repo.removesuffix(".git") + "/tree/")


def released_cache(tmp_path: Path, *releases: tuple[str, str]) -> Path:
    """A wheel folder holding links to just these released wheels."""
    folder = tmp_path / "wheels"
    folder.mkdir(exist_ok=True)
    for name, version in releases:
        wheel = released_wheel(name, version)
        (folder / wheel.name).symlink_to(wheel)
    return folder


def offline(cache: Path, links: Path) -> dict[str, str]:
    """The user's pip configuration for these runs: no index, only the given folder of wheels."""
    return {
        "BWSTACK_CACHE": str(cache),
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
    }


ALL = (("sglang", "0.5.23"), ("sglang", "0.5.22"), ("sglang-kernel", "0.4.10"), ("sglang-kernel", "0.4.9"))


def copy_recipe(tmp_path: Path, edit: dict[str, str] | None = None) -> Path:
    path = tmp_path / "sglang.toml"
    path.write_text(bump(RECIPE.read_text(), edit or {}))
    return path


def test_pins_passes_the_recipe(tmp_path: Path) -> None:
    cache = released_cache(tmp_path, *ALL)
    report = tmp_path / "pins.json"
    result = invoke("pins", "--recipe", "sglang", "--json", str(report), env=offline(cache, cache))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(report.read_text())
    checked = {c["name"] for c in data["checks"]}
    assert {"sgl_kernel.version", "sgl_kernel.subdir", "torch.version", "sglang.flashinfer"} <= checked
    assert {"sglang==0.5.23 wheel", "sglang-kernel==0.4.10 wheel"} <= checked


def test_sglang_0_5_22_with_kernel_0_4_10_is_refused_naming_0_4_9(tmp_path: Path) -> None:
    recipe = copy_recipe(
        tmp_path, {"sglang.version": "0.5.22", "sgl_kernel.ref": "v0.5.22", "sglang.flashinfer": "0.7.1"}
    )
    cache = released_cache(tmp_path, *ALL)
    report = tmp_path / "pins.json"
    result = invoke("pins", "--recipe", str(recipe), "--json", str(report), env=offline(cache, cache))
    assert result.returncode == 1, result.stdout + result.stderr
    failed = {c["name"]: c for c in json.loads(report.read_text())["checks"] if c["status"] == "fail"}
    assert list(failed) == ["sgl_kernel.version"]
    assert failed["sgl_kernel.version"]["evidence"]["required"] == "0.4.9"
    assert 'set sgl_kernel.version = "0.4.9"' in failed["sgl_kernel.version"]["remedy"]
    assert "recipe 0.4.10 | required 0.4.9 | MISMATCH" in result.stdout


def test_a_release_without_a_wheel_for_the_recipes_python_is_a_failed_pin(tmp_path: Path) -> None:
    recipe = copy_recipe(tmp_path, {"python.version": "3.10"})
    cache = released_cache(tmp_path, *ALL)
    report = tmp_path / "pins.json"
    result = invoke("pins", "--recipe", str(recipe), "--json", str(report), env=offline(tmp_path / "empty", cache))
    assert result.returncode == 1, result.stdout + result.stderr
    (check,) = json.loads(report.read_text())["checks"]
    assert check["name"] == "sglang==0.5.23 wheel" and check["status"] == "fail"
    assert check["evidence"]["recipe"].startswith("cp310 ")


def test_pins_fetches_through_pip_into_the_cache(tmp_path: Path) -> None:
    """A release missing from the cache is fetched by pip, with the user's configuration (here: find-links)."""
    links = released_cache(tmp_path, ("sglang", "0.5.23"))
    cache = tmp_path / "cache"
    cache.mkdir()
    kernel = released_wheel("sglang-kernel", "0.4.10")
    (cache / kernel.name).symlink_to(kernel)  # the 373 MB kernel is not copied again
    result = invoke("pins", "--recipe", "sglang", env=offline(cache, links))
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in cache.glob("sglang-*.whl")] == [released_wheel("sglang", "0.5.23").name]


def test_an_unreachable_registry_is_exit_2_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before pip connects: nothing listens there
    env = {
        "BWSTACK_CACHE": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_FIND_LINKS": "",
        "PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple",
        "PIP_RETRIES": "0",
    }
    result = invoke("pins", "--recipe", "sglang", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("bwstack: error: cannot reach the package index http://127.0.0.1:")


def test_bump_sglang_rewrites_every_pin_keeps_comments_and_renders(tmp_path: Path) -> None:
    recipe = copy_recipe(tmp_path)
    cache = released_cache(tmp_path, *ALL)
    out = tmp_path / "out"
    result = invoke(
        "pins", "--recipe", str(recipe), "--bump-sglang", "0.5.22", "--out", str(out), env=offline(cache, cache)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    bumped = load_recipe(str(recipe))
    assert bumped.sglang and bumped.sgl_kernel
    assert (bumped.sglang.version, bumped.sgl_kernel.ref) == ("0.5.22", "v0.5.22")
    assert (bumped.sgl_kernel.version, bumped.sglang.flashinfer) == ("0.4.9", "0.7.1")
    comments = [line for line in RECIPE.read_text().splitlines() if line.lstrip().startswith("#")]
    assert [line for line in recipe.read_text().splitlines() if line.lstrip().startswith("#")] == comments
    assert sorted(p.parent.name for p in out.glob("*/Dockerfile")) == sorted(f"sglang-{a}" for a in bumped.archs)
    assert '"sglang==0.5.22"' in (out / "sglang-sm120" / "Dockerfile").read_text()
    back = invoke(
        "pins", "--recipe", str(recipe), "--bump-sglang", "0.5.23", "--out", str(out), env=offline(cache, cache)
    )
    assert back.returncode == 0, back.stdout + back.stderr
    assert recipe.read_text() == RECIPE.read_text()


def test_bump_refuses_a_field_the_recipe_does_not_have() -> None:
    with pytest.raises(RecipeError, match=r"exactly one line nope = "):
        bump(RECIPE.read_text(), {"sglang.nope": "1"})
    assert bump('[a]\nv = "1"  # why\n[b]\nv = "2"\n', {"b.v": "3"}) == '[a]\nv = "1"  # why\n[b]\nv = "3"\n'


def test_the_sm120_build_stage_works_in_the_folder_the_pinned_kernel_is_released_from() -> None:
    from bwstack.images.render import render

    recipe = load_recipe("sglang")
    assert recipe.sgl_kernel
    kernel = metadata(released_wheel("sglang-kernel", recipe.sgl_kernel.version))
    (homepage,) = [u.split(",", 1)[1].strip() for u in kernel.get_all("Project-URL") if u.startswith("Homepage,")]
    folder = homepage.split("/tree/", 1)[1].split("/", 1)[1]
    build_stage = render(recipe, "sm120").dockerfile.split(" AS runtime")[0]
    assert f"WORKDIR /src/repo/{folder}\n" in build_stage
    assert build_stage.count("WORKDIR /src/repo/") == 1


def test_a_recipe_without_sglang_is_one_line_and_exit_2() -> None:
    result = invoke("pins", "--recipe", "demo")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "recipe demo pins no SGLang" in line
