"""The fatbin reader against NVIDIA's cuobjdump, on every committed fixture.

cuobjdump (PyPI nvidia-cuda-cuobjdump, a dev dependency) is the oracle and must be installed: a
missing oracle fails these tests rather than skipping them. Three of its views are compared:
--list-elf (names from inside each cubin: never an `f`), --list-ptx (names from the headers) and
-symbols (each entry's header arch, `a`/`f` included, and each cubin's kernels). manifest.json adds
what nvcc was asked to build: codecs per --compress-mode, `f` targets, LTO-IR and kernel names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from dataclasses import replace
from pathlib import Path

import lz4.block
import pytest

from bwstack.errors import FatbinError
from bwstack.verify import elf, fatbin
from bwstack.verify.fatbin import FatbinEntry, is_cuda_binary, read_entries
from tests.paths import FIXTURES

MANIFEST = json.loads((FIXTURES / "cuda" / "manifest.json").read_text())
ROWS = {row["path"]: row for row in MANIFEST["fixtures"]}
CUDA_ROWS = [row for row in MANIFEST["fixtures"] if row["listed"]]


def find_cuobjdump() -> Path | None:
    """cuobjdump from the installed nvidia-cuda-cuobjdump wheel (nvidia/cu13/bin), wherever the venv is."""
    try:
        import nvidia
    except ImportError:
        return None
    for root in nvidia.__path__:
        for candidate in sorted(Path(root).glob("cu*/bin/cuobjdump")):
            if os.access(candidate, os.X_OK):
                return candidate
    return None


@pytest.fixture(scope="session")
def cuobjdump() -> Path:
    tool = find_cuobjdump()
    if tool is None:
        pytest.fail("cuobjdump is missing: pip install nvidia-cuda-cuobjdump (a dev dependency; it is the oracle)")
    return tool


def run_cuobjdump(tool: Path, *args: str) -> str:
    done = subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=60)
    return done.stdout


def symbol_blocks(text: str) -> list[tuple[str, str, list[str]]]:
    """`cuobjdump -symbols` as (kind, header arch, kernels) per entry: kind is elf, ptx or nvvm."""
    blocks: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        if match := re.match(r"Fatbin (\w+) code:", line):
            blocks.append((match.group(1), "", []))
        elif (match := re.match(r"arch = (\S+)", line)) and blocks:
            kind, _, kernels = blocks[-1]
            blocks[-1] = (kind, match.group(1), kernels)
        elif line.startswith("FUNC") and " ENTRY " in line and blocks:
            blocks[-1][2].append(line.split()[-1])
    return blocks


def cuobjdump_view(entry: FatbinEntry) -> tuple[str, str]:
    """How -symbols names our entry: (block kind, arch) with cuobjdump's sm_ prefix for every kind."""
    kind = {"sass": "elf", "ptx": "ptx", "lto": "nvvm"}[entry.kind]
    return kind, f"sm_{entry.number}{entry.suffix}"


@pytest.mark.parametrize("row", CUDA_ROWS, ids=lambda row: row["path"])
def test_reader_matches_cuobjdump(cuobjdump: Path, row: dict) -> None:
    path = FIXTURES / row["path"]
    entries = read_entries(path, kernels=True)
    assert is_cuda_binary(path)

    listed_elf = re.findall(r"\.(sm_\w+?)\.cubin", run_cuobjdump(cuobjdump, "--list-elf", str(path)))
    assert [e.arch.removesuffix("f") for e in entries if e.kind == "sass"] == listed_elf
    listed_ptx = re.findall(r"\.(sm_\w+?)\.ptx", run_cuobjdump(cuobjdump, "--list-ptx", str(path)))
    assert [e.arch.replace("compute_", "sm_") for e in entries if e.kind == "ptx"] == listed_ptx

    blocks = symbol_blocks(run_cuobjdump(cuobjdump, "-symbols", str(path)))
    assert Counter(cuobjdump_view(e) for e in entries) == Counter((kind, arch) for kind, arch, _ in blocks)
    theirs = [kernels for kind, _, kernels in blocks if kind == "elf"]
    assert [sorted(e.kernels) for e in entries if e.kind == "sass"] == [sorted(k) for k in theirs]


