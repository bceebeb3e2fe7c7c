"""Input checks every stage shares, written once: numbers, ports, seconds, model folders, output paths.

invoke converts flags whose default is an int or float itself, and a value like `--tp eight` then ends in
a traceback. The tasks take such flags as text and parse them here, so bad input is one line and exit 2.
Requests check their fields with the same functions, so a library caller gets the same one-line errors.
Each check raises the caller's error type (PreflightError, SmokeError, ...), BwstackError by default.
"""

from __future__ import annotations

import math
import os
import re
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
    maximum: float | None = None,
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
    if maximum is not None and value > maximum:
        raise error(f"{flag} must be at most {maximum:g}, got {str(text).strip()[:40]}")
    return value


def optional_number(
    flag: str,
    text: str | None,
    kind: type[N],
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    error: type[BwstackError] = BwstackError,
) -> N | None:
    """Like number(), but an absent or empty value is None (the flag was not given)."""
    if text is None or str(text).strip() == "":
        return None
    return number(flag, text, kind, minimum=minimum, maximum=maximum, error=error)


# Docker's reference grammar (distribution/reference): [host[:port]/]path[:tag][@digest], path lower-case.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)"
_REFERENCE = re.compile(
    rf"{_HOST}?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@[A-Za-z][A-Za-z0-9]*:[0-9a-fA-F]{{32,}})?"
)


def image_reference(flag: str, text: str, *, error: type[BwstackError] = BwstackError) -> str:
    """`text` if Docker would accept it as an image reference, else `error` naming the flag."""
    if not _REFERENCE.fullmatch(text):
        raise error(f"{flag} {text!r} is not an image reference", remedy="e.g. bwstack:sglang-sm120")
    return text


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
    which is the one honest test (root passes every permission check), and removes it if it was not there.
    Folders are never created: a mistyped folder would otherwise swallow the report silently."""
    for given in paths:
        if given:
            path = Path(given)
            check_report_folder(path)
            existed = path.exists()
            with writing(f"the report to {path}", error=ReportError, remedy=REPORT_REMEDY):
                with path.open("a"):
                    pass
                if not existed:
                    path.unlink()


def check_report_folder(path: Path) -> None:
    """The report's folder must exist; a regular file on the way is named as such, not as "File exists"."""
    folder = path.parent
    if folder.is_dir():
        return
    blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
    problem = f"{blocker} is a file, not a folder" if blocker else f"folder {folder} does not exist"
    raise ReportError(f"cannot write the report to {path}: {problem}", remedy="create the folder, or pass another path")
