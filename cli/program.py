"""The task layer's shared machinery: one-line errors and exit codes, signals, report output, and the
`bwstack` console script (invoke's Program over the same task collection `invoke` uses in a checkout).

Only this layer turns typed errors into exit codes: 0 pass, 1 a check failed, 2 bad input or broken
infrastructure, 128 + N for a task stopped by signal N."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from typing import Any

from invoke import Context, Exit, Program, task
from invoke.config import Config
from invoke.exceptions import ParseError

from bwstack.errors import BwstackError
from bwstack.report import Report, check_writable

__all__ = ["Context", "finish", "guarded", "setting", "task"]

# What invoke.yaml in a checkout says; the console script has no invoke.yaml, so these are its defaults.
DEFAULTS = {"repo": "bwstack", "out": "build", "recipe": "sglang"}


def _parse_errors_exit_2() -> None:
    """invoke exits 1 for a flag or task it cannot parse (a typo, a missing value), which CI would read as
    "a check failed"; bwstack's contract is exit 2 for bad input. invoke imports this file before it parses
    the task flags, so the two parsing steps are wrapped here, once, to turn ParseError into exit 2."""
    for step in ("parse_tasks", "parse_cleanup"):
        original = getattr(Program, step)
        if getattr(original, "bwstack_exit_2", False):
            continue

        def wrapped(self: Program, _original: Callable[[Program], None] = original) -> None:
            try:
                _original(self)
            except ParseError as error:
                raise Exit(f"bwstack: error: {error}", code=2) from None

        wrapped.bwstack_exit_2 = True  # type: ignore[attr-defined]
        setattr(Program, step, wrapped)


_parse_errors_exit_2()


class TaskInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached a running task. Raised like Ctrl-C so every `finally` and context manager
    runs (probe children killed, the verify container removed, temp folders deleted) before exit."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}")


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise TaskInterrupted(signum)


def guarded(body: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a BwstackError into one line on stderr and exit 2: never a traceback for bad input. While the
    task runs, SIGTERM and SIGHUP unwind it like Ctrl-C (Python's default would skip all clean-up)."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            check_writable(kwargs.get("json"), kwargs.get("junit"))  # invoke passes flags as keywords
            return body(*args, **kwargs)
        except BwstackError as error:
            print(f"bwstack: error: {error.one_line()}", file=sys.stderr)
            raise Exit(code=2) from None
        except KeyboardInterrupt as interrupt:
            # The shell convention, 128 + signal; a signal's interrupt carries its number, Ctrl-C does not.
            signum = int(getattr(interrupt, "signum", signal.SIGINT))
            print(f"bwstack: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
            raise Exit(code=128 + signum) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    return wrapper


def finish(report: Report, *, json: str | None = None, junit: str | None = None) -> None:
    """Print the table, write the machine-readable copies, exit with the report's code."""
    report.print_table()  # first, so a report path that cannot be written loses nothing on screen
    report.write(json_path=json, junit_path=junit)
    if report.exit_code:
        raise Exit(code=report.exit_code)


def setting(c: Context, key: str, given: str | None) -> str:
    """A flag if given, else invoke.yaml's bwstack.<key> (overridable by INVOKE_BWSTACK_<KEY>)."""
    section = c.config.get("bwstack") or {}
    return given if given else str(section.get(key, DEFAULTS[key]))


class BwstackConfig(Config):
    """invoke's config with bwstack's defaults, so the installed `bwstack` command needs no invoke.yaml.
    Environment overrides keep invoke's prefix: INVOKE_BWSTACK_REPO=... works for both front doors."""

    prefix = "invoke"

    @staticmethod
    def global_defaults() -> dict[str, Any]:
        return {**Config.global_defaults(), "bwstack": dict(DEFAULTS)}


def main() -> None:
    """The `bwstack` console script: `bwstack verify --arch sm120 --wheel F` == `invoke verify ...`."""
    from bwstack import __version__
    from bwstack.cli import namespace

    Program(
        name="bwstack", binary="bwstack", version=__version__, namespace=namespace, config_class=BwstackConfig
    ).run()