@pytest.mark.parametrize("row", CUDA_ROWS, ids=lambda row: row["path"])
def test_reader_matches_what_nvcc_was_asked_for(row: dict) -> None:
    entries = read_entries(FIXTURES / row["path"], kernels=True)
    assert {e.arch for e in entries} == set(row["listed"])  # `f` on cubins: cuobjdump cannot tell us
    for entry in entries:
        assert entry.codec == row["codecs"][entry.kind], entry
        if entry.kind == "ptx":
            assert set(entry.kernels) == set(row["kernels"])
    assert set().union(*(e.kernels for e in entries)) == set(row["kernels"])


def test_manifest_covers_every_fixture_binary() -> None:
    on_disk = {
        str(p.relative_to(FIXTURES))
        for pattern in ("cuda/bin/*", "packages/**/*.so")
        for p in FIXTURES.glob(pattern)
        if p.is_file()
    }
    assert on_disk == set(ROWS)
    assert sum((FIXTURES / p).stat().st_size for p in on_disk) < 3_000_000


def test_fixture_spread_covers_the_required_cases() -> None:
    archs = {e.arch for row in CUDA_ROWS for e in read_entries(FIXTURES / row["path"])}
    for needed in ("sm_80", "sm_90a", "sm_100f", "sm_103a", "sm_110", "sm_120a", "sm_121a", "compute_120", "lto_90"):
        assert needed in archs
    codecs = {e.codec for row in CUDA_ROWS for e in read_entries(FIXTURES / row["path"]) if e.kind == "sass"}
    assert codecs == {"none", "lz4", "zstd"}


def test_no_fatbin_section_is_an_empty_list_not_an_error() -> None:
    path = FIXTURES / "cuda/bin/host_only.so"
    assert read_entries(path) == []
    assert not is_cuda_binary(path)


def test_rdc_reads_the_linked_fatbin_like_cuobjdump() -> None:
    path = FIXTURES / "cuda/bin/rdc.so"
    with elf.open_file(path) as source:
        names = {s.name for s in elf.read_sections(source)}
    assert {".nv_fatbin", "__nv_relfatbin"} <= names
    assert [e.arch for e in read_entries(path)] == ["sm_90"]


def test_entry_names_sizes_and_dict() -> None:
    entries = read_entries(FIXTURES / "cuda/bin/family.so")
    assert [e.arch for e in entries] == ["sm_100f", "sm_120f", "sm_100f", "compute_120f", "sm_120f"]
    ptx = next(e for e in entries if e.kind == "ptx")
    assert (ptx.number, ptx.suffix, ptx.cc, ptx.codec, ptx.isa_version) == (120, "f", (12, 0), "zstd", "9.0")
    assert ptx.compressed_size <= ptx.payload_size < ptx.uncompressed_size
    assert entries[0].isa_version == "1.8"  # the cubin ELF ABI version nvcc 13 writes
    assert set(ptx.to_dict()) >= {"kind", "arch", "codec", "payload_size", "compressed_size", "uncompressed_size"}
    assert ptx.to_dict()["arch"] == "compute_120f"
    assert ptx.kernels == () and ptx.to_dict()["kernels"] == []
    lto = [e for e in read_entries(FIXTURES / "cuda/bin/lto.o") if e.kind == "lto"]
    assert [e.arch for e in lto] == ["lto_90"]


def test_uncompressed_sizes_are_the_payload() -> None:
    for entry in read_entries(FIXTURES / "cuda/bin/compress_none.so"):
        assert entry.compressed_size == entry.uncompressed_size == entry.payload_size


