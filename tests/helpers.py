"""Helpers shared by the tests that drive bwstack as a user does: `invoke <task>` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.paths import REPO


def invoke(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run `invoke ARGS` against this repo's tasks.py; wide COLUMNS so table cells are not wrapped."""
    return subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
