"""Which NVIDIA driver a CUDA toolkit needs: the one table of driver floors, and the verdict for a node.

Facts from docs/facts.md section 1. Each toolkit release has a driver floor for full
support; under minor-version compatibility an application built with any toolkit of a major version
also runs on an older driver of that major's family, except that the driver cannot JIT-compile PTX
newer than itself (so kernels shipped only as newer PTX do not load; SASS for the GPU still runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class DriverFloor:
    cuda: Version  # toolkit release: 13.0, 13.1, 13.1.1 (an update)
    driver: str  # the driver that release needs for full support, as NVIDIA spells it ("590.44.01")


DRIVER_FLOORS: tuple[DriverFloor, ...] = (
    DriverFloor(Version("13.0"), "580.65.06"),
    DriverFloor(Version("13.1"), "590.44.01"),
    DriverFloor(Version("13.1.1"), "590.48.01"),
)

# Minor-version compatibility: the oldest driver that runs any application of this CUDA major.
MINOR_COMPAT_FLOORS: dict[int, str] = {13: "580"}


class Support(StrEnum):
    FULL = "full"  # the driver meets the toolkit's floor
    MINOR_COMPAT = "minor-version compatibility"  # runs, but no JIT of newer PTX
    UNSUPPORTED = "unsupported"  # too old for this CUDA major
    UNKNOWN = "unknown"  # no floor recorded for this toolkit


@dataclass(frozen=True)
class DriverVerdict:
    support: Support
    driver: str
    cuda: Version
    floor: str | None
    compat_floor: str | None
    reason: str


def floor_for(cuda: Version) -> str | None:
    """The driver floor of the newest recorded release <= `cuda` within the same major.minor."""
    rows = [r for r in DRIVER_FLOORS if r.cuda.release[:2] == cuda.release[:2] and r.cuda <= cuda]
    return max(rows, key=lambda r: r.cuda).driver if rows else None


def parse_driver(text: str) -> Version | None:
    try:
        return Version(text.strip())
    except InvalidVersion:
        return None


def judge_driver(driver: str, cuda: Version, *, driver_cuda: str | None = None) -> DriverVerdict:
    """Can an application built with toolkit `cuda` run on driver `driver` (e.g. "580.95.05")?

    `driver_cuda` is the newest CUDA the driver reports (NVML's CUDA driver version), used in the wording.
    """
    version = parse_driver(driver)
    floor = floor_for(cuda)
    compat = MINOR_COMPAT_FLOORS.get(cuda.major)
    if version is None:
        return DriverVerdict(Support.UNSUPPORTED, driver, cuda, floor, compat, f"cannot read driver version {driver!r}")
    supports = f" (it supports CUDA {driver_cuda})" if driver_cuda else ""
    if floor is not None and version >= Version(floor):
        return DriverVerdict(
            Support.FULL, driver, cuda, floor, compat, f"driver {driver} >= {floor}, the floor for CUDA {cuda}"
        )
    if compat is not None and version >= Version(compat):
        what = f"below CUDA {cuda}'s floor {floor}" if floor else f"of unknown fitness for CUDA {cuda}"
        return DriverVerdict(
            Support.MINOR_COMPAT,
            driver,
            cuda,
            floor,
            compat,
            f"driver {driver}{supports} is {what}; minor-version compatibility still runs CUDA {cuda.major}.x "
            f"applications on >= {compat}, but the driver cannot JIT-compile PTX newer than itself, so kernels "
            "shipped only as newer PTX fail to load (SASS for the GPU still runs)",
        )
    if floor is None and compat is None:
        return DriverVerdict(Support.UNKNOWN, driver, cuda, None, None, f"no driver floor recorded for CUDA {cuda}")
    need = compat or floor
    return DriverVerdict(
        Support.UNSUPPORTED,
        driver,
        cuda,
        floor,
        compat,
        f"driver {driver}{supports} is too old for CUDA {cuda}: it needs >= {floor or need}"
        + (f" (>= {compat} under minor-version compatibility)" if compat and compat != floor else ""),
    )
