"""A hostile wheel costs bounded memory, time and temp disk, and is refused by name, never by traceback."""

from __future__ import annotations

import io
import os
import struct
import tracemalloc
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from bwstack.errors import BwstackError, FatbinError, SourceError
from bwstack.verify import sources, wheel_limits
from bwstack.verify.fatbin import read_entries
from bwstack.verify.stream_capture import WindowMiss, capture
from bwstack.verify.wheel_limits import Limits, bounded_copy, check_space, parse_size
from tests.helpers import invoke
from tests.paths import FIXTURES, package

MULTI = FIXTURES / "cuda" / "bin" / "multi.so"
MAX_PEAK = 40 << 20  # `--path` reads the same files in ~36 MB RSS, most of it the interpreter


def padded(megabytes: int) -> bytes:
    """A real .so followed by `megabytes` of back-to-back, empty fatbin container headers."""
    header = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 0)
    return MULTI.read_bytes() + header * ((megabytes << 20) // len(header))


def wheel_of(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        archive.writestr("sgl_kernel/__init__.py", "")
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def peak_of(body) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = body()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_member_padded_with_container_headers_costs_bounded_memory(tmp_path: Path) -> None:
    data = padded(8)
    blob = tmp_path / "padded.so"
    blob.write_bytes(data)
    wheel = wheel_of(tmp_path / "padded.whl", {"sgl_kernel/lib.so": data})
    del data

    def through_wheel():
        with sources.open_wheel(wheel) as tree:
            return tree.read("sgl_kernel/lib.so")

    entries, peak = peak_of(through_wheel)
    assert entries == read_entries(blob) != []
    assert peak < MAX_PEAK, f"peak {peak >> 20} MiB"


def test_the_single_pass_gives_up_early_on_padding() -> None:
    data = padded(4)
    archive = zipfile.ZipFile(io.BytesIO(wheel_bytes({"lib.so": data})))

    def one_pass():
        with archive.open("lib.so") as member, pytest.raises(WindowMiss, match=r"more fatbin (headers|containers)"):
            capture(member, len(data), "lib.so")

    _, peak = peak_of(one_pass)
    assert peak < MAX_PEAK, f"peak {peak >> 20} MiB"


def wheel_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_a_member_declaring_more_than_the_cap_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    wheel = wheel_of(tmp_path / "big.whl", {"sgl_kernel/lib.so": bytes(200_000)})
    refused = r"sgl_kernel/lib.so: member inflates to 200000 bytes, over the 100000"
    with pytest.raises(SourceError, match=refused), sources.open_wheel(wheel, Limits(100_000)):
        pass
    result = invoke("verify", "--arch", "sm120", "--wheel", str(wheel), "--max-member-size", "100k")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--max-member-size" in result.stderr


def test_a_stream_yielding_more_than_it_declared_is_stopped() -> None:
    out = io.BytesIO()
    with pytest.raises(SourceError, match="inflates past its declared 1000 bytes"):
        bounded_copy(io.BytesIO(bytes(5 << 20)), out, 1000, Limits(), "w!m")
    assert out.tell() == 0  # not even the first chunk was written


def test_the_cap_applies_even_when_the_declared_size_is_larger() -> None:
    with pytest.raises(SourceError, match="cap 4096"):
        bounded_copy(io.BytesIO(bytes(1 << 20)), io.BytesIO(), 1 << 30, Limits(4096), "w!m")


def test_too_little_temp_space_is_refused_first(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"needs \d+ bytes of temp space"):
        check_space(tmp_path, 1 << 60, "w!m")


def test_fallback_copy_checks_space_and_names_the_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    member = b"\x7fELF" + bytes(5 << 20)  # over the size read into memory: takes the on-disk copy
    wheel = wheel_of(tmp_path / "w.whl", {"sgl_kernel/lib.so": member})
    with sources.open_wheel(wheel) as tree:
        with pytest.raises(FatbinError) as error:
            tree.read("sgl_kernel/lib.so", kernels=True)  # kernels=True always takes the on-disk copy
        assert "w.whl!sgl_kernel/lib.so" in str(error.value)
        assert "bwstack-member-" not in str(error.value)
        monkeypatch.setattr(wheel_limits.shutil, "disk_usage", lambda _p: SimpleNamespace(free=0))
        with pytest.raises(SourceError, match="temp space"):
            tree.read("sgl_kernel/lib.so", kernels=True)


def test_a_huge_text_member_is_listed_not_extracted(tmp_path: Path) -> None:
    wheel = wheel_of(tmp_path / "t.whl", {"sgl_kernel/notes.txt": bytes(wheel_limits.MAX_TEXT_MEMBER + 1)})
    with sources.open_wheel(wheel) as tree:
        assert not (tree.root / "sgl_kernel" / "notes.txt").exists()
        assert any("notes.txt" in r and "claims" in r for r in tree.refused)


def patched_method(data: bytes, method: int) -> bytes:
    """Set every local and central header's compression method (offsets 8 and 10 of their records)."""
    out = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = out.find(signature)
        while at >= 0:
            out[at + offset : at + offset + 2] = struct.pack("<H", method)
            at = out.find(signature, at + 4)
    return bytes(out)


def encrypted_flag(data: bytes) -> bytes:
    out = bytearray(data)
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = out.find(signature)
        while at >= 0:
            out[at + offset] |= 0x1
            at = out.find(signature, at + 4)
    return bytes(out)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (encrypted_flag, "member is encrypted"),
        (lambda d: patched_method(d, 93), "unsupported zip compression method 93"),
    ],
    ids=["encrypted", "zstd-method"],
)
def test_members_zipfile_cannot_read_exit_2_with_one_line(tmp_path: Path, mangle, message: str) -> None:
    source = wheel_of(tmp_path / "plain.whl", {"sgl_kernel/lib.so": MULTI.read_bytes()}, zipfile.ZIP_STORED)
    wheel = tmp_path / "bad.whl"
    wheel.write_bytes(mangle(source.read_bytes()))
    with pytest.raises(SourceError, match=message), sources.open_wheel(wheel):
        pass
    result = invoke("verify", "--arch", "sm120", "--wheel", str(wheel))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_unreadable_folders_are_listed_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "site"
    (root / "locked").mkdir(parents=True)
    (root / "open").mkdir()
    (root / "open" / "a.so").write_bytes(b"")
    real_scandir = os.scandir

    def scandir(path=".", *args):
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path, *args)

    monkeypatch.setattr(os, "scandir", scandir)
    with sources.open_path(root) as tree:
        assert tree.binaries == ["open/a.so"]
        assert any("locked" in r and "Permission denied" in r for r in tree.refused)


