"""NVML facts about this node: the thin seam over pynvml (nvidia-ml-py) and what it reads.

`Nvml` names exactly the pynvml functions preflight calls, with their real names and return types;
the pynvml module itself satisfies it, and tests pass a fake with the same names. Everything above
this file works on `NodeFacts`, plain data.

A reading NVML says is not supported on this GPU (ECC on a workstation board, row remapping before
Ampere) is recorded as unsupported, not as a problem. Any other per-GPU error is kept as a reading
error for the health checks to report. Failing to start NVML at all raises NvmlUnavailable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pynvml

from bwstack.errors import PreflightError

CC = tuple[int, int]
T = TypeVar("T")

# pynvml spells the PCIe read index as a one-element tuple (`NVML_P2P_CAPS_INDEX_READ = 0,`), so
# preflight asks about write (plain PCIe peer-to-peer) and NVLink, whose constants are ints.
P2P_WRITE = pynvml.NVML_P2P_CAPS_INDEX_WRITE
P2P_NVLINK = pynvml.NVML_P2P_CAPS_INDEX_NVLINK

TOPOLOGY_NAMES = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "SELF",
    pynvml.NVML_TOPOLOGY_SINGLE: "PIX",  # one PCIe switch between them
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",  # several PCIe switches, no host bridge
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",  # through a PCIe host bridge
    pynvml.NVML_TOPOLOGY_NODE: "NODE",  # across host bridges within one NUMA node
    pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",  # across NUMA nodes (the CPU interconnect)
}

P2P_STATUS_NAMES = {
    pynvml.NVML_P2P_STATUS_OK: "OK",
    pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED: "CHIPSET_NOT_SUPPORTED",
    pynvml.NVML_P2P_STATUS_GPU_NOT_SUPPORTED: "GPU_NOT_SUPPORTED",
    pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED: "IOH_TOPOLOGY_NOT_SUPPORTED",
    pynvml.NVML_P2P_STATUS_DISABLED_BY_REGKEY: "DISABLED_BY_REGKEY",
    pynvml.NVML_P2P_STATUS_NOT_SUPPORTED: "NOT_SUPPORTED",
    pynvml.NVML_P2P_STATUS_UNKNOWN: "UNKNOWN",
}


class Nvml(Protocol):
    """The subset of pynvml preflight calls. `pynvml` itself is one; tests/fakes has another."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...  # nvmlPciInfo_t: .busId is bytes
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # c_nvmlMemory_t: .total/.free/.used
    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]: ...
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: Any, handle2: Any) -> int: ...
    def nvmlDeviceGetP2PStatus(self, handle1: Any, handle2: Any, index: int) -> int: ...


class NvmlUnavailable(PreflightError):
    """NVML could not be started or could not describe a GPU: no driver, no library, a lost GPU."""

    def __init__(self, message: str, *, error: str, remedy: str | None = None) -> None:
        self.error = error  # the NVMLError subclass name, e.g. NVMLError_LibraryNotFound
        super().__init__(message, remedy=remedy)


_INIT_REMEDIES = {
    "NVMLError_LibraryNotFound": "install the NVIDIA driver (it ships libnvidia-ml.so.1); in a container, run it "
    "with the NVIDIA runtime (--gpus all) or a CDI device",
    "NVMLError_DriverNotLoaded": "load the NVIDIA kernel module (modprobe nvidia) or reinstall the driver",
    "NVMLError_LibRmVersionMismatch": "the driver was upgraded without a reboot: reboot, or reload the nvidia "
    "kernel modules",
    "NVMLError_NoPermission": "run as a user that can open /dev/nvidia*",
}


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class GpuFacts:
    """What NVML says about one GPU. None means unsupported or unreadable (see `unsupported`/`errors`)."""

    index: int
    name: str
    bus_id: str
    cc: CC
    memory_total: int  # bytes
    persistence: bool | None = None
    ecc_uncorrected_volatile: int | None = None  # since the driver loaded
    ecc_uncorrected_aggregate: int | None = None  # over the board's life
    remapped_rows: RemappedRows | None = None
    retired_pages: int | None = None
    retired_pages_pending: bool | None = None
    clocks_event_reasons: int | None = None  # bitmask of nvmlClocksEventReason*
    nvlink_active: int | None = None  # active NVLink links; None where the GPU has no NVLink
    unsupported: tuple[str, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "bus_id": self.bus_id,
            "cc": self.cc,
            "memory_bytes": self.memory_total,
            "persistence": self.persistence,
            "ecc_uncorrected_volatile": self.ecc_uncorrected_volatile,
            "ecc_uncorrected_aggregate": self.ecc_uncorrected_aggregate,
            "remapped_rows": None if self.remapped_rows is None else vars(self.remapped_rows),
            "retired_pages": self.retired_pages,
            "retired_pages_pending": self.retired_pages_pending,
            "clocks_event_reasons": self.clocks_event_reasons,
            "nvlink_active": self.nvlink_active,
            "unsupported": list(self.unsupported),
            "errors": self.errors,
        }


