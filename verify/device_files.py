"""Device code outside a host library: bare cubins, fatbin files, PTX text, and any ELF with a fatbin.

Packages ship device code in more shapes than `.so` files (flashinfer-cubin: thousands of `.cubin`
files loaded at run time with cuModuleLoad). Each shape is turned into the same `FatbinEntry` list, so
the one compatibility table judges them all:

- a CUDA ELF (`e_machine` 190) is one cubin. Its SASS arch is in `e_flags`, laid out per ELF ABI version
  (docs/verify.md): ABI 7 keeps it in bits 0-7 and marks `a` with 0x800; ABI 8 keeps it in bits 8-15 and
  CUDA 12.9 marks `a` with 0x8, while CUDA 13 marks nothing and `f` is never there. The exact target,
  suffix included, is in the `.note.nv.tkinfo` note, which holds ptxas's command line (`-arch sm_100f`):
  read that first, the flags only when it is absent.
- any other ELF: its `.nv_fatbin` section (an executable or object file as much as a `.so`);
- a `.fatbin` file: containers back to back from byte 0;
- PTX text: its `.target` directive names the arch; `.entry` directives name the kernels.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from bwstack.errors import FatbinError
from bwstack.verify import elf, fatbin
from bwstack.verify.fatbin import CONTAINER_MAGIC, FatbinEntry

EM_CUDA = 190
TKINFO = ".note.nv.tkinfo"
ABI7_ARCH_SPECIFIC = 0x800
ABI8_ARCH_SPECIFIC = 0x8  # set by CUDA 12.9, not by CUDA 13.0
DEVICE_SUFFIXES = (".cubin", ".fatbin", ".ptx")
_TK_ARCH = re.compile(rb"-arch[ =]+sm_(\d{2,3})([af]?)\b")
_PTX_TARGET = re.compile(rb"^\s*\.target\s+sm_(\d{2,3})([af]?)", re.MULTILINE)
_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%]*)")
_PTX_HEAD = 1 << 16  # `.target` sits in the first lines of a PTX file
_PTX_CHUNK = 4 << 20  # PTX text is scanned in pieces this big, cut at line ends: memory stays flat


def is_device_name(name: str) -> bool:
    """A name that holds device code by its suffix alone (any ELF is found by its magic instead)."""
    return PurePosixPath(name).suffix in DEVICE_SUFFIXES


def read_device_entries(source: elf.Source, *, kernels: bool = False) -> list[FatbinEntry]:
    """The device code of any file: cubin, ELF with a fatbin, fatbin file or PTX; [] for anything else."""
    head = source.read(0, min(source.size, 64))
    if head.startswith(elf.ELF_MAGIC):
        header = elf.read_header(source)
        if header.machine == EM_CUDA:
            return [_cubin_entry(source, header, kernels)]
        return fatbin.read_source_entries(source, kernels=kernels)
    if len(head) >= 4 and int.from_bytes(head[:4], "little") == CONTAINER_MAGIC:
        entries = fatbin.walk(source, 0, source.size)
        entries = fatbin.with_kernels_all(source, entries) if kernels else entries
        return fatbin.mark_kernel_free(source, entries, kernels_read=kernels)
    ptx = source.read(0, min(source.size, _PTX_HEAD))
    if b".version" in ptx and (target := _PTX_TARGET.search(ptx)):
        return [_ptx_entry(source, target, kernels)]
    return []


def read_device_file(path: Path, *, kernels: bool = False) -> list[FatbinEntry]:
    with elf.open_file(Path(path)) as source:
        return read_device_entries(source, kernels=kernels)


def cubin_target(source: elf.Source, header: elf.ElfHeader) -> tuple[int, str]:
    """(arch number, suffix) of a bare cubin: the tkinfo note's `-arch`, else the e_flags fields."""
    note = elf.find_section(elf.read_sections(source, header), TKINFO)
    if note is not None and note.size <= 1 << 16:
        elf.check_range(source, note.offset, note.size, TKINFO)
        if match := _TK_ARCH.search(source.read(note.offset, note.size)):
            return int(match.group(1)), match.group(2).decode()
    if header.abi_version >= 8:
        number, specific = (header.flags >> 8) & 0xFF, header.flags & ABI8_ARCH_SPECIFIC
    else:
        number, specific = header.flags & 0xFF, header.flags & ABI7_ARCH_SPECIFIC
    return number, "a" if specific else ""


def _cubin_entry(source: elf.Source, header: elf.ElfHeader, kernels: bool) -> FatbinEntry:
    number, suffix = cubin_target(source, header)
    if not 10 <= number <= 999:
        raise FatbinError(f"{source.label}: CUDA ELF names arch number {number}")
    names = tuple(elf.kernel_symbols(source)) if kernels else ()
    return FatbinEntry(
        "sass",
        number,
        suffix,
        "none",
        source.size,
        source.size,
        source.size,
        0,
        f"1.{header.abi_version}",
        names,  # type: ignore[arg-type]
    )


def _ptx_entry(source: elf.Source, target: re.Match[bytes], kernels: bool) -> FatbinEntry:
    names: tuple[str, ...] = ()
    if kernels:
        names = tuple(_ptx_entries(source))
    suffix = target.group(2).decode()
    return FatbinEntry("ptx", int(target.group(1)), suffix, "none", source.size, source.size, source.size, 0, "", names)  # type: ignore[arg-type]


def _ptx_entries(source: elf.Source) -> list[str]:
    """`.entry` names of a PTX text of any size, read in line-aligned chunks."""
    names: list[str] = []
    pos, carry = 0, b""
    while pos < source.size:
        chunk = carry + source.read(pos, min(_PTX_CHUNK, source.size - pos))
        pos += len(chunk) - len(carry)
        cut = chunk.rfind(b"\n") + 1 if pos < source.size else len(chunk)
        if cut == 0 and len(chunk) > _PTX_CHUNK:
            cut = len(chunk)  # a line longer than a chunk: no name is that long, cut anywhere
        names += (m.group(1).decode("ascii", "replace") for m in _PTX_ENTRY.finditer(chunk[:cut]))
        carry = chunk[cut:]
    return names
