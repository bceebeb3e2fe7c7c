"""List the device code in a CUDA binary by reading fatbin headers, never the code itself.

Layout (docs/facts.md section 3): the ELF section `.nv_fatbin` (else `__nv_relfatbin`, as cuobjdump
chooses) holds containers back to back; each container holds entries, each a variable-size header
followed by its payload (a cubin, PTX text or LTO-IR, possibly LZ4/ZSTD-compressed). Listing archs
reads ~100 bytes per entry with os.pread, so a 1 GB .so costs a few hundred small reads.

Choices, so the reader agrees with `cuobjdump --list-elf/--list-ptx`:
- The target and its `a`/`f` suffix come from the entry header (arch number, flags 0x100000/0x200000).
  We do not open cubins to read e_flags: the header bits matched cuobjdump's cubin-derived names on
  every cubin checked (the fixtures, nvcc 13.0; sgl-kernel 0.1.0 and 0.3.21 and sglang-kernel 0.4.10,
  ABI v7 and v8 cubins), and CUDA 13's e_flags do not even tell sm_90 from sm_90a (that lives in
  `.nv.compat`, at the end of the cubin), so checking would mean decompressing whole cubins.
- Names: sass `sm_120a`, PTX `compute_120` (nvcc's spelling; cuobjdump's listing says `sm_120.ptx`),
  LTO-IR `lto_90` (nvcc's `code=lto_90`). Unlike cuobjdump's --list-elf we keep the `f` on cubins.
- Entry kinds other than PTX (1), cubin (2) and LTO-IR (8) are skipped: nothing can be said about
  whether they run, and cuobjdump does not list them either.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, NamedTuple

from bwstack.errors import FatbinError
from bwstack.verify import cubin_symbols, elf

FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")  # cuobjdump's default preference
CONTAINER_MAGIC = 0xBA55ED50

_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
# Entry header: the first 64 bytes hold every field we use; the header itself may be longer.
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")
_KINDS: dict[int, Literal["ptx", "sass", "lto"]] = {1: "ptx", 2: "sass", 8: "lto"}
_PREFIX = {"sass": "sm", "ptx": "compute", "lto": "lto"}

FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000  # 'a'
FLAG_FAMILY = 0x200000  # 'f'

# Decompression (kernel listing only) is capped so a tiny hostile payload cannot expand without bound:
# cubins and PTX compress 3-20x in practice; the floor keeps tiny, highly repetitive entries legal.
_MAX_RATIO = 256
_MIN_CAP = 16 << 20
_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%]*)")

Kind = Literal["sass", "ptx", "lto"]
Codec = Literal["none", "lz4", "zstd"]


@dataclass(frozen=True)
class FatbinEntry:
    """One piece of device code in a fatbin, as its header describes it.

    Sizes: `payload_size` is the bytes after the header (padding included); `compressed_size` the
    bytes the codec reads; `uncompressed_size` the bytes it yields. For codec "none" both equal the
    payload size, which may include a few bytes of alignment padding.
    `isa_version` is the header's version pair: the PTX ISA for PTX ("9.0"), the cubin ELF ABI
    version for cubins (nvcc 13 writes "1.8").
    """

    kind: Kind
    number: int
    suffix: Literal["", "a", "f"]
    codec: Codec
    payload_size: int
    compressed_size: int
    uncompressed_size: int
    offset: int
    isa_version: str
    kernels: tuple[str, ...] = ()  # filled only by read_entries(..., kernels=True)
    # Which container (one per translation unit linked in) holds the entry: the driver loads a fatbin
    # container by container, so a kernel runs only if its own container has code for the GPU.
    container: int = 0
    # The container holds no kernels at all (a device-link stub, or a translation unit with only
    # __device__ data): nothing in it is ever launched, so coverage does not count it.
    kernel_free: bool = False

    @property
    def arch(self) -> str:
        """`sm_120a` (sass), `compute_120` (ptx), `lto_90` (LTO-IR)."""
        return f"{_PREFIX[self.kind]}_{self.number}{self.suffix}"

    @property
    def cc(self) -> tuple[int, int]:
        return divmod(self.number, 10)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "arch": self.arch,
            "codec": self.codec,
            "payload_size": self.payload_size,
            "compressed_size": self.compressed_size,
            "uncompressed_size": self.uncompressed_size,
            "offset": self.offset,
            "isa_version": self.isa_version,
            "kernels": list(self.kernels),
            "container": self.container,
            "kernel_free": self.kernel_free,
        }


def is_cuda_binary(path: Path) -> bool:
    """True for an ELF64 file with a fatbin section; False for anything that is not ELF64.

    Cheap: reads the ELF header, the section table and section names. An ELF file whose section
    table is malformed raises FatbinError rather than answering False, so a damaged CUDA library
    becomes a reported error instead of silently looking like "not CUDA".
    """
    with elf.open_file(Path(path)) as source:
        if not elf.is_elf64(source):
            return False
        return elf.find_section(elf.read_sections(source), *FATBIN_SECTIONS) is not None


def read_entries(path: Path, *, kernels: bool = False) -> list[FatbinEntry]:
    """Every PTX, cubin and LTO-IR entry in the file's fatbin, in file order; [] without a fatbin.

    With kernels=True each entry also carries its kernel names (cubins: decompressed and their
    .symtab read; PTX: its `.entry` directives; LTO-IR: none). Anything malformed raises FatbinError.
    """
    with elf.open_file(Path(path)) as source:
        return read_source_entries(source, kernels=kernels)


def read_source_entries(source: elf.Source, *, kernels: bool = False) -> list[FatbinEntry]:
    """read_entries for any elf.Source (a file, or bytes in memory such as a wheel member)."""
    section = elf.find_section(elf.read_sections(source), *FATBIN_SECTIONS)
    if section is None:
        return []
    elf.check_range(source, section.offset, section.size, f"section {section.name}")
    entries = list(walk(source, section.offset, section.offset + section.size))
    if kernels:
        entries = with_kernels_all(source, entries)
    return mark_kernel_free(source, entries, kernels_read=kernels)


_DECODERS = 2  # compressed cubins decoded at once: the codecs release the GIL; memory stays ~2 x PREFIX


def with_kernels_all(source: elf.Source, entries: list[FatbinEntry]) -> list[FatbinEntry]:
    """with_kernels for every entry; compressed cubins in a small thread pool, in file order."""
    packed = [i for i, e in enumerate(entries) if e.codec != "none"]
    if len(packed) < 2:
        return [with_kernels(source, e) for e in entries]
    # Compressed cubins decode in the pool while this thread reads the stored ones (Python, GIL-bound).
    with ThreadPoolExecutor(_DECODERS) as pool:
        pending = pool.map(lambda i: with_kernels(source, entries[i]), packed)
        done = [with_kernels(source, e) if e.codec == "none" else e for e in entries]
        for index, entry in zip(packed, pending, strict=True):
            done[index] = entry
    return done


FIRST_CUBIN = 64 << 10  # stream_capture.py keeps a container's first cubin whole up to this size


def mark_kernel_free(source: elf.Source, entries: list[FatbinEntry], *, kernels_read: bool) -> list[FatbinEntry]:
    """Flag the entries of containers that hold no kernels (one cubin per container tells: one source file).

    A container's first cubin is read for its symbols when kernel names were not read already; a first
    cubin bigger than FIRST_CUBIN is taken to hold kernels (stubs are a few KB).
    """
    free: set[int] = set()
    groups: dict[int, list[FatbinEntry]] = {}
    for entry in entries:
        groups.setdefault(entry.container, []).append(entry)
    for container, group in groups.items():
        cubin = next((e for e in group if e.kind == "sass"), None)
        if cubin is None or any(e.kind != "sass" for e in group):
            continue
        if kernels_read:
            empty = not any(e.kernels for e in group)
        elif cubin.payload_size <= FIRST_CUBIN:  # the same test stream_capture.py keeps it by
            empty = not with_kernels(source, cubin).kernels
        else:
            empty = False
        if empty:
            free.add(container)
    return [replace(e, kernel_free=True) if e.container in free else e for e in entries]


def walk(source: elf.Source, start: int, end: int) -> list[FatbinEntry]:
    entries: list[FatbinEntry] = []
    for index, (_pos, body, body_end) in enumerate(_containers(source, start, end)):
        entries.extend(replace(e, container=index) for e in _entries(source, body, body_end))
    return entries


def _containers(source: elf.Source, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """Each container of a fatbin section as (start, body start, body end), checked, back to back."""
    pos = start
    while pos < end:
        if end - pos < _CONTAINER.size or source.read(pos, 4) == b"\0\0\0\0":
            _expect_padding(source, pos, end)
            return
        magic, _version, header_size, size = _CONTAINER.unpack(source.read(pos, _CONTAINER.size))
        if magic != CONTAINER_MAGIC:
            raise FatbinError(f"{source.label}: bad fatbin magic {magic:#x} at offset {pos}")
        if header_size < _CONTAINER.size:
            raise FatbinError(f"{source.label}: fatbin container header size {header_size} at offset {pos}")
        body, body_end = pos + header_size, pos + header_size + size
        if body_end > end:
            raise FatbinError(
                f"{source.label}: fatbin container at offset {pos} claims {size} bytes, past its section's end"
            )
        yield pos, body, body_end
        pos = body_end  # header_size >= 16, so every step moves forward


def read_containers(path: Path) -> list[tuple[int, bytes]]:
    """Every container of the file's fatbin, header included, as (file offset, bytes): what the CUDA
    driver's cuModuleLoadData takes. Reads the containers' bytes (device code), unlike read_entries."""
    with elf.open_file(Path(path)) as source:
        section = elf.find_section(elf.read_sections(source), *FATBIN_SECTIONS)
        if section is None:
            return []
        elf.check_range(source, section.offset, section.size, f"section {section.name}")
        spans = list(_containers(source, section.offset, section.offset + section.size))
        return [(pos, source.read(pos, end - pos)) for pos, _body, end in spans]


def _expect_padding(source: elf.Source, pos: int, end: int) -> None:
    """Trailing bytes after the last container must be zero alignment padding."""
    while pos < end:
        chunk = source.read(pos, min(end - pos, 1 << 16))
        if chunk.strip(b"\0"):
            raise FatbinError(f"{source.label}: unexpected bytes between fatbin containers near offset {pos}")
        pos += len(chunk)


class _Header(NamedTuple):
    """The first 64 bytes of an entry header (docs/facts.md section 3), unused fields included."""

    kind: int
    pad: int
    header_size: int
    payload_size: int
    compressed_size: int
    pad2: int
    minor: int
    major: int
    number: int
    ident_offset: int
    ident_size: int
    flags: int
    reserved: int
    uncompressed_size: int


def _entries(source: elf.Source, pos: int, end: int) -> list[FatbinEntry]:
    found: list[FatbinEntry] = []
    while pos < end:
        if end - pos < _ENTRY.size:
            raise FatbinError(f"{source.label}: fatbin entry header at offset {pos} is cut off by its container")
        header = _Header._make(_ENTRY.unpack(source.read(pos, _ENTRY.size)))
        if header.header_size < _ENTRY.size:  # also what guarantees progress
            raise FatbinError(f"{source.label}: fatbin entry header size {header.header_size} at offset {pos}")
        if pos + header.header_size + header.payload_size > end:
            raise FatbinError(
                f"{source.label}: fatbin entry at offset {pos} claims {header.payload_size} bytes, "
                "past its container's end"
            )
        if header.kind in _KINDS:
            found.append(_entry(source.label, pos, header))
        pos += header.header_size + header.payload_size
    return found


def _entry(label: str, pos: int, header: _Header) -> FatbinEntry:
    flags, payload = header.flags, header.payload_size
    where = f"{label}: fatbin entry at offset {pos}"
    if flags & FLAG_LZ4 and flags & FLAG_ZSTD:
        raise FatbinError(f"{where} claims both LZ4 and ZSTD compression")
    if flags & FLAG_ARCH_SPECIFIC and flags & FLAG_FAMILY:
        raise FatbinError(f"{where} is marked both arch- and family-specific")
    codec: Codec = "lz4" if flags & FLAG_LZ4 else "zstd" if flags & FLAG_ZSTD else "none"
    csize, usize = header.compressed_size, header.uncompressed_size
    if codec == "none":
        csize = usize = payload
    elif not 0 < csize <= payload:
        raise FatbinError(f"{where}: compressed size {csize} does not fit its {payload}-byte payload")
    if not 10 <= header.number <= 999:
        raise FatbinError(f"{where} names arch number {header.number}")
    suffix: Literal["", "a", "f"] = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
    return FatbinEntry(
        _KINDS[header.kind], header.number, suffix, codec, payload, csize, usize, pos, f"{header.major}.{header.minor}"
    )


def with_kernels(source: elf.Source, entry: FatbinEntry) -> FatbinEntry:
    if entry.kind == "lto":
        return entry
    label = f"{source.label} [{entry.arch} at offset {entry.offset}]"
    if entry.kind == "sass" and entry.codec == "none":
        # A stored cubin is read in place: only its section table, symbol table and names, never its code.
        header_size = _ENTRY.unpack(source.read(entry.offset, _ENTRY.size))[2]
        view = elf.SliceSource(source, entry.offset + header_size, entry.compressed_size, label)
        return replace(entry, kernels=tuple(elf.kernel_symbols(view)))
    if entry.kind == "sass" and entry.codec == "zstd":
        _check_ratio(entry, label)
        header_size = _ENTRY.unpack(source.read(entry.offset, _ENTRY.size))[2]
        found = cubin_symbols.zstd_kernels(
            source, entry.offset + header_size, entry.compressed_size, entry.uncompressed_size, label
        )
        if found is not None:
            return replace(entry, kernels=found)
    data = decompress(source, entry)
    if entry.kind == "ptx":
        names = tuple(m.group(1).decode("ascii", "replace") for m in _PTX_ENTRY.finditer(data))
    else:
        names = tuple(elf.kernel_symbols(elf.BytesSource(data, label)))
    return replace(entry, kernels=names)


def decompress(source: elf.Source, entry: FatbinEntry) -> bytes:
    """The entry's payload, decompressed. Output is capped by the header's size and a ratio limit."""
    header_size = _ENTRY.unpack(source.read(entry.offset, _ENTRY.size))[2]
    raw = source.read(entry.offset + header_size, entry.compressed_size)
    label = f"{source.label} [{entry.arch} at offset {entry.offset}]"
    if entry.codec == "none":
        return raw
    cap = _check_ratio(entry, label)
    data = _lz4(raw, cap, label) if entry.codec == "lz4" else _zstd(raw, cap, label)
    if len(data) != entry.uncompressed_size:
        raise FatbinError(f"{label}: decompressed to {len(data)} bytes, header says {entry.uncompressed_size}")
    return data


def _lz4(raw: bytes, cap: int, label: str) -> bytes:
    """One raw LZ4 block (no frame). `raw` must be exactly the compressed bytes: the C decoder rejects
    trailing padding; `uncompressed_size` is its output buffer, so a block that decodes past `cap` fails."""
    import lz4.block  # a C codec, imported here like zstandard

    try:
        return lz4.block.decompress(raw, uncompressed_size=cap)
    except lz4.block.LZ4BlockError as error:
        raise FatbinError(f"{label}: LZ4 payload is corrupt or decodes to more than {cap} bytes ({error})") from None


def _check_ratio(entry: FatbinEntry, label: str) -> int:
    cap = min(entry.uncompressed_size, max(_MIN_CAP, _MAX_RATIO * entry.compressed_size))
    if entry.uncompressed_size > cap:
        raise FatbinError(f"{label}: claims {entry.uncompressed_size} bytes from {entry.compressed_size} compressed")
    return cap


def _zstd(raw: bytes, cap: int, label: str) -> bytes:
    import zstandard  # a C codec; imported here so header-only listing never needs it

    # One call into C with a hard output limit: no Python loop over chunks, no growing buffer to copy.
    try:
        return zstandard.ZstdDecompressor().decompress(raw, max_output_size=cap)
    except zstandard.ZstdError as error:
        raise FatbinError(f"{label}: ZSTD payload is corrupt or decodes to more than {cap} bytes: {error}") from error
