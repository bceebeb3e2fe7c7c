"""Kernel names of a ZSTD-compressed cubin, decoded as a stream with bounded memory.

A cubin's symbol and string tables sit near its start (after the ELF header and `.shstrtab`), its
section header table at its end, and the machine code in between: in sglang-kernel 0.4.10's
flash_ops the tables end ~9 MB into 41 MB cubins. One streamed pass keeps only the first PREFIX bytes
and the section header table (its place is in the ELF header, so it is recognised as it streams by);
the symbol reader then runs over those two windows. Streaming in 1 MiB pieces is also faster than
one-shot decoding into a cubin-sized buffer (2.5x on those cubins). A layout that puts the tables
past PREFIX returns None, and the caller decodes the whole cubin instead: the shortcut never changes
the answer.
"""

from __future__ import annotations

import struct

from bwstack.errors import FatbinError
from bwstack.verify import elf

PREFIX = 12 << 20
_CHUNK = 1 << 20
_EHDR = struct.Struct("<4sBBBBB7xHHIQQQIHHHHHH")


class _Outside(Exception):
    """The symbol reader asked for bytes outside the kept windows."""


class _Windows:
    """An elf.Source over the kept ranges of a cubin."""

    def __init__(self, label: str, size: int, windows: list[tuple[int, bytes | bytearray]]) -> None:
        self.label, self.size, self.windows = label, size, windows

    def read(self, offset: int, length: int) -> bytes:
        elf.check_range(self, offset, length, "read")
        for start, block in self.windows:
            if start <= offset and offset + length <= start + len(block):
                return bytes(block[offset - start : offset - start + length])
        raise _Outside

    def buffer(self, offset: int, length: int) -> tuple[bytes | bytearray, int] | None:
        """The block holding [offset, offset+length) and where that range starts in it, without copying."""
        for start, block in self.windows:
            if start <= offset and offset + length <= start + len(block):
                return block, offset - start
        return None


class _RawReader:
    """The compressed payload as a file-like object, read from the source in pieces (never whole)."""

    def __init__(self, source: elf.Source, offset: int, size: int) -> None:
        self.source, self.pos, self.end = source, offset, offset + size

    def read(self, size: int = -1) -> bytes:
        size = self.end - self.pos if size < 0 else min(size, self.end - self.pos)
        data = self.source.read(self.pos, size) if size > 0 else b""
        self.pos += len(data)
        return data


def zstd_kernels(source: elf.Source, offset: int, compressed: int, size: int, label: str) -> tuple[str, ...] | None:
    """Kernel names of the ZSTD cubin at [offset, offset+compressed) of `source` that decodes to exactly `size`
    bytes; None when its tables lie outside what was kept. Memory: PREFIX + one chunk, allocated once."""
    import zstandard  # a C codec; imported here so header-only listing never needs it

    prefix = bytearray(min(size, PREFIX))
    scratch = bytearray(_CHUNK)
    table: tuple[int, int] | None = None
    kept = bytearray()
    pos = 0
    raw = _RawReader(source, offset, compressed)
    try:
        with zstandard.ZstdDecompressor().stream_reader(raw, read_size=_CHUNK, read_across_frames=False) as reader:
            while True:
                into = memoryview(prefix)[pos : pos + _CHUNK] if pos < len(prefix) else memoryview(scratch)
                count = reader.readinto(into)
                if not count:
                    break
                if pos + count > size:
                    raise FatbinError(f"{label}: ZSTD payload decodes to more than the {size} bytes its header says")
                if table is None and pos + count >= _EHDR.size:
                    fields = _EHDR.unpack_from(prefix)
                    start = fields[11]  # e_shoff; the table is e_shnum * e_shentsize bytes
                    table = (start, start + fields[-3] * max(fields[-2], 1))
                if table and table[0] >= len(prefix) and pos + count > table[0] and pos < table[1]:
                    kept += into[max(0, table[0] - pos) : min(count, table[1] - pos)]
                pos += count
    except zstandard.ZstdError as error:
        raise FatbinError(f"{label}: ZSTD payload is corrupt: {error}") from error
    if pos != size:
        raise FatbinError(f"{label}: decompressed to {pos} bytes, header says {size}")
    windows: list[tuple[int, bytes | bytearray]] = [(0, prefix)]
    if table and table[0] >= len(prefix):
        windows.append((table[0], kept))
    try:
        return tuple(elf.kernel_symbols(_Windows(label, size, windows)))
    except _Outside:
        return None
