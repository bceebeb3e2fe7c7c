"""A fake of the pynvml functions preflight calls, for node scenarios no CI machine has.

Same names, argument order and return types as nvidia-ml-py (pynvml.py): strings for names and the
driver version, (major, minor) for compute capability, pynvml's own ctypes structures for memory and
PCI info, ints for states and bitmasks. Errors are pynvml's real NVMLError subclasses, raised with real
codes (`pynvml.NVMLError(code)` maps a code to its subclass, as the library does). Calls before nvmlInit
or after nvmlShutdown raise NVMLError_Uninitialized, as the library does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pynvml

MiB = 1024 * 1024


@dataclass(frozen=True)
class FakeGpu:
    name: str
    cc: tuple[int, int]
    memory_mib: int
    numa: int = 0  # GPUs on different NUMA nodes meet at SYS
    switch: int = 0  # GPUs behind the same PCIe switch meet at PIX
    nvlinks: int | None = None  # active NVLink links; None: the GPU has no NVLink
    nvlink_slots: int = 18
    persistence: int = pynvml.NVML_FEATURE_ENABLED
    ecc_volatile: int | None = 0  # None: ECC not supported (or off)
    ecc_aggregate: int | None = 0
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failure
    retired_pages: tuple[int, ...] | None = None  # None: not supported (Ampere and later remap rows)
    retired_pending: int = 0
    clocks_reasons: int = pynvml.nvmlClocksEventReasonGpuIdle
    lost: bool = False  # every per-GPU call raises NVMLError_GpuIsLost


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    driver: str = "590.44.01"
    cuda: int = 13010
    init_error: int | None = None  # an NVML_ERROR_* code nvmlInit raises
    pcie_p2p: int = pynvml.NVML_P2P_STATUS_OK
    calls: list[str] = field(default_factory=list)
    initialized: bool = False

    # --- helpers ---------------------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, name: str, handle: _Handle) -> FakeGpu:
        self._enter(name)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    # --- the pynvml surface --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> pynvml.nvmlPciInfo_t:
        self._gpu("nvmlDeviceGetPciInfo", handle)
        info = pynvml.nvmlPciInfo_t()
        info.bus = 0x17 + handle.index
        info.busId = f"00000000:{info.bus:02X}:00.0".encode()
        return info

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", handle).cc

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> pynvml.c_nvmlMemory_t:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        total = gpu.memory_mib * MiB
        used = 600 * MiB
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPersistenceMode", handle).persistence

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        if error_type not in (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        value = gpu.ecc_volatile if counter_type == pynvml.NVML_VOLATILE_ECC else gpu.ecc_aggregate
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)
        if gpu.remapped_rows is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.remapped_rows

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, cause: int) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetRetiredPages", handle)
        if gpu.retired_pages is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(gpu.retired_pages)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        gpu = self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if gpu.retired_pages is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.retired_pending

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_reasons

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)
        if gpu.nvlinks is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= gpu.nvlink_slots:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if link < gpu.nvlinks else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: _Handle, handle2: _Handle) -> int:
        a = self._gpu("nvmlDeviceGetTopologyCommonAncestor", handle1)
        b = self._gpu("nvmlDeviceGetTopologyCommonAncestor", handle2)
        if handle1 == handle2:
            return pynvml.NVML_TOPOLOGY_INTERNAL
        if a.numa != b.numa:
            return pynvml.NVML_TOPOLOGY_SYSTEM
        return pynvml.NVML_TOPOLOGY_SINGLE if a.switch == b.switch else pynvml.NVML_TOPOLOGY_NODE

    def nvmlDeviceGetP2PStatus(self, handle1: _Handle, handle2: _Handle, index: int) -> int:
        a = self._gpu("nvmlDeviceGetP2PStatus", handle1)
        b = self._gpu("nvmlDeviceGetP2PStatus", handle2)
        if index == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
            both = a.nvlinks and b.nvlinks
            return pynvml.NVML_P2P_STATUS_OK if both else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
        if index not in (pynvml.NVML_P2P_CAPS_INDEX_WRITE, pynvml.NVML_P2P_CAPS_INDEX_ATOMICS):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_P2P_STATUS_OK if a.nvlinks and b.nvlinks else self.pcie_p2p


# --- scenarios -------------------------------------------------------------------------------------------

RTX_PRO_6000 = FakeGpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 97887)
H200 = FakeGpu("NVIDIA H200", (9, 0), 143771, nvlinks=18)
H100_PCIE = FakeGpu("NVIDIA H100 PCIe", (9, 0), 81559)


def _spread(gpu: FakeGpu, count: int, *, per_numa: int = 4, per_switch: int = 2) -> list[FakeGpu]:
    """`count` GPUs of one kind laid out over NUMA nodes and PCIe switches like a 2-socket server."""
    return [dataclasses.replace(gpu, numa=i // per_numa, switch=i // per_switch) for i in range(count)]


def rtx_pro_6000_pcie(count: int = 8) -> FakeNvml:
    """The incident's node: 8x RTX PRO 6000 Blackwell (CC 12.0, 96 GB), PCIe only, driver 590 (CUDA 13.1)."""
    return FakeNvml(gpus=_spread(RTX_PRO_6000, count))


def h200_nvlink() -> FakeNvml:
    """An HGX H200 node: 8x H200 (CC 9.0, 141 GB), every pair over NVLink (NVSwitch)."""
    return FakeNvml(gpus=_spread(H200, 8))


def mixed_node() -> FakeNvml:
    """6x RTX PRO 6000 (12.0) beside 2x H100 PCIe (9.0): an sm_120a image cannot run on the H100s."""
    return FakeNvml(gpus=_spread(RTX_PRO_6000, 6) + [dataclasses.replace(H100_PCIE, numa=1, switch=9)] * 2)


def old_driver() -> FakeNvml:
    """The RTX PRO node with a CUDA 12.8 driver (570): too old for any CUDA 13 image."""
    return FakeNvml(gpus=_spread(RTX_PRO_6000, 8), driver="570.172.08", cuda=12080)


def compat_driver() -> FakeNvml:
    """The RTX PRO node with a CUDA 13.0 driver (580): runs 13.1 images under minor-version compatibility."""
    return FakeNvml(gpus=_spread(RTX_PRO_6000, 8), driver="580.95.05", cuda=13000)


def no_library() -> FakeNvml:
    """No driver installed: nvmlInit cannot load libnvidia-ml.so.1."""
    return FakeNvml(gpus=[], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
