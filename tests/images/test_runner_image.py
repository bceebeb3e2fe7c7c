"""The installed distribution: what the fleet's runner image copies builds a wheel that claims only the name
`bwstack`, carries everything a task reads at run time, and whose `bwstack` command runs the tasks."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.paths import REPO

DOCKERFILE = REPO / "images" / "runner" / "Dockerfile"


def copied_paths() -> list[str]:
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            sources += line.split()[1:-1]
    return sources


def test_runner_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    result = subprocess.run(
        [hadolint, "--config", str(REPO / ".hadolint.yaml"), str(DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from exactly what the runner's Dockerfile copies, as its `pip install .` does."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    context = tmp_path / "context"
    for source in copied_paths():
        origin = REPO / source.rstrip("/")
        assert origin.exists(), source
        target = context / source.rstrip("/")
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(origin, target)
    out = tmp_path / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (built,) = out.glob("bwstack-*.whl")
    return built


def test_the_wheel_claims_only_the_bwstack_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"bwstack"}


def test_the_wheel_carries_what_tasks_read_at_run_time(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    needed = {
        "bwstack/recipes/sglang.toml",
        "bwstack/recipes/demo.toml",
        "bwstack/images/templates/sglang.Dockerfile.j2",
        "bwstack/images/templates/partials/sgl_kernel_build.j2",
        "bwstack/images/demo/server/entrypoint.sh",
        "bwstack/images/demo/model/config.json",
        "bwstack/images/demo/packages/good/sgl_kernel/load_utils.py",
        "bwstack/images/demo/packages/good/sgl_kernel/sm100/common_ops.abi3.so",
        "bwstack/images/demo/packages/incident/sgl_kernel/sm100/common_ops.abi3.so",
        "bwstack/nodes/templates/fleet/daemonset.yaml.j2",
        "bwstack/nodes/templates/fleet/playbook.yml.j2",
        "bwstack/cli/program.py",
    }
    assert needed <= names, sorted(needed - names)
    assert not any(n.startswith("bwstack/tests/") or "/fixtures/" in n for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "bwstack = bwstack.cli.program:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_command_renders_without_a_checkout(wheel: Path, tmp_path: Path) -> None:
    """Installed into a bare folder and run from elsewhere: the `bwstack` command finds its recipes and
    templates in the package, not in a checkout."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    away = tmp_path / "elsewhere"
    away.mkdir()
    code = "import sys; from bwstack.cli.program import main; sys.argv = ['bwstack', *sys.argv[1:]]; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "render", "--arch", "sm120", "--recipe", "demo", "--out", str(away / "out")],
        cwd=away,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert (away / "out" / "demo-sm120" / "Dockerfile").is_file()
    assert str(REPO) not in (away / "out" / "demo-sm120" / "build.json").read_text()


def test_demo_packages_are_the_nvcc_built_fixtures() -> None:
    """The demo stack ships copies of two fixture packages (build_fixtures.sh writes both): byte-identical."""
    for variant in ("good", "incident"):
        shipped = REPO / "images" / "demo" / "packages" / variant
        fixture = REPO / "tests" / "fixtures" / "packages" / variant
        files = sorted(
            p.relative_to(fixture) for p in fixture.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
        assert files
        for relative in files:
            assert (shipped / relative).read_bytes() == (fixture / relative).read_bytes(), relative


def test_fleet_commands_are_tasks_that_exist() -> None:
    """The DaemonSet runs `bwstack preflight` and `bwstack provision` in the runner: both must be tasks."""
    from bwstack.cli import namespace

    assert {"preflight", "provision"} <= set(namespace.task_names)
