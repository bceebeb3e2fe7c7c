"""The GPU ground-truth check's CPU half: container extraction and the agreement rule.

The driver half (cuModuleLoadData) runs only where a GPU is lent: `python -m verify.gpu_truth --out DIR`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bwstack.verify.fatbin import CONTAINER_MAGIC, read_entries
from bwstack.verify.gpu_truth import CUDA_ERROR_NO_BINARY_FOR_GPU, compare, containers
from tests.paths import FIXTURES

CUDA_OBJECTS = [p for p in sorted(FIXTURES.rglob("*.so")) if read_entries(p)]


@pytest.mark.parametrize("path", CUDA_OBJECTS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_entry_lies_in_exactly_one_container(path: Path) -> None:
    found = containers(path)
    assert found
    for container in found:
        assert int.from_bytes(container.data[:4], "little") == CONTAINER_MAGIC
    for entry in read_entries(path):
        holders = [c for c in found if c.offset <= entry.offset < c.offset + len(c.data)]
        assert len(holders) == 1, (path, entry.arch)


def test_host_only_object_has_no_containers() -> None:
    assert containers(FIXTURES / "cuda" / "bin" / "host_only.so") == []


def test_agreement_rule_on_an_h200() -> None:
    """sm_120a code on CC 9.0: verify says none, so only NO_BINARY_FOR_GPU from the driver agrees."""
    path = FIXTURES / "cuda" / "bin" / "sm120a.so"
    refused = compare(path, (9, 0), lambda _image: CUDA_ERROR_NO_BINARY_FOR_GPU)
    loaded = compare(path, (9, 0), lambda _image: 0)
    assert {r.verify_says for r in refused} == {"none"}
    assert all(r.agrees for r in refused) and not any(r.agrees for r in loaded)
    jit = compare(FIXTURES / "cuda" / "bin" / "ptx_compute80.so", (9, 0), lambda _image: 0)
    assert [(r.verify_says, r.via, r.agrees) for r in jit] == [("ptx-jit", "compute_80", True)]


def test_without_a_driver_it_exits_2_with_one_line() -> None:
    command = [sys.executable, "-m", "bwstack.verify.gpu_truth", str(FIXTURES)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 2:
        pytest.skip("this machine has a CUDA driver")  # the GPU path is exercised by scripts/device_check.sh
    assert result.stderr.strip().startswith("bwstack: error: no CUDA driver")
    assert len(result.stderr.strip().splitlines()) == 1
