"""Limits on what a wheel may make verify inflate, so a hostile zip costs bounded time, memory and disk.

A zip's sizes are claims: a few MB of deflate can expand to many GB, and the central directory may
disagree with the stream. So every member is checked before it is opened (encryption and compression
methods zipfile cannot read are refused by name, not by traceback; a declared size over the cap is
refused), free temp space is checked before a copy, and bytes are counted while inflating, stopping a
member the moment it passes its declared size or the cap. Real members reach ~1.1 GB (sgl-kernel's
largest .so), so the default cap of 4 GiB leaves room; `--max-member-size` raises it.
"""

from __future__ import annotations

import lzma
import shutil
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from bwstack.errors import BwstackError, SourceError

DEFAULT_MAX_MEMBER = 4 << 30
# Python and metadata files are extracted for the loader probe; none is anywhere near this, so a bigger
# one is hostile padding: it is left out (and listed) rather than written to disk.
MAX_TEXT_MEMBER = 64 << 20
SPACE_MARGIN = 64 << 20  # left free on the temp file system after a copy
CHUNK = 1 << 20
# Methods Python's zipfile can inflate (bzip2 and lzma only when their modules were built in).
READABLE_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
_ENCRYPTED = 0x1
# What inflating a corrupt member can raise: zipfile's own errors, and the codecs' (found by fuzzing).
INFLATE_ERRORS = (
    zipfile.BadZipFile,
    EOFError,
    OSError,
    RuntimeError,
    NotImplementedError,
    zlib.error,
    lzma.LZMAError,
    ValueError,  # a local header's name that is not the UTF-8 its flag claims (UnicodeDecodeError)
)


@dataclass(frozen=True)
class Limits:
    """How much one wheel member (and all extracted Python files together) may inflate to."""

    max_member: int = DEFAULT_MAX_MEMBER

    def __post_init__(self) -> None:
        if self.max_member < 1:
            raise SourceError(f"--max-member-size {self.max_member}: must be at least 1 byte")


def parse_size(text: str) -> int:
    """`4G`, `512M`, `100k` or plain bytes, as --max-member-size takes them."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    body = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = body[-1] if body and body[-1] in "kmgt" else ""
    digits = body.removesuffix(unit)
    if not digits.isdigit() or len(digits) > 15:
        raise SourceError(f"--max-member-size {text!r}: not a size", remedy="e.g. --max-member-size 8G")
    return Limits(int(digits) * units[unit]).max_member


def check_member(wheel: Path, info: zipfile.ZipInfo, limits: Limits) -> None:
    """Refuse, by name, a member that zipfile cannot read or that claims more than the cap."""
    where = f"{wheel}!{info.filename}"
    if info.flag_bits & _ENCRYPTED:
        raise SourceError(f"{where}: member is encrypted; wheels are never encrypted", remedy="rebuild the wheel")
    if info.compress_type not in READABLE_METHODS:
        raise SourceError(
            f"{where}: unsupported zip compression method {info.compress_type}",
            remedy="rebuild the wheel with deflate (the wheel standard)",
        )
    if info.file_size > limits.max_member:
        raise SourceError(
            f"{where}: member inflates to {info.file_size} bytes, over the {limits.max_member}-byte cap",
            remedy="raise the cap with --max-member-size if the wheel is trusted",
        )


def check_space(folder: Path, need: int, what: str) -> None:
    """Refuse before copying `need` bytes into `folder` when its file system cannot hold them."""
    free = shutil.disk_usage(folder).free
    if need + SPACE_MARGIN > free:
        raise SourceError(
            f"{what}: needs {need} bytes of temp space, {free} free in {folder}",
            remedy="free space there, or point TMPDIR at a larger file system",
        )


def bounded_copy(
    source: BinaryIO,
    out: BinaryIO,
    declared: int,
    limits: Limits,
    what: str,
    corrupt: type[BwstackError] = SourceError,
) -> int:
    """Copy while counting; stop a member that yields more than it declared (or the cap). A stream that
    cannot be inflated raises `corrupt`; running past a limit or out of disk is always a SourceError."""
    allowed = min(declared, limits.max_member)
    written = 0
    while True:
        try:
            chunk = source.read(CHUNK)
        except INFLATE_ERRORS as error:
            raise corrupt(f"{what}: cannot decompress wheel member: {error}") from None
        if not chunk:
            return written
        written += len(chunk)
        if written > allowed:
            raise SourceError(f"{what}: inflates past its declared {declared} bytes (cap {limits.max_member})")
        try:
            out.write(chunk)
        except OSError as error:
            raise SourceError(f"{what}: cannot write its temp copy: {error.strerror or error}") from None
