"""The front door as a user meets it: `invoke <task>` in a subprocess, exit codes and one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import invoke
from tests.paths import REPO, package


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("bwstack: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_list_shows_every_task_with_a_description() -> None:
    result = invoke("--list")
    assert result.returncode == 0
    listed = {line.split()[0]: line for line in result.stdout.splitlines()[2:] if line.strip()}
    assert {"render", "test"} <= listed.keys()
    for name, line in listed.items():
        assert len(line.split()) > 1, f"task {name} has no description"


def test_every_flag_of_every_task_has_help() -> None:
    import inspect

    from invoke import Collection

    sys.path.insert(0, str(REPO))
    import tasks

    collection = Collection.from_module(tasks)
    assert collection.task_names, "no tasks found"
    for name in collection.task_names:
        task = collection[name]
        params = [p for p in inspect.signature(task.body).parameters if p != "c"]
        missing = [p for p in params if not task.help.get(p.replace("_", "-")) and not task.help.get(p)]
        assert not missing, f"task {name}: flags without help: {missing}"


def test_render_writes_the_dockerfile_and_prints_its_path(tmp_path: Path) -> None:
    result = invoke("render", "--arch", "sm120", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    dockerfile = tmp_path / "sglang-sm120" / "Dockerfile"
    assert result.stdout.strip() == str(dockerfile)
    assert "SGL_KERNEL_ENABLE_FA3=OFF" in dockerfile.read_text()
    assert (tmp_path / "sglang-sm120" / "build.json").is_file()


def test_render_unknown_arch_exits_2_with_one_line(tmp_path: Path) -> None:
    assert_one_line_error(invoke("render", "--arch", "sm999", "--out", str(tmp_path)), "unknown arch 'sm999'")
    assert not any(tmp_path.iterdir()), "nothing is written for bad input"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("schema = 1\nname = [\n", "TOML syntax error"),
        ('schema = 1\nname = "broken"\n', "field description: missing (required)"),
    ],
)
def test_render_broken_recipe_exits_2_naming_file(tmp_path: Path, text: str, fragment: str) -> None:
    recipe = tmp_path / "broken.toml"
    recipe.write_text(text)
    result = invoke("render", "--arch", "sm120", "--recipe", str(recipe), "--out", str(tmp_path / "out"))
    assert_one_line_error(result, str(recipe), fragment)


def test_invoke_yaml_default_repo_can_be_overridden_by_environment(tmp_path: Path) -> None:
    import json
    import os

    env = {**os.environ, "INVOKE_BWSTACK_REPO": "registry.example/ml/stack"}
    result = subprocess.run(
        [sys.executable, "-m", "invoke", "render", "--arch", "sm120", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "sglang-sm120" / "build.json").read_text())
    assert manifest["tag"].startswith("registry.example/ml/stack:sglang-sm120-cuda13.1-")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["render"], "no --arch given"),
        (["render", "--arch", "sm120", "--max-jobs", "0"], "--max-jobs must be at least 1"),
        (["build"], "no --arch given"),
        (["build", "--arch", "sm120", "--max-jobs", "many"], "--max-jobs 'many' is not a whole number"),
        (["verify", "--arch", "sm120", "--path", ".", "--timeout", "soon"], "--timeout 'soon' is not a number"),
        (["preflight", "--tp", "eight"], "--tp 'eight' is not a whole number"),
        (["preflight", "--tp", "0"], "--tp must be at least 1"),
        (["provision", "--demo", "--port", "http"], "--port 'http' is not a whole number"),
        (["provision", "--demo", "--stall-timeout", "-1"], "--stall-timeout must be at least 1"),
        (["smoke", "--command", "true", "--port", "x"], "--port 'x' is not a whole number"),
    ],
)
def test_bad_flag_values_exit_2_with_one_line(args: list[str], fragment: str) -> None:
    """invoke would convert int/float flags itself and end in a traceback; the tasks parse them instead."""
    assert_one_line_error(invoke(*args), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["render", "--arch", "sm120", "--bogus"], "No idea what '--bogus' is!"),
        (["biuld", "--arch", "sm120"], "No idea what 'biuld' is!"),
        (["render", "--arch"], "no --arch given"),  # a repeatable flag without a value is an empty list
        (["render", "--arch", "sm120", "--out", "/etc/passwd"], "cannot write /etc/passwd/sglang-sm120"),
        (["render", "--arch", "sm120", "--repo", "Upper/Case"], "is not a valid Docker repository name"),
        (["verify", "--arch", "sm120", "--path", ".", "--package", ""], "is not a Python import name"),
        (["verify", "--arch", "sm120", "--path", str(package("good")), "--json", "/tmp"], "cannot write"),
        (["provision", "--demo", "--port", "70000"], "--port 70000 is not a TCP port"),
        (["smoke", "--command", "sleep 30", "--port", "34998", "--json", "/proc/x.json"], "cannot write the report"),
        (["provision", "--demo", "--junit", "/proc/nope/r.xml"], "cannot write the report"),
    ],
)
def test_parse_errors_and_unwritable_outputs_exit_2_with_one_line(args: list[str], fragment: str) -> None:
    assert_one_line_error(invoke(*args), fragment)
