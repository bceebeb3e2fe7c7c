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
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bwstack.errors import PreflightError

# The safetensors library refuses headers above 100 MB; a real header is a few MB at most.
MAX_HEADER_BYTES = 100_000_000

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


def _entry(path: Path, name: str, raw: Any) -> TensorEntry:
    if not isinstance(raw, dict):
        raise ShardError(path, f"tensor {name!r}: header entry is not an object")
    dtype, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if not isinstance(dtype, str):
        raise ShardError(path, f"tensor {name!r}: no dtype")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ShardError(path, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise ShardError(path, f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]")
    entry = TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])
    bits = DTYPE_BITS.get(dtype)
    if bits is not None:
        need = math.ceil(math.prod(entry.shape) * bits / 8)
        if entry.nbytes != need:
            raise ShardError(
                path, f"tensor {name!r}: {dtype}{list(shape)} needs {need} bytes, data_offsets span {entry.nbytes}"
            )
    return entry


def read_header(path: Path) -> ShardHeader:
    """Parse and validate one file's header; ShardError names the file and what is wrong."""
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
            raw = handle.read(length)
    except FileNotFoundError:
        raise ShardError(path, "missing") from None
    except OSError as error:
        raise ShardError(path, f"cannot read: {error.strerror or error}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ShardError(path, f"header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ShardError(path, "header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise ShardError(path, "__metadata__ is not an object")
    tensors = {name: _entry(path, name, raw_entry) for name, raw_entry in header.items()}
    cursor = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != cursor:
            gap = (
                "overlaps the previous tensor" if entry.begin < cursor else f"leaves a {entry.begin - cursor}-byte hole"
            )
            raise ShardError(path, f"tensor {name!r} at offset {entry.begin} {gap}")
        cursor = entry.end
    shard = ShardHeader(path, length, tensors, {str(k): str(v) for k, v in metadata.items()}, size)
    expected = 8 + length + shard.data_bytes
    if size < expected:
        raise ShardError(path, f"truncated: {size} bytes, the header describes {expected} ({expected - size} missing)")
    if size > expected:
        raise ShardError(
            path, f"{size - expected} bytes after the last tensor (file {size}, header describes {expected})"
        )
    return shard