def test_listing_reads_headers_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few hundred bytes per entry, never the payloads: that is what makes a 1 GB .so take 0.1 s.

    Besides headers, each container's first cubin has its symbol table read (does the container hold
    kernels at all?): a fixed cost per container, so on this small file it is most of the bytes read."""
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        reads.append(length)
        return real_pread(fd, length, offset)

    path = FIXTURES / "cuda/bin/multi.so"
    with elf.open_file(path) as source:
        section_table = 64 * len(elf.read_sections(source))
    monkeypatch.setattr(elf.os, "pread", counting_pread)
    entries = read_entries(path)
    payload = sum(e.payload_size for e in entries)
    assert max(reads) <= section_table  # the largest single read
    assert sum(reads) < payload / 4


def test_kernels_from_lz4_and_zstd_cubins_agree_with_uncompressed() -> None:
    def kernels(name: str) -> list[tuple[str, tuple[str, ...]]]:
        return [(e.arch, tuple(sorted(e.kernels))) for e in read_entries(FIXTURES / name, kernels=True)]

    plain = kernels("cuda/bin/compress_none.so")
    assert kernels("cuda/bin/compress_speed.so") == plain
    assert kernels("cuda/bin/compress_size.so") == plain


def test_decompress_returns_a_real_cubin() -> None:
    path = FIXTURES / "cuda/bin/compress_speed.so"
    with elf.open_file(path) as source:
        for entry in fatbin.read_source_entries(source):
            data = fatbin.decompress(source, entry)
            assert len(data) == entry.uncompressed_size
            if entry.kind == "sass":
                header = elf.read_header(elf.BytesSource(data, "cubin"))
                assert header.machine == 190  # EM_CUDA


def test_bytes_source_reads_like_a_file() -> None:
    path = FIXTURES / "cuda/bin/multi.so"
    in_memory = fatbin.read_source_entries(elf.BytesSource(path.read_bytes(), str(path)), kernels=True)
    assert in_memory == read_entries(path, kernels=True)
    assert any(e.kernels for e in in_memory)
    assert [replace(e, kernels=()) for e in in_memory] == read_entries(path)


def test_errors_are_one_line_and_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "not-elf.so"
    bad.write_text("INPUT(-lfoo)\n")  # a linker script named .so, as some distros ship
    assert not is_cuda_binary(bad)
    with pytest.raises(FatbinError) as caught:
        read_entries(bad)
    assert str(bad) in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(FatbinError, match="cannot open"):
        read_entries(tmp_path / "missing.so")


# LZ4 blocks are decoded by python-lz4's C decoder; blocks come from its encoder (store_size=False: a raw
# block, as nvcc stores it), except the malformed ones, written by hand: token (literal length << 4 |
# match length - 4), literals, a 2-byte little-endian offset, ...
@pytest.mark.parametrize(
    "data",
    [b"hello", b"ab" * 500 + b"!", bytes(range(256)) * 2 + b"x" * 300, b""],
    ids=["literals", "overlapping-match", "extended-lengths", "empty"],
)
def test_lz4_blocks_decode_to_what_was_encoded(data: bytes) -> None:
    block = lz4.block.compress(data, store_size=False)
    assert fatbin._lz4(block, max(1, len(data)), "cubin") == data


def test_lz4_output_is_capped() -> None:
    block = lz4.block.compress(b"ab" * 500, store_size=False)
    with pytest.raises(FatbinError, match=r"^cubin: LZ4 payload is corrupt or decodes to more than 999 bytes"):
        fatbin._lz4(block, 999, "cubin")


@pytest.mark.parametrize(
    "block",
    [
        b"\x50hel",  # a literal run passing the end
        b"\x24ab\x09\x00",  # a match before the start of the output
        b"\xf0\xff",  # a length field cut off
        b"\x24ab\x02",  # an offset cut off
        lz4.block.compress(b"ab" * 500, store_size=False) + b"\0" * 5,  # padding, as the fatbin aligns payloads
    ],
    ids=["literals-past-end", "offset-before-start", "length-cut-off", "offset-cut-off", "padded"],
)
def test_lz4_rejects_malformed_blocks(block: bytes) -> None:
    with pytest.raises(FatbinError, match="LZ4 payload is corrupt") as caught:
        fatbin._lz4(block, 10_000, "cubin")
    assert "\n" not in str(caught.value)


def test_zstd_cubin_tables_past_the_kept_prefix_fall_back_to_a_full_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The streamed shortcut keeps a prefix; when the symbol tables lie past it, the answer is unchanged."""
    from bwstack.verify import cubin_symbols

    path = FIXTURES / "cuda/bin/compress_size.so"  # ZSTD cubins
    streamed = [e.kernels for e in read_entries(path, kernels=True)]
    calls: list[object] = []
    real = cubin_symbols.zstd_kernels

    def spy(*args: object) -> object:
        calls.append(found := real(*args))
        return found

    monkeypatch.setattr(cubin_symbols, "PREFIX", 128)
    monkeypatch.setattr(cubin_symbols, "zstd_kernels", spy)
    assert [e.kernels for e in read_entries(path, kernels=True)] == streamed
    assert calls and all(found is None for found in calls)  # every cubin took the fallback
    assert set().union(*streamed) == set(ROWS["cuda/bin/compress_size.so"]["kernels"])
