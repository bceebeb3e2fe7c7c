"""Just enough ELF64 to find sections and list symbols, reading small ranges at known offsets.

Two kinds of input share one parser: a file on disk (host .so files, possibly gigabytes, read with
os.pread so only the few hundred bytes of headers we ask for are ever resident) and a cubin already
in memory (decompressed from a fatbin, for kernel names). Every offset and size read from the input
is checked against the input's real length before it is used, so a hostile header cannot make us
read past the end, allocate a size it invents, or loop.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bwstack.errors import FatbinError

ELF_MAGIC = b"\x7fELF"
ELFCLASS64 = 2
ELFDATA2LSB = 1
SHT_SYMTAB = 2
SHN_XINDEX = 0xFFFF
STT_FUNC = 2
# st_other bit that marks a CUDA kernel entry point (__global__) in a cubin's symbol table.
STO_CUDA_ENTRY = 0x10

_EHDR = struct.Struct("<4sBBBBB7xHHIQQQIHHHHHH")  # e_ident prefix .. e_shstrndx: 64 bytes
_SHDR = struct.Struct("<IIQQQQIIQQ")  # 64 bytes
_SYM = struct.Struct("<IBBHQQ")  # 24 bytes
_U32 = struct.Struct("<I")
_NAME_WINDOW = 256  # longest section/symbol name we read in one go; longer names are read in steps
_MAX_NAME = 1 << 16  # mangled C++ kernel names run to a few KB; beyond this the table is garbage
_WHOLE_TABLE = 16 << 20  # section name tables up to this size are read in one go


class Source(Protocol):
    """Something with a length that hands out byte ranges (a file or an in-memory cubin)."""

    label: str
    size: int

    def read(self, offset: int, length: int) -> bytes: ...


class FileSource:
    """Positioned reads on an open file descriptor: no seek state, no whole-file reads, no mmap."""

    def __init__(self, fd: int, label: str) -> None:
        self.fd = fd
        self.label = label
        self.size = os.fstat(fd).st_size

    def read(self, offset: int, length: int) -> bytes:
        check_range(self, offset, length, "read")
        try:
            data = os.pread(self.fd, length, offset)
        except OSError as error:
            raise FatbinError(f"{self.label}: read failed at offset {offset}: {error.strerror or error}") from error
        if len(data) != length:  # the file shrank under us
            raise FatbinError(f"{self.label}: short read of {length} bytes at offset {offset}")
        return data


class BytesSource:
    """The same interface over bytes already in memory (a decompressed cubin)."""

    def __init__(self, data: bytes, label: str) -> None:
        self.data = memoryview(data)
        self.label = label
        self.size = len(data)

    def read(self, offset: int, length: int) -> bytes:
        check_range(self, offset, length, "read")
        return bytes(self.data[offset : offset + length])


class SliceSource:
    """A byte range of another source seen as a whole input (a stored cubin inside a fatbin)."""

    def __init__(self, outer: Source, offset: int, size: int, label: str) -> None:
        check_range(outer, offset, size, "slice")
        self.outer, self.offset, self.size, self.label = outer, offset, size, label

    def read(self, offset: int, length: int) -> bytes:
        check_range(self, offset, length, "read")
        return self.outer.read(self.offset + offset, length)


def check_range(source: Source, offset: int, length: int, what: str) -> None:
    """Raise FatbinError unless [offset, offset+length) lies inside the source."""
    if offset < 0 or length < 0 or offset + length > source.size:
        raise FatbinError(
            f"{source.label}: {what} at offset {offset} size {length} runs outside the {source.size}-byte input"
        )


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class ElfHeader:
    osabi: int
    abi_version: int
    machine: int
    flags: int
    shoff: int
    shentsize: int
    shnum: int
    shstrndx: int


def is_elf64(source: Source) -> bool:
    if source.size < _EHDR.size:
        return False
    ident = source.read(0, 6)
    return ident[:4] == ELF_MAGIC and ident[4] == ELFCLASS64 and ident[5] == ELFDATA2LSB


def read_header(source: Source) -> ElfHeader:
    if source.size == 0:
        raise FatbinError(f"{source.label}: empty file (0 bytes), not an ELF binary")
    if source.size < _EHDR.size:
        raise FatbinError(f"{source.label}: {source.size} bytes is too short for an ELF header")
    fields = _EHDR.unpack(source.read(0, _EHDR.size))
    magic, cls, data, _ver, osabi, abiver, _type, machine, _version, _entry, _phoff, shoff, flags = fields[:13]
    shentsize, shnum, shstrndx = fields[-3:]
    if magic != ELF_MAGIC:
        raise FatbinError(f"{source.label}: not an ELF file (magic {magic!r})")
    if cls != ELFCLASS64 or data != ELFDATA2LSB:
        raise FatbinError(f"{source.label}: unsupported ELF class {cls} / data encoding {data} (need 64-bit LE)")
    return ElfHeader(osabi, abiver, machine, flags, shoff, shentsize, shnum, shstrndx)


def read_sections(source: Source, header: ElfHeader | None = None, *, names: bool = True) -> list[Section]:
    """All section headers with their names; [] for an ELF without a section table (stripped of it).

    names=False leaves every name empty and skips the name table (kernel listing needs only types)."""
    header = header or read_header(source)
    if header.shoff == 0:
        return []
    if header.shentsize != _SHDR.size:
        raise FatbinError(f"{source.label}: section header size {header.shentsize}, expected {_SHDR.size}")
    shnum, shstrndx = header.shnum, header.shstrndx
    if shnum == 0 or shstrndx == SHN_XINDEX:
        # Extended numbering: the real counts live in section 0's sh_size / sh_link.
        zero = _SHDR.unpack(source.read(header.shoff, _SHDR.size))
        shnum = zero[5] if shnum == 0 else shnum
        shstrndx = zero[6] if shstrndx == SHN_XINDEX else shstrndx
    # Bounded by the file: a table that does not fit is rejected before we read it.
    check_range(source, header.shoff, shnum * _SHDR.size, "section header table")
    table = source.read(header.shoff, shnum * _SHDR.size)
    raw = [_SHDR.unpack_from(table, i * _SHDR.size) for i in range(shnum)]
    if not raw:
        return []
    if not 0 <= shstrndx < shnum:
        raise FatbinError(f"{source.label}: section name table index {shstrndx} out of range (0..{shnum - 1})")
    if not names:
        return [Section(i, "", r[1], r[4], r[5], r[6], r[9]) for i, r in enumerate(raw)]
    names_off, names_size = raw[shstrndx][4], raw[shstrndx][5]
    check_range(source, names_off, names_size, "section name table")
    # A table of a sane size is read once and names are cut from memory; a huge one in small windows.
    table_names = NameTable(source.read(names_off, names_size), source.label) if names_size <= _WHOLE_TABLE else None
    sections = []
    for index, (name_off, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize) in enumerate(raw):
        if table_names is not None:
            name = table_names.name(name_off)
        else:
            name = read_name(source, names_off, names_size, name_off)
        sections.append(Section(index, name, sh_type, offset, size, link, entsize))
    return sections


class NameTable:
    """A string table already in memory: names are found with one search each, no copies of windows.

    `data` may be a larger buffer holding the table at `base` (a decoded cubin prefix), so the table is
    never copied out of it."""

    def __init__(self, data: bytes | bytearray, label: str, base: int = 0, size: int | None = None) -> None:
        self.data, self.label, self.base = data, label, base
        self.size = len(data) - base if size is None else size

    def name(self, offset: int) -> str:
        if not 0 <= offset < self.size:
            raise FatbinError(f"{self.label}: name offset {offset} outside its {self.size}-byte string table")
        start, stop = self.base + offset, self.base + min(self.size, offset + _MAX_NAME)
        end = self.data.find(b"\0", start, stop)
        if end < 0:
            raise FatbinError(f"{self.label}: unterminated name at string table offset {offset}")
        return self.data[start:end].decode("utf-8", "replace")


def read_name(source: Source, table_off: int, table_size: int, name_off: int) -> str:
    """A NUL-terminated name from a string table, read in small windows (tables can be megabytes)."""
    if not 0 <= name_off < table_size:
        raise FatbinError(f"{source.label}: name offset {name_off} outside its {table_size}-byte string table")
    start = table_off + name_off
    limit = min(table_size - name_off, _MAX_NAME)
    out = b""
    while len(out) < limit:
        chunk = source.read(start + len(out), min(_NAME_WINDOW, limit - len(out)))
        end = chunk.find(b"\0")
        if end >= 0:
            return (out + chunk[:end]).decode("utf-8", "replace")
        out += chunk
    raise FatbinError(f"{source.label}: unterminated name at string table offset {name_off}")


def find_section(sections: list[Section], *names: str) -> Section | None:
    """The first section named by `names`, in the order of preference given."""
    by_name = {s.name: s for s in reversed(sections)}
    for name in names:
        if name in by_name:
            return by_name[name]
    return None


def _section_table(source: Source) -> bytes:
    """The raw section header table (extended numbering resolved), checked to fit the input."""
    header = read_header(source)
    if header.shoff == 0:
        return b""
    if header.shentsize != _SHDR.size:
        raise FatbinError(f"{source.label}: section header size {header.shentsize}, expected {_SHDR.size}")
    shnum = header.shnum or _SHDR.unpack(source.read(header.shoff, _SHDR.size))[5]
    check_range(source, header.shoff, shnum * _SHDR.size, "section header table")
    return source.read(header.shoff, shnum * _SHDR.size)


def _section(table: bytes, index: int) -> Section:
    _name, sh_type, _flags, _addr, offset, size, link, _info, _align, entsize = _SHDR.unpack_from(
        table, index * _SHDR.size
    )
    return Section(index, "", sh_type, offset, size, link, entsize)


def kernel_symbols(source: Source) -> Iterator[str]:
    """Names of CUDA kernels (STT_FUNC with the CUDA entry bit in st_other) in an ELF's .symtab."""
    sections = _section_table(source)
    count = len(sections) // _SHDR.size
    # Only the symbol tables and their name tables become Section records (a cubin has ~100 sections).
    symtabs = [i for i in range(count) if _U32.unpack_from(sections, i * _SHDR.size + 4)[0] == SHT_SYMTAB]
    for index in symtabs:
        symtab = _section(sections, index)
        if symtab.entsize != _SYM.size:
            raise FatbinError(f"{source.label}: symbol entry size {symtab.entsize}, expected {_SYM.size}")
        if not 0 <= symtab.link < count:
            raise FatbinError(f"{source.label}: symbol table links to missing section {symtab.link}")
        strtab = _section(sections, symtab.link)
        check_range(source, strtab.offset, strtab.size, "symbol name table")
        check_range(source, symtab.offset, symtab.size, "symbol table")
        table = source.read(symtab.offset, symtab.size - symtab.size % _SYM.size)
        # One read of the name table (already checked to fit the input), then names from memory.
        # A source that holds the table in memory lends it (no copy); others read it once.
        lend = getattr(source, "buffer", None)
        held = lend(strtab.offset, strtab.size) if lend else None
        if held is not None:
            names = NameTable(held[0], source.label, held[1], strtab.size)
        else:
            names = NameTable(source.read(strtab.offset, strtab.size), source.label)
        for st_name, st_info, st_other, _shndx, _value, _size in _SYM.iter_unpack(table):
            if st_info & 0xF == STT_FUNC and st_other & STO_CUDA_ENTRY:
                yield names.name(st_name)


@contextmanager
def open_file(path: Path) -> Iterator[FileSource]:
    """A FileSource on `path`, closed on exit; an unreadable path is a FatbinError naming it."""
    try:
        # O_NONBLOCK so a FIFO or device cannot stall us before the regular-file check below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise FatbinError(f"{path}: cannot open: {error.strerror or error}") from error
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FatbinError(f"{path}: not a regular file")
        yield FileSource(fd, str(path))
    finally:
        os.close(fd)
