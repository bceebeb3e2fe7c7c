"""The fleet runner image: its Dockerfile lints, and the files it copies make an installable bwstack."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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


def test_the_copied_files_install_with_templates_and_tasks(tmp_path: Path) -> None:
    """Build the package from exactly what the Dockerfile copies, as `pip install .` in the image does."""
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
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    root = site / "images" / "templates"
    templates = {p.relative_to(root).as_posix() for p in root.rglob("*.j2")}
    assert {"sglang.Dockerfile.j2", "fleet/daemonset.yaml.j2", "partials/sgl_kernel_build.j2"} <= templates
    assert (site / "recipes" / "sglang.toml").is_file()


def test_fleet_commands_are_invoke_tasks_that_exist() -> None:
    """The DaemonSet runs `invoke preflight` and `invoke provision` in the runner: both must be tasks."""
    tasks = (REPO / "tasks.py").read_text()
    for name in ("preflight", "provision"):
        assert re.search(rf"^def {name}\(", tasks, re.M), name
    assert 'ENTRYPOINT ["invoke"]' in DOCKERFILE.read_text()
