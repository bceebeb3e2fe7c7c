"""Host size checks (/dev/shm, disk, RAM): the grades and their wording, from facts alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bwstack.nodes.preflight.host import GiB, HostFacts, HostThresholds, MiB, check_disk, check_ram, check_shm
from bwstack.report import Status

LIMITS = HostThresholds()
FACTS = HostFacts(
    shm_bytes=32 * GiB,
    disk_path=Path("/models"),
    disk_free=500 * GiB,
    ram_total=512 * GiB,
    ram_available=400 * GiB,
    iommu_enabled=False,
    iommu_units=(),
    iommu_groups=0,
    iommu_cmdline=(),
    docker=None,
    docker_error=None,
)


def with_(**changes: object) -> HostFacts:
    return dataclasses.replace(FACTS, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shm", "status", "finding"),
    [
        (None, Status.FAIL, "/dev/shm is missing"),
        (64 * MiB, Status.FAIL, "/dev/shm is 64 MiB: NCCL between TP ranks breaks"),
        (8 * GiB, Status.WARN, "/dev/shm is 8.0 GiB (< 16.0 GiB)"),
        (16 * GiB, Status.PASS, "/dev/shm is 16.0 GiB"),
    ],
)
def test_shm_is_graded_by_the_two_limits(shm: int | None, status: Status, finding: str) -> None:
    check = check_shm(with_(shm_bytes=shm), LIMITS)
    assert (check.name, check.status, check.finding) == ("host.shm", status, finding)
    assert check.evidence == {"path": "/dev/shm", "bytes": shm}
    assert (check.remedy is None) is (status is Status.PASS)


@pytest.mark.parametrize(
    ("free", "status", "finding", "remedy"),
    [
        (None, Status.WARN, "cannot read free space at /models", False),
        (10 * GiB, Status.WARN, "10.0 GiB free at /models (< 50.0 GiB for JIT caches and logs)", True),
        (50 * GiB, Status.PASS, "50.0 GiB free at /models", False),
    ],
)
def test_disk_warns_below_its_limit(free: int | None, status: Status, finding: str, remedy: bool) -> None:
    check = check_disk(with_(disk_free=free), LIMITS)
    assert (check.name, check.status, check.finding) == ("host.disk", status, finding)
    assert check.evidence == {"path": "/models", "free_bytes": free}
    assert (check.remedy is not None) is remedy


@pytest.mark.parametrize(
    ("total", "status", "suffix"),
    [
        (32 * GiB, Status.WARN, " (< 64.0 GiB: loading shards through the page cache will be slow)"),
        (64 * GiB, Status.PASS, ""),
    ],
)
def test_ram_warns_below_its_limit(total: int, status: Status, suffix: str) -> None:
    check = check_ram(with_(ram_total=total, ram_available=GiB), LIMITS)
    assert (check.name, check.status) == ("host.ram", status)
    assert check.finding == f"{total / GiB:.1f} GiB RAM, 1.0 GiB available{suffix}"
    assert check.evidence == {"total_bytes": total, "available_bytes": GiB}
    assert check.remedy is None
