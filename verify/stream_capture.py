"""Read a binary's fatbin headers in one forward pass over a stream (a deflated wheel member).

A deflated member cannot be read at random offsets, and an ELF's section table sits at its end, after the
device code it describes. Copying every member to disk first made verifying a wheel cost ~1.4x merely
decompressing it. Instead, while the stream goes by once, keep only the few windows the header walk can
need: the ELF header, the file's tail (section table and names), and, wherever the fatbin container
magic appears, that container's header, the 64-byte header of each entry it chains to, and the bytes just
after it (padding). The ordinary walk then runs over those windows. If it asks for a byte that was not
kept (an unusual layout), `WindowMiss` is raised and the caller falls back to a full copy, so the answer
is always the same as reading the whole file.

What is kept is bounded (`KEEP_BUDGET`): a hostile member padded with thousands of container headers
would otherwise grow the windows without limit (issue 14), so past the budget the pass gives up at
once with a `WindowMiss` and the caller reads a bounded on-disk copy, as `--path` would.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

from bwstack.errors import FatbinError
from bwstack.verify.fatbin import CONTAINER_MAGIC

CONTAINER_PREFIX = struct.pack("<IHH", CONTAINER_MAGIC, 1, 16)  # magic, version 1, header size 16
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY_PREFIX = struct.Struct("<HHIQ")  # kind, pad, header size, payload size
ENTRY_WINDOW = 64  # the walk reads the first 64 bytes of every entry header
AFTER_CONTAINER = 256  # alignment padding after a container, read by the walk
TAIL = 4 << 20  # section headers and their names live in the last few KB of a .so
CHUNK = 1 << 20
FIRST_CUBIN = 64 << 10  # a container's first cubin up to this size is kept whole (fatbin.py reads its symbols)
# Overlap kept between chunks so a header, or a kept first cubin, split across two is still seen whole.
_CARRY = 1 << 17
# Header windows kept in one pass, besides the tail (bytes plus a per-window allowance for Python's object
# overhead). Real libraries need well under 1 MiB (a few thousand entries); past this it is hostile padding.
KEEP_BUDGET = 4 << 20
_FOLLOWER_COST = 512  # a follower and the windows it will want (header, padding, entries)
_WINDOW_OVERHEAD = 160  # a (start, bytes) tuple in a list, and the follower behind it


class WindowMiss(FatbinError):
    """The header walk needed bytes that the single pass did not keep."""


@dataclass
class _Follower:
    """Walks one candidate container's entry chain as the stream arrives."""

    start: int
    pos: int = -1  # next entry header; -1 until the container header has been parsed
    end: int = 0
    cubin_seen: bool = False


@dataclass
class WindowSource:
    """An elf.Source over the kept windows of a stream: read() serves them, or raises WindowMiss."""

    label: str
    size: int
    starts: list[int] = field(default_factory=list)
    blocks: list[bytes] = field(default_factory=list)

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise FatbinError(f"{self.label}: read of {length} bytes at offset {offset} is outside the file")
        index = bisect.bisect_right(self.starts, offset) - 1
        if index >= 0:
            start, block = self.starts[index], self.blocks[index]
            if offset + length <= start + len(block):
                return block[offset - start : offset - start + length]
        raise WindowMiss(f"{self.label}: bytes {offset}..{offset + length} were not kept in the single pass")


