"""Hostile input: every broken file is a FatbinError naming it, never a crash, hang or huge allocation.

Mutations start from the real nvcc-built fixtures and aim at the fields the reader trusts (ELF
section table, fatbin container and entry headers), with values chosen to hurt: 0, 1, the header
sizes +-1, 2**31, 2**32-1, 2**63, 2**64-1. Each example runs under a hypothesis deadline and
tracemalloc, with and without kernel listing (which decompresses).
"""

from __future__ import annotations

import os
import struct
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bwstack.errors import FatbinError
from bwstack.verify import elf
from bwstack.verify.fatbin import FATBIN_SECTIONS, is_cuda_binary, read_entries
from tests.paths import FIXTURES

VICTIMS = [
    "cuda/bin/multi.so",  # two containers, 64- and 96/112-byte entry headers, ZSTD PTX
    "cuda/bin/compress_size.so",  # ZSTD cubins
    "cuda/bin/compress_speed.so",  # LZ4 cubins
    "cuda/bin/lto.o",  # relocatable object, __nv_relfatbin, LTO-IR
    "packages/ptx-fallback/sgl_kernel/sm100/common_ops.abi3.so",
]
MAX_PEAK = 40 << 20  # the decompression floor is 16 MiB; anything near this means a size field was trusted
NASTY = [0, 1, 15, 16, 17, 63, 64, 65, 0x7F, 0xFF, 0xFFFF, 2**31, 2**32 - 1, 2**63, 2**64 - 1]