@dataclass(frozen=True)
class LinkFacts:
    """How two GPUs reach each other."""

    a: int
    b: int
    topology: str | None  # PIX / PXB / PHB / NODE / SYS (nvidia-smi topo spelling)
    p2p_nvlink: str | None  # P2P status over NVLink: OK or why not
    p2p_pcie: str | None  # P2P (write) status over PCIe: OK or why not

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": [self.a, self.b],
            "topology": self.topology,
            "p2p_nvlink": self.p2p_nvlink,
            "p2p": self.p2p_pcie,
        }


@dataclass(frozen=True)
class NodeFacts:
    driver_version: str  # "590.44.01"
    cuda_driver_version: int  # what NVML reports: 13010 for CUDA 13.1
    gpus: tuple[GpuFacts, ...]
    links: tuple[LinkFacts, ...] = ()

    @property
    def cuda_driver(self) -> str:
        """The newest CUDA version the driver supports, "13.1"."""
        major, rest = divmod(self.cuda_driver_version, 1000)
        return f"{major}.{rest // 10}"


def _error_name(error: Exception) -> str:
    return type(error).__name__


class _Reader:
    """Calls one NVML function, sorting 'not supported' from real errors."""

    def __init__(self) -> None:
        self.unsupported: list[str] = []
        self.errors: dict[str, str] = {}

    def read(self, what: str, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except pynvml.NVMLError_NotSupported:
            self.unsupported.append(what)
        except pynvml.NVMLError as error:
            self.errors[what] = f"{_error_name(error)}: {error}"
        return None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


_INIT_MEANINGS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver: libnvidia-ml.so.1 cannot be loaded",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_LibRmVersionMismatch": "the NVML library and the loaded kernel driver differ in version",
    "NVMLError_NoPermission": "no permission to open the GPUs",
}


def _required(what: str, call: Callable[[], T], index: int | None = None) -> T:
    try:
        return call()
    except pynvml.NVMLError as error:
        name = _error_name(error)
        where = f"GPU {index}: " if index is not None else ""
        meaning = _INIT_MEANINGS.get(name, f"{where}{what} failed")
        raise NvmlUnavailable(
            f"{meaning} ({what}: {error}, {name})",
            error=_error_name(error),
            remedy=_INIT_REMEDIES.get(
                _error_name(error), "check `nvidia-smi` and the kernel log (dmesg) for Xid errors"
            ),
        ) from None


def _clock_reasons(nvml: Nvml, handle: Any) -> int:
    try:
        return nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except pynvml.NVMLError_FunctionNotFound:
        # Drivers older than the rename only have the ThrottleReasons spelling (same bits).
        legacy = getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if legacy is None:
            raise
        return int(legacy(handle))


def _nvlink_active(nvml: Nvml, handle: Any) -> int | None:
    """Count active NVLink links; None for a GPU without NVLink (the first link is not supported)."""
    active = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active += 1 if nvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED else 0
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
            return None if link == 0 else active
    return active


