"""Input checks every stage shares, written once: numbers, ports, seconds, model folders, output paths.

invoke converts flags whose default is an int or float itself, and a value like `--tp eight` then ends in
a traceback. The tasks take such flags as text and parse them here, so bad input is one line and exit 2.
Requests check their fields with the same functions, so a library caller gets the same one-line errors.
Each check raises the caller's error type (PreflightError, SmokeError, ...), BwstackError by default.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from bwstack.errors import BwstackError, ReportError

N = TypeVar("N", int, float)


def number(
    flag: str,
    text: str | None,
    kind: type[N],
    *,
    minimum: float | None = None,
    error: type[BwstackError] = BwstackError,
) -> N:
    """`text` as an int or float, or `error` naming the flag (e.g. "--tp 'eight' is not a whole number").

    nan and inf are refused ("--x 'nan' is not a finite number"): every comparison with nan is False, so a
    nan would pass any minimum and a timeout of nan or inf would never end.
    """
    try:
        value = kind(str(text).strip())
    except ValueError:
        raise error(f"{flag} {text!r} is not a {'whole ' if kind is int else ''}number") from None
    if not math.isfinite(value):
        raise error(f"{flag} {text!r} is not a finite number")
    if minimum is not None and value < minimum:
        raise error(f"{flag} must be at least {minimum:g}, got {text}")
    return value


def optional_number(
    flag: str,
    text: str | None,
    kind: type[N],
    *,
    minimum: float | None = None,
    error: type[BwstackError] = BwstackError,
) -> N | None:
    """Like number(), but an absent or empty value is None (the flag was not given)."""
    if text is None or str(text).strip() == "":
        return None
    return number(flag, text, kind, minimum=minimum, error=error)


def check_port(flag: str, port: int | None, *, error: type[BwstackError] = BwstackError) -> int | None:
    """A TCP port in 1..65535; None (the flag was not given) passes."""
    if port is not None and not 0 < port < 65536:
        raise error(f"{flag} {port} is not a TCP port (1..65535)")
    return port


def check_seconds(flag: str, value: float, *, error: type[BwstackError] = BwstackError) -> float:
    """A duration: finite and positive (nan <= 0 is False, so a nan timeout would otherwise never end)."""
    if not (math.isfinite(value) and value > 0):
        raise error(f"{flag} must be a positive number of seconds, got {value}")
    return value


def check_model_folder(
    path: Path, *, error: type[BwstackError] = BwstackError, remedy: str = "pass --model DIR"
) -> Path:
    """A checkpoint folder that exists, is a folder and can be listed (listing it is the honest test:
    root passes every permission check)."""
    if not path.exists():
        raise error(f"model folder {path} does not exist", remedy=remedy)
    if not path.is_dir():
        raise error(f"model folder {path} is not a folder", remedy=remedy)
    try:
        with os.scandir(path) as entries:
            next(entries, None)
    except OSError as failure:
        raise error(f"model folder {path} cannot be read: {failure.strerror or failure}", remedy=remedy) from None
    return path


@contextmanager
def writing(what: str | Path, *, error: type[BwstackError] = BwstackError, remedy: str) -> Iterator[None]:
    """Around writes to `what`: an OSError becomes one typed line, "cannot write WHAT: reason"."""
    try:
        yield
    except OSError as failure:
        raise error(f"cannot write {what}: {failure.strerror or failure}", remedy=remedy) from None


REPORT_REMEDY = "pass --json/--junit a file path in a writable folder"


def check_writable(*paths: str | Path | None) -> None:
    """Refuse, before any work, a report path that could never be written (ReportError, exit 2): a build
    or a smoke run should not take an hour only to fail at its last line. It opens the file for appending,
    which is the one honest test (root passes every permission check), and removes it if it was not there."""
    for given in paths:
        if given:
            path = Path(given)
            existed = path.exists()
            with writing(f"the report to {path}", error=ReportError, remedy=REPORT_REMEDY):
                path.parent.mkdir(parents=True, exist_ok=True)
                with path.open("a"):
                    pass
                if not existed:
                    path.unlink()