def structural_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of every header field the reader uses in a valid fixture."""
    fields = [(0x04, 1), (0x05, 1), (0x28, 8), (0x3A, 2), (0x3C, 2), (0x3E, 2)]
    source = elf.BytesSource(data, "fixture")
    header = elf.read_header(source)
    sections = elf.read_sections(source, header)
    fatbin = elf.find_section(sections, *FATBIN_SECTIONS)
    assert fatbin is not None
    for index in (fatbin.index, header.shstrndx):
        base = header.shoff + index * 64
        fields += [(base, 4), (base + 4, 4), (base + 0x18, 8), (base + 0x20, 8)]
    pos, end = fatbin.offset, fatbin.offset + fatbin.size
    while pos + 16 <= end:
        magic, _, header_size, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:
            break
        fields += [(pos, 4), (pos + 4, 2), (pos + 6, 2), (pos + 8, 8)]
        entry, body_end = pos + header_size, pos + header_size + size
        while entry < body_end:
            entry_header, payload = struct.unpack_from("<IQ", data, entry + 4)
            fields += [(entry + off, width) for off, width in ((0, 2), (4, 4), (8, 8), (0x10, 4), (0x1C, 4))]
            fields += [(entry + 0x28, 8), (entry + 0x38, 8), (entry + entry_header, 8)]
            entry += entry_header + payload
        pos = body_end
    return fields


ORIGINALS = {name: (FIXTURES / name).read_bytes() for name in VICTIMS}
FIELDS = {name: structural_fields(data) for name, data in ORIGINALS.items()}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile") / "victim.so"


def assert_handled(path: Path) -> None:
    """Entries or a one-line FatbinError naming the file; bounded memory; is_cuda_binary answers or raises."""
    tracemalloc.start()
    try:
        for kernels in (False, True):
            try:
                entries = read_entries(path, kernels=kernels)
            except FatbinError as error:
                assert str(path) in str(error) and "\n" not in str(error)
            else:
                size = path.stat().st_size
                assert all(e.offset + e.payload_size <= size for e in entries)
        try:
            assert isinstance(is_cuda_binary(path), bool)
        except FatbinError as error:
            assert str(path) in str(error)
        assert tracemalloc.get_traced_memory()[1] < MAX_PEAK
    finally:
        tracemalloc.stop()


def patch(data: bytes, offset: int, width: int, value: int) -> bytes:
    if offset + width > len(data):
        return data
    return data[:offset] + (value % (1 << (8 * width))).to_bytes(width, "little") + data[offset + width :]


HOSTILE = settings(
    deadline=timedelta(seconds=2),
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,  # the same examples on every run: CI failures reproduce
)


@HOSTILE
@given(
    name=st.sampled_from(VICTIMS),
    pick=st.integers(min_value=0),
    value=st.one_of(st.sampled_from(NASTY), st.integers(min_value=0, max_value=2**64 - 1)),
)
def test_mutated_header_fields(scratch: Path, name: str, pick: int, value: int) -> None:
    offset, width = FIELDS[name][pick % len(FIELDS[name])]
    scratch.write_bytes(patch(ORIGINALS[name], offset, width, value))
    assert_handled(scratch)


@HOSTILE
@given(
    name=st.sampled_from(VICTIMS),
    flips=st.lists(st.tuples(st.floats(min_value=0, max_value=1, exclude_max=True), st.integers(0, 255)), max_size=8),
)
def test_mutated_bytes_anywhere(scratch: Path, name: str, flips: list[tuple[float, int]]) -> None:
    data = bytearray(ORIGINALS[name])
    for where, byte in flips:
        data[int(where * len(data))] = byte
    scratch.write_bytes(bytes(data))
    assert_handled(scratch)


@HOSTILE
@given(blob=st.binary(max_size=4096), elf_prefix=st.booleans())
def test_random_bytes(scratch: Path, blob: bytes, elf_prefix: bool) -> None:
    data = ORIGINALS[VICTIMS[0]][:64] + blob if elf_prefix else blob
    scratch.write_bytes(data)
    if not elf_prefix and not data.startswith(b"\x7fELF"):
        assert not is_cuda_binary(scratch)
        with pytest.raises(FatbinError):
            read_entries(scratch)
    assert_handled(scratch)


@pytest.mark.parametrize("name", VICTIMS)
def test_truncated_at_many_offsets(scratch: Path, name: str) -> None:
    """The section table sits at the end of these files, so every cut must be an error, not a short list."""
    data = ORIGINALS[name]
    cuts = set(range(0, len(data), 211)) | {1, 4, 5, 6, 16, 63, 64, 65, len(data) - 1}
    cuts |= {offset + d for offset, _ in FIELDS[name] for d in (0, 1) if offset + d < len(data)}
    for cut in sorted(cuts):
        scratch.write_bytes(data[:cut])
        with pytest.raises(FatbinError):
            read_entries(scratch)
        assert_handled(scratch)


def test_zero_length(scratch: Path) -> None:
    scratch.write_bytes(b"")
    assert not is_cuda_binary(scratch)
    with pytest.raises(FatbinError, match="empty"):
        read_entries(scratch)


def test_not_elf(scratch: Path) -> None:
    scratch.write_bytes(b"MZ" + bytes(200))
    assert not is_cuda_binary(scratch)
    with pytest.raises(FatbinError, match="not an ELF"):
        read_entries(scratch)


def test_32_bit_elf(scratch: Path) -> None:
    scratch.write_bytes(patch(ORIGINALS[VICTIMS[0]], 4, 1, 1))
    assert not is_cuda_binary(scratch)
    with pytest.raises(FatbinError, match="64-bit"):
        read_entries(scratch)


def first_entry(name: str) -> int:
    """Offset of the first fatbin entry header: the section start plus the container's header size."""
    data = ORIGINALS[name]
    source = elf.BytesSource(data, name)
    section = elf.find_section(elf.read_sections(source), *FATBIN_SECTIONS)
    assert section is not None
    return section.offset + struct.unpack_from("<H", data, section.offset + 6)[0]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (4, 0, "entry header size 0"),  # would loop forever if trusted
        (4, 63, "entry header size 63"),
        (8, 2**64 - 1, "past its container's end"),
        (0x10, 2**32 - 1, "compressed size"),
        (0x38, 2**62, "claims"),  # a huge uncompressed size: refused before any allocation
    ],
)
def test_hostile_entry_fields(scratch: Path, field: int, value: int, message: str) -> None:
    name = "cuda/bin/compress_size.so"
    width = {4: 4, 8: 8, 0x10: 4, 0x38: 8}[field]
    scratch.write_bytes(patch(ORIGINALS[name], first_entry(name) + field, width, value))
    with pytest.raises(FatbinError, match=message):
        read_entries(scratch, kernels=True)
    assert_handled(scratch)


def test_hostile_section_and_container_fields(scratch: Path) -> None:
    name = VICTIMS[0]
    data = ORIGINALS[name]
    container = first_entry(name) - 16
    for offset, width, value, message in [
        (container, 4, 0x12345678, "bad fatbin magic"),
        (container + 6, 2, 0, "container header size 0"),
        (container + 8, 8, 2**63, "past its section's end"),
        (0x28, 8, 2**63, "section header table"),
        (0x3C, 2, 0xFFFF, "section header table"),
        (0x3E, 2, 0xFFFE, "out of range"),
    ]:
        scratch.write_bytes(patch(data, offset, width, value))
        with pytest.raises(FatbinError, match=message):
            read_entries(scratch)


def test_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.so"
    os.mkfifo(fifo)
    for path in (tmp_path, fifo):
        with pytest.raises(FatbinError, match="not a regular file"):
            read_entries(path)
