"""Read a .safetensors file's header without touching its tensors.

The format: an unsigned 64-bit little-endian header length N, N bytes of JSON mapping each tensor name
to {dtype, shape, data_offsets: [begin, end]} (plus an optional "__metadata__" of strings), then the
data buffer. Offsets are relative to the buffer, tensors tile it without holes or overlaps, and the
file ends where the last tensor ends: size == 8 + N + max(end). Files are opened read-only and only the
first 8 + N bytes are read.
"""

from __future__ import annotations

import json
import math
import reprlib
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bwstack.errors import PreflightError

# The safetensors library refuses headers above 100 MB; a real header is a few MB at most.
MAX_HEADER_BYTES = 100_000_000

# No file holds 2**63 bytes: offsets, dimensions and element counts at or above it are corrupt, and refusing
# them keeps every number a finding prints short (Python refuses to print integers of over 4300 digits).
MAX_SIZE = 2**63

# Excerpts of hostile values in findings: a few levels deep, a few items long, never the whole value.
_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel, _EXCERPT.maxlist, _EXCERPT.maxdict, _EXCERPT.maxstring, _EXCERPT.maxother = 2, 4, 4, 60, 40
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number"}

# Bits per element for the format's dtypes; a dtype not listed is accepted without a size check.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
}


class ShardError(PreflightError):
    """A safetensors file whose header cannot be read or does not match the file."""

    def __init__(self, path: Path, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path.name}: {problem}")


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class ShardHeader:
    path: Path
    header_bytes: int
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    file_size: int

    @property
    def data_bytes(self) -> int:
        return max((t.end for t in self.tensors.values()), default=0)


def excerpt(value: Any) -> str:
    """A short, depth-limited repr of a value read from a file: safe to put in a finding whatever it holds."""
    return _EXCERPT.repr(value)


def json_kind(value: Any) -> str:
    """What a parsed JSON value is, as JSON names it, with an excerpt: 'an array ([[1, 2], ...])'."""
    kind = _JSON_TYPES.get(type(value), "a number" if isinstance(value, float) else "null")
    return kind if value is None else f"{kind} ({excerpt(value)})"


def is_text(value: Any) -> bool:
    """A string that can be written out as UTF-8 (JSON's \\ud800 escapes decode to unpaired surrogates)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _size(value: Any) -> bool:
    """A byte offset or dimension: a JSON integer (not a boolean) in [0, 2**63)."""
    return type(value) is int and 0 <= value < MAX_SIZE


def _entry(path: Path, name: str, raw: Any) -> TensorEntry:
    if not is_text(name):
        raise ShardError(path, f"tensor name {excerpt(name)} is not valid UTF-8 text")
    label = f"tensor {excerpt(name)}"
    if not isinstance(raw, dict):
        raise ShardError(path, f"{label}: header entry is {json_kind(raw)}, not an object")
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not is_text(dtype):
        raise ShardError(path, f"{label}: dtype is {json_kind(dtype)}, expected a string")
    if not isinstance(shape, list) or not all(_size(d) for d in shape):
        raise ShardError(path, f"{label}: shape {excerpt(shape)} is not a list of sizes")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_size(o) for o in offsets):
        raise ShardError(path, f"{label}: data_offsets {excerpt(offsets)} are not [begin, end]")
    if offsets[0] > offsets[1]:
        raise ShardError(path, f"{label}: data_offsets {excerpt(offsets)} are not [begin, end]")
    elements = 1
    for dim in shape:
        elements *= dim
        if elements >= MAX_SIZE:
            raise ShardError(path, f"{label}: shape {excerpt(shape)} holds 2**63 elements or more")
    entry = TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])
    bits = DTYPE_BITS.get(dtype)
    if bits is not None:
        need = math.ceil(elements * bits / 8)
        if entry.nbytes != need:
            raise ShardError(
                path, f"{label}: {dtype}{excerpt(shape)} needs {need} bytes, data_offsets span {entry.nbytes}"
            )
    return entry


def read_header(path: Path) -> ShardHeader:
    """Parse and validate one file's header; ShardError names the file and what is wrong."""
    length, raw, size = _raw_header(path)
    header = _parse(path, raw)
    metadata = _metadata(path, header.pop("__metadata__", None))
    tensors = {name: _entry(path, name, raw_entry) for name, raw_entry in header.items()}
    _check_contiguous(path, tensors)
    shard = ShardHeader(path, length, tensors, metadata, size)
    expected = 8 + length + shard.data_bytes
    if size < expected:
        raise ShardError(path, f"truncated: {size} bytes, the header describes {expected} ({expected - size} missing)")
    if size > expected:
        raise ShardError(
            path, f"{size - expected} bytes after the last tensor (file {size}, header describes {expected})"
        )
    return shard


def _raw_header(path: Path) -> tuple[int, bytes, int]:
    """The header's length, its bytes and the file's size; the length is checked before anything is read."""
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ShardError(path, f"truncated: {size} bytes, too short for the 8-byte header length")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise ShardError(
                    path, f"header length {length} exceeds the {MAX_HEADER_BYTES}-byte cap (not safetensors?)"
                )
            if 8 + length > size:
                raise ShardError(path, f"truncated: header length {length} runs past the end of a {size}-byte file")
            return length, handle.read(length), size
    except FileNotFoundError:
        raise ShardError(path, "missing") from None
    except OSError as error:
        raise ShardError(path, f"cannot read: {error.strerror or error}") from None


def _parse(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ShardError(path, f"header is not valid JSON ({error})") from None
    except ValueError as error:  # e.g. an integer of more digits than Python converts
        raise ShardError(path, f"header is not valid JSON ({' '.join(str(error).split())})") from None
    except RecursionError:
        raise ShardError(path, "header is not valid JSON (nested deeper than the JSON parser allows)") from None
    if not isinstance(header, dict):
        raise ShardError(path, f"header is {json_kind(header)}, not a JSON object")
    return header


def _metadata(path: Path, metadata: Any) -> dict[str, str]:
    """`__metadata__`: absent, or an object of strings."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ShardError(path, f"__metadata__ is {json_kind(metadata)}, not an object")
    for key, value in metadata.items():
        if not is_text(key) or not is_text(value):
            raise ShardError(path, f"__metadata__[{excerpt(key)}] is {json_kind(value)}, expected a string")
    return dict(metadata)


def _check_contiguous(path: Path, tensors: dict[str, TensorEntry]) -> None:
    """Tensors tile the data area from offset 0: no hole, no overlap."""
    cursor = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != cursor:
            gap = (
                "overlaps the previous tensor" if entry.begin < cursor else f"leaves a {entry.begin - cursor}-byte hole"
            )
            raise ShardError(path, f"tensor {excerpt(name)} at offset {entry.begin} {gap}")
        cursor = entry.end
