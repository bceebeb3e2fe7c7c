"""bwstack's front door: thin Invoke tasks. Each parses flags, calls one library function, prints the
report and exits 0 (pass), 1 (a check failed) or 2 (bad input or infrastructure). No logic lives here."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from invoke import Context, Exit, task

from bwstack.errors import BwstackError
from bwstack.report import Report


def guarded(body: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a BwstackError into one line on stderr and exit 2: never a traceback for bad input."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except BwstackError as error:
            print(f"bwstack: error: {error.one_line()}", file=sys.stderr)
            raise Exit(code=2) from None

    return wrapper


def finish(report: Report, *, json: str | None = None, junit: str | None = None) -> None:
    """Write the machine-readable copies, print the table, exit with the report's code."""
    report.write(json_path=json, junit_path=junit)
    report.print_table()
    if report.exit_code:
        raise Exit(code=report.exit_code)


# --- tasks ------------------------------------------------------------------------------------------


@task(help={"args": 'extra arguments passed to pytest, e.g. "-k render -x"'})
def test(c: Context, args: str = "") -> None:
    """Run the test suite (pytest)."""
    c.run(f"{sys.executable} -m pytest {args}", pty=False)
