"""Developer tasks: lint and tests."""

from __future__ import annotations

import sys
from pathlib import Path

from bwstack.cli.program import Context, task


@task(
    help={
        "args": 'extra arguments passed to pytest, e.g. "-k render -x"',
        "lint": "run ruff check and ruff format --check first (default: on; --no-lint skips)",
    }
)
def test(c: Context, args: str = "", lint: bool = True) -> None:
    """Fetch the released wheels the tests read (once), run ruff, then the test suite (pytest)."""
    prefetch = Path("scripts/prefetch.py")
    if prefetch.is_file():  # a checkout: the tests need tests/released.toml's wheels in the cache
        c.run(f"{sys.executable} {prefetch}", pty=False)
    if lint:
        c.run(f"{sys.executable} -m ruff check .", pty=False)
        c.run(f"{sys.executable} -m ruff format --check .", pty=False)
    # -rs: every skip says why (no Docker, no busybox-static) in the summary.
    c.run(f"{sys.executable} -m pytest -rs {args}", pty=False)