@pytest.mark.parametrize(
    ("text", "size"), [("4G", 4 << 30), ("512M", 512 << 20), ("100k", 102400), ("8GiB", 8 << 30), ("77", 77)]
)
def test_sizes_parse(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "-1", "0", "1.5G", "99999999999999999999999", "4X"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(SourceError):
        parse_size(text)


def test_the_fixture_package_still_verifies_through_a_wheel(tmp_path: Path) -> None:
    root = package("good")
    wheel = tmp_path / "good.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(root).as_posix())
    with sources.open_wheel(wheel) as tree:
        assert tree.binaries and tree.refused == []
        for relative in tree.binaries:
            assert tree.read(relative) == read_entries(root / relative)


def patched(data: bytes, signature: bytes, offset: int, value: bytes) -> bytes:
    out = bytearray(data)
    at = out.find(signature)
    while at >= 0:
        out[at + offset : at + offset + len(value)] = value
        at = out.find(signature, at + 4)
    return bytes(out)


def test_found_by_fuzzing_a_version_zipfile_cannot_read_is_one_line(tmp_path: Path) -> None:
    plain = wheel_of(tmp_path / "plain.whl", {"sgl_kernel/lib.so": MULTI.read_bytes()}, zipfile.ZIP_STORED)
    wheel = tmp_path / "v.whl"
    wheel.write_bytes(patched(plain.read_bytes(), b"PK\x01\x02", 6, struct.pack("<H", 128)))  # "version 12.8"
    with pytest.raises(SourceError, match="not a readable wheel"), sources.open_wheel(wheel):
        pass


def test_found_by_fuzzing_a_member_name_that_is_not_the_utf8_it_claims(tmp_path: Path) -> None:
    plain = wheel_of(tmp_path / "plain.whl", {"sgl_kernel/lib.so": MULTI.read_bytes()}, zipfile.ZIP_STORED)
    data = bytearray(plain.read_bytes())
    local = data.find(b"PK\x03\x04", data.find(b"sgl_kernel/lib.so") - 40)
    data[local + 7] |= 0x08  # flag bit 11: the name is UTF-8
    name = data.find(b"lib.so", local)
    data[name] = 0xDB  # ...but it is not
    wheel = tmp_path / "u.whl"
    wheel.write_bytes(bytes(data))
    with sources.open_wheel(wheel) as tree, pytest.raises(FatbinError, match="cannot decompress wheel member"):
        tree.read("sgl_kernel/lib.so")


def test_found_by_fuzzing_a_lying_compressed_size_is_not_allocated(tmp_path: Path) -> None:
    """ZipFile.read() asks for the whole claimed compressed size at once: 2 GB for this 90 KB wheel."""
    plain = wheel_of(tmp_path / "plain.whl", {"sgl_kernel/lib.so": MULTI.read_bytes()}, zipfile.ZIP_STORED)
    data = bytearray(plain.read_bytes())
    central = data.find(b"PK\x01\x02", data.find(b"PK\x01\x02") + 4)  # the .so's entry (after __init__.py)
    data[central + 20 : central + 24] = struct.pack("<I", 0x7FFFFFF0)  # compressed size
    wheel = tmp_path / "lying.whl"
    wheel.write_bytes(bytes(data))

    def read_it():
        with sources.open_wheel(wheel) as tree:
            try:
                return tree.read("sgl_kernel/lib.so")
            except BwstackError:
                return None  # refusing it is as good as reading it, as long as it costs nothing

    _, peak = peak_of(read_it)
    assert peak < MAX_PEAK, f"peak {peak >> 20} MiB"
