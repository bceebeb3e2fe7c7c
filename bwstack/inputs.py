"""Numeric command-line values, parsed by us rather than by invoke.

invoke converts flags whose default is an int or float itself, and a value like `--tp eight` then ends in
a traceback. The tasks take such flags as text and parse them here, so bad input is one line and exit 2.
"""

from __future__ import annotations

import math
import re
from typing import TypeVar

from bwstack.errors import BwstackError

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
