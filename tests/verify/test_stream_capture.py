"""The single-pass wheel reader gives exactly what reading the whole file gives, or falls back."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bwstack.errors import FatbinError
from bwstack.verify import stream_capture
from bwstack.verify.fatbin import read_entries, read_source_entries
from bwstack.verify.sources import open_wheel
from bwstack.verify.stream_capture import WindowMiss, capture
from tests.paths import FIXTURES, package

SHARED_OBJECTS = sorted(p for p in FIXTURES.rglob("*.so") if p.is_file())


def deflated(data: bytes) -> zipfile.ZipFile:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("lib.so", data)
    return zipfile.ZipFile(io.BytesIO(buffer.getvalue()))


def captured_entries(data: bytes):
    archive = deflated(data)
    with archive.open("lib.so") as member:
        return read_source_entries(capture(member, len(data), "lib.so"))


def test_fixtures_cover_cuda_and_host_only_objects() -> None:
    assert len(SHARED_OBJECTS) >= 20
    assert any(read_entries(p) == [] for p in SHARED_OBJECTS)


@pytest.mark.parametrize("path", SHARED_OBJECTS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_single_pass_matches_whole_file_read(path: Path) -> None:
    assert captured_entries(path.read_bytes()) == read_entries(path)


@pytest.mark.parametrize("chunk", [97, 1000, 4096])
def test_headers_split_across_chunks_are_still_seen(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(stream_capture, "CHUNK", chunk)
    for path in SHARED_OBJECTS:
        assert captured_entries(path.read_bytes()) == read_entries(path), path


def test_a_layout_it_did_not_keep_is_a_miss_and_the_wheel_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = package("incident") / "sgl_kernel" / "sm100" / "common_ops.abi3.so"
    monkeypatch.setattr(stream_capture, "TAIL", 16)  # the section table is no longer kept
    with pytest.raises(WindowMiss):
        captured_entries(path.read_bytes())
    wheel = tmp_path / "x.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.write(path, "sgl_kernel/sm100/common_ops.abi3.so")
    with open_wheel(wheel) as tree:
        assert tree.read("sgl_kernel/sm100/common_ops.abi3.so") == read_entries(path)


def _outcome(read):
    try:
        return ("ok", read())
    except FatbinError as error:
        return ("error", type(error).__name__)


@settings(max_examples=150, deadline=2000, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    index=st.integers(min_value=0, max_value=len(SHARED_OBJECTS) - 1),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=8),
)
def test_mutated_binaries_agree_with_the_whole_file_read(tmp_path_factory, index: int, flips) -> None:
    data = bytearray(SHARED_OBJECTS[index].read_bytes())
    for where, value in flips:
        data[int(where * len(data))] = value
    path = tmp_path_factory.mktemp("m") / "lib.so"
    path.write_bytes(bytes(data))
    whole = _outcome(lambda: read_entries(path))
    single = _outcome(lambda: captured_entries(bytes(data)))
    if single == ("error", "WindowMiss"):
        return  # the wheel path falls back to a full copy, which is `whole` by construction
    if whole[0] == "ok":
        assert single == whole
    else:
        assert single[0] == "error"