def capture(stream: BinaryIO, size: int, label: str) -> WindowSource:
    """One pass over `stream` (exactly `size` bytes) keeping the windows a fatbin header walk reads."""
    windows: list[tuple[int, bytes]] = []
    wanted: list[tuple[int, int]] = []  # (start, length) not yet complete
    followers: list[_Follower] = []
    tail_start = max(0, size - TAIL)
    tail_parts: list[bytes] = []
    carry, carry_start, offset, scan_from, skip_until, kept = b"", 0, 0, 0, 0, 0
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            break
        if offset + len(chunk) > tail_start:
            tail_parts.append(chunk[max(0, tail_start - offset) :])
        data, data_start = carry + chunk, carry_start
        data_end = data_start + len(data)
        if offset == 0:
            wanted.append((0, ENTRY_WINDOW))
        # Scan for containers, but not inside the bodies of containers already found: device code is
        # most of a big .so and a body holds entries, not containers. (A hostile header that claims a
        # body over real containers only costs a WindowMiss, i.e. the full-copy fallback.)
        at = max(scan_from, skip_until) - data_start
        while at < len(data):
            found = data.find(CONTAINER_PREFIX, at)
            if found < 0:
                break
            followers.append(_Follower(data_start + found))
            if len(followers) * _FOLLOWER_COST > KEEP_BUDGET:  # checked per container: one chunk can hold 65,536
                raise WindowMiss(f"{label}: more fatbin containers than one pass follows ({len(followers)})")
            at = found + 1
            if found + _CONTAINER.size <= len(data):
                _magic, _version, header_size, body = _CONTAINER.unpack_from(data, found)
                end = data_start + found + header_size + body
                if end <= size:
                    skip_until = max(skip_until, end)
                    at = max(at, skip_until - data_start)
        scan_from = max(data_start, data_end - len(CONTAINER_PREFIX) + 1)
        _advance(followers, wanted, data, data_start, size)
        still: list[tuple[int, int]] = []
        for start, length in wanted:
            if start >= data_start and start + length <= data_end:
                windows.append((start, data[start - data_start : start + length - data_start]))
                kept += length + _WINDOW_OVERHEAD
            elif start + length > data_end and start >= data_start:
                still.append((start, length))
        wanted = still
        if kept + _WINDOW_OVERHEAD * (len(wanted) + len(followers)) > KEEP_BUDGET:
            raise WindowMiss(f"{label}: more fatbin headers than one pass keeps ({len(windows)} windows)")
        offset += len(chunk)
        carry = data[-_CARRY:]
        carry_start = data_end - len(carry)
    if offset != size:
        raise FatbinError(f"{label}: stream ended after {offset} of {size} bytes")
    if tail_parts:
        windows.append((tail_start, b"".join(tail_parts)))
    return _merge(label, size, windows)


def _advance(
    followers: list[_Follower], wanted: list[tuple[int, int]], data: bytes, data_start: int, size: int
) -> None:
    """Move every follower as far along its chain as the bytes in `data` allow; drop finished ones."""
    data_end = data_start + len(data)
    alive = []
    for follower in followers:
        if follower.pos < 0:
            if follower.start + _CONTAINER.size > data_end:
                alive.append(follower)
                continue
            at = follower.start - data_start
            _magic, _version, header_size, body = _CONTAINER.unpack_from(data, at)
            wanted.append((follower.start, _CONTAINER.size))
            follower.pos, follower.end = follower.start + header_size, follower.start + header_size + body
            if follower.end > size:
                continue  # not a real container (or a corrupt one the walk will report)
            wanted.append((follower.end, min(AFTER_CONTAINER, size - follower.end)))
        while follower.pos < follower.end and follower.pos + ENTRY_WINDOW <= data_end:
            if follower.pos < data_start:
                break  # fell behind the kept overlap: leave it to the WindowMiss fallback
            kind, _pad, header_size, payload = _ENTRY_PREFIX.unpack_from(data, follower.pos - data_start)
            first_cubin = kind == 2 and not follower.cubin_seen and payload <= FIRST_CUBIN and header_size <= 1024
            follower.cubin_seen = follower.cubin_seen or kind == 2
            wanted.append((follower.pos, header_size + payload if first_cubin else ENTRY_WINDOW))
            if header_size < ENTRY_WINDOW:
                follower.pos = follower.end  # garbage: stop following, the walk will judge
                break
            follower.pos += header_size + payload
        if follower.pos < follower.end and follower.pos >= data_start:
            alive.append(follower)
    followers[:] = alive


def _merge(label: str, size: int, windows: list[tuple[int, bytes]]) -> WindowSource:
    """Sorted, non-overlapping blocks, so read() can find its block with one bisect. Overlapping windows
    grow one bytearray in place: joining immutable bytes would copy the block once per window."""
    starts: list[int] = []
    blocks: list[bytearray] = []
    for start, block in sorted(windows, key=lambda w: w[0]):
        if starts and start <= starts[-1] + len(blocks[-1]):
            end = starts[-1] + len(blocks[-1])
            if start + len(block) > end:
                blocks[-1] += block[end - start :]
        else:
            starts.append(start)
            blocks.append(bytearray(block))
    return WindowSource(label, size, starts, [bytes(b) for b in blocks])