def _read_gpu(nvml: Nvml, index: int, handle: Any) -> GpuFacts:
    name = _text(_required("nvmlDeviceGetName", lambda: nvml.nvmlDeviceGetName(handle), index))
    major, minor = _required(
        "nvmlDeviceGetCudaComputeCapability", lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle), index
    )
    memory = _required("nvmlDeviceGetMemoryInfo", lambda: nvml.nvmlDeviceGetMemoryInfo(handle), index)
    reader = _Reader()
    pci = reader.read("pci", lambda: nvml.nvmlDeviceGetPciInfo(handle))
    persistence = reader.read("persistence", lambda: nvml.nvmlDeviceGetPersistenceMode(handle))
    uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    ecc_volatile = reader.read(
        "ecc", lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, uncorrected, pynvml.NVML_VOLATILE_ECC)
    )
    ecc_aggregate = (
        reader.read("ecc", lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, uncorrected, pynvml.NVML_AGGREGATE_ECC))
        if ecc_volatile is not None
        else None
    )
    rows = reader.read("remapped_rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle))
    retired = reader.read(
        "retired_pages",
        lambda: nvml.nvmlDeviceGetRetiredPages(handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
    )
    retired_pending = (
        reader.read("retired_pages", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        if retired is not None
        else None
    )
    reasons = reader.read("clocks_event_reasons", lambda: _clock_reasons(nvml, handle))
    nvlink = reader.read("nvlink", lambda: _nvlink_active(nvml, handle))
    return GpuFacts(
        index=index,
        name=name,
        bus_id=_text(pci.busId) if pci is not None else "",
        cc=(int(major), int(minor)),
        memory_total=int(memory.total),
        persistence=None if persistence is None else persistence == pynvml.NVML_FEATURE_ENABLED,
        ecc_uncorrected_volatile=ecc_volatile,
        ecc_uncorrected_aggregate=ecc_aggregate,
        remapped_rows=None if rows is None else RemappedRows(rows[0], rows[1], bool(rows[2]), bool(rows[3])),
        retired_pages=None if retired is None else len(retired),
        retired_pages_pending=None if retired_pending is None else bool(retired_pending),
        clocks_event_reasons=reasons,
        nvlink_active=nvlink,
        unsupported=tuple(
            dict.fromkeys(
                [*reader.unsupported, *(["nvlink"] if nvlink is None and "nvlink" not in reader.errors else [])]
            )
        ),
        errors=reader.errors,
    )


def _read_link(nvml: Nvml, a: int, b: int, ha: Any, hb: Any) -> LinkFacts:
    reader = _Reader()
    level = reader.read("topology", lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
    nvlink = reader.read("p2p_nvlink", lambda: nvml.nvmlDeviceGetP2PStatus(ha, hb, P2P_NVLINK))
    pcie = reader.read("p2p", lambda: nvml.nvmlDeviceGetP2PStatus(ha, hb, P2P_WRITE))
    return LinkFacts(
        a=a,
        b=b,
        topology=None if level is None else TOPOLOGY_NAMES.get(level, str(level)),
        p2p_nvlink=None if nvlink is None else P2P_STATUS_NAMES.get(nvlink, str(nvlink)),
        p2p_pcie=None if pcie is None else P2P_STATUS_NAMES.get(pcie, str(pcie)),
    )


def read_node(nvml: Nvml) -> NodeFacts:
    """Everything preflight needs from NVML, read once. Raises NvmlUnavailable when NVML cannot start."""
    _required("nvmlInit", nvml.nvmlInit)
    try:
        driver = _text(_required("nvmlSystemGetDriverVersion", nvml.nvmlSystemGetDriverVersion))
        cuda = int(_required("nvmlSystemGetCudaDriverVersion", nvml.nvmlSystemGetCudaDriverVersion))
        count = int(_required("nvmlDeviceGetCount", nvml.nvmlDeviceGetCount))
        handles = [
            _required("nvmlDeviceGetHandleByIndex", lambda i=i: nvml.nvmlDeviceGetHandleByIndex(i), i)
            for i in range(count)
        ]
        gpus = tuple(_read_gpu(nvml, i, h) for i, h in enumerate(handles))
        links = tuple(_read_link(nvml, a, b, handles[a], handles[b]) for a in range(count) for b in range(a + 1, count))
    finally:
        with contextlib.suppress(pynvml.NVMLError):  # best effort: the facts are already read
            nvml.nvmlShutdown()
    return NodeFacts(driver_version=driver, cuda_driver_version=cuda, gpus=gpus, links=links)
