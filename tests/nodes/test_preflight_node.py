"""Node preflight against fake NVML scenarios (tests/fakes/fake_pynvml.py) and the real pynvml here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pynvml
import pytest
from packaging.version import Version

from bwstack.nodes.preflight import PreflightRequest, judge_driver, node_ccs, read_node, run_preflight
from bwstack.nodes.preflight.driver import Support, floor_for
from bwstack.nodes.preflight.host import HostPaths, HostThresholds
from bwstack.nodes.preflight.node import NCCL_PCIE_REMEDY, runs_on
from bwstack.recipes.archs import parse_arch
from bwstack.report import Report, Status
from tests.fakes import fake_pynvml as fakes

CUDA_131 = Version("13.1")
SM120 = parse_arch("sm120")
SM90 = parse_arch("sm90")
LENIENT = HostThresholds(shm_fail=0, shm_warn=0, disk_warn=0, ram_warn=0)


def fake_sys(root: Path, *, iommu: bool) -> HostPaths:
    """A /sys laid out as the kernel does with the IOMMU on (dmar units, groups) or off (empty folders)."""
    units, groups = root / "class" / "iommu", root / "kernel" / "iommu_groups"
    units.mkdir(parents=True)
    groups.mkdir(parents=True)
    if iommu:
        for name in ("dmar0", "dmar1"):
            (units / name).mkdir()
        for n in range(40):
            (groups / str(n)).mkdir()
    cmdline = root / "cmdline"
    cmdline.write_text("BOOT_IMAGE=/vmlinuz intel_iommu=on quiet\n" if iommu else "BOOT_IMAGE=/vmlinuz quiet\n")
    return HostPaths(iommu_class=units, iommu_groups=groups, cmdline=cmdline, cdi_dirs=(root / "cdi",))


def preflight(
    nvml: fakes.FakeNvml, tmp_path: Path, *, iommu: bool = False, archs=(SM120,), tp: int = 8, cuda=CUDA_131
) -> Report:
    request = PreflightRequest(recipe="sglang", cuda=cuda, archs=tuple(archs), tp=tp, docker=False)
    return run_preflight(request, nvml=nvml, host_paths=fake_sys(tmp_path, iommu=iommu), thresholds=LENIENT)


def check(report: Report, name: str):
    (found,) = [c for c in report.checks if c.name == name]
    return found


def test_rtx_pro_6000_pcie_with_iommu_warns_about_nccl_p2p(tmp_path: Path) -> None:
    report = preflight(fakes.rtx_pro_6000_pcie(), tmp_path, iommu=True)
    inter = check(report, "interconnect")
    assert inter.status is Status.WARN
    assert "PCIe only" in inter.finding and "IOMMU is enabled" in inter.finding
    assert "custom all-reduce is off above 2 PCIe GPUs" in inter.finding
    assert "NCCL_P2P_DISABLE=1" in inter.remedy and "NCCL_CUMEM_ENABLE=0" in inter.remedy
    assert inter.remedy == NCCL_PCIE_REMEDY
    assert inter.evidence["iommu_enabled"] is True
    assert inter.evidence["pcie_topology"] == {"SYS": 16, "NODE": 8, "PIX": 4}
    assert check(report, "host.iommu").finding.startswith("IOMMU enabled (dmar0, dmar1; 40 groups)")
    for name in ("driver", "gpu.count", "gpu.arch", "gpu.persistence", "gpu.ecc", "gpu.memory-repair", "gpu.clocks"):
        assert check(report, name).status is Status.PASS, name
    assert report.ok and report.exit_code == 0  # warnings do not fail the node


def test_report_data_carries_gfd_labels_and_ccs_for_provision(tmp_path: Path) -> None:
    report = preflight(fakes.rtx_pro_6000_pcie(), tmp_path, iommu=True)
    labels = report.data["labels"]
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
    assert labels["nvidia.com/gpu.memory"] == "97887"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) == ("12", "0")
    assert labels["nvidia.com/cuda.driver.major"] == "590"
    assert (labels["nvidia.com/cuda.runtime.major"], labels["nvidia.com/cuda.runtime.minor"]) == ("13", "1")
    assert node_ccs(report) == [(12, 0)] * 8
    assert report.data["gpus"][0]["arch"] == "sm120"
    assert report.data["gpus"][3]["bus_id"] == "00000000:1A:00.0"
    assert report.data["interconnect"] == "pcie"
    as_json = report.to_dict()
    assert as_json["gpus"][7]["cc"] == (12, 0) and as_json["driver"] == {"version": "590.44.01", "cuda": "13.1"}


def test_pcie_without_iommu_passes_with_the_all_reduce_note(tmp_path: Path) -> None:
    inter = check(preflight(fakes.rtx_pro_6000_pcie(), tmp_path, iommu=False), "interconnect")
    assert inter.status is Status.PASS
    assert "custom all-reduce is off" in inter.finding and "IOMMU" not in inter.finding


def test_two_pcie_gpus_keep_custom_all_reduce(tmp_path: Path) -> None:
    inter = check(preflight(fakes.rtx_pro_6000_pcie(2), tmp_path, iommu=True, tp=2), "interconnect")
    assert inter.status is Status.WARN and "custom all-reduce" not in inter.finding


def test_h200_nvlink_node_passes_for_sm90(tmp_path: Path) -> None:
    report = preflight(fakes.h200_nvlink(), tmp_path, iommu=True, archs=(SM90,))
    assert check(report, "interconnect").status is Status.PASS
    assert check(report, "interconnect").finding == "NVLink between all 8 GPUs"
    assert check(report, "gpu.arch").finding == "8x NVIDIA H200 (CC 9.0); runs sm90"
    assert report.data["interconnect"] == "nvlink"
    assert all(g["nvlink_active"] == 18 for g in report.data["gpus"])
    assert report.ok, [c.to_dict() for c in report.failures()]


def test_h200_fails_an_sm120_image(tmp_path: Path) -> None:
    arch = check(preflight(fakes.h200_nvlink(), tmp_path, archs=(SM120,)), "gpu.arch")
    assert arch.status is Status.FAIL
    assert "GPU 0 NVIDIA H200 (CC 9.0)" in arch.finding and "sm_120a" in arch.finding
    assert "--arch sm90" in arch.remedy


def test_any_recipe_arch_is_accepted_without_arch(tmp_path: Path) -> None:
    recipe_archs = tuple(parse_arch(a) for a in ("sm90", "sm100", "sm120"))
    assert check(preflight(fakes.h200_nvlink(), tmp_path, archs=recipe_archs), "gpu.arch").status is Status.PASS


def test_mixed_node_fails_naming_the_gpus_that_cannot_run_it(tmp_path: Path) -> None:
    report = preflight(fakes.mixed_node(), tmp_path)
    arch = check(report, "gpu.arch")
    assert arch.status is Status.FAIL
    assert arch.finding.startswith("mixed node: GPU 6 NVIDIA H100 PCIe (CC 9.0), GPU 7 NVIDIA H100 PCIe (CC 9.0)")
    assert "CUDA_VISIBLE_DEVICES" in arch.remedy
    assert arch.evidence["mixed"] is True
    assert report.exit_code == 1
    assert node_ccs(report) == [(12, 0)] * 6 + [(9, 0)] * 2


def test_mixed_node_that_runs_everywhere_still_warns(tmp_path: Path) -> None:
    nvml = fakes.mixed_node()
    arch = check(preflight(nvml, tmp_path, archs=(SM120, SM90)), "gpu.arch")
    assert arch.status is Status.WARN and arch.finding.startswith("mixed node: 6x NVIDIA RTX PRO 6000")


def test_old_driver_fails_the_cuda_13_floor(tmp_path: Path) -> None:
    driver = check(preflight(fakes.old_driver(), tmp_path), "driver")
    assert driver.status is Status.FAIL
    assert "570.172.08 (it supports CUDA 12.8) is too old for CUDA 13.1" in driver.finding
    assert ">= 590.44.01" in driver.finding and ">= 580 under minor-version compatibility" in driver.finding
    assert driver.remedy == "install NVIDIA driver >= 590.44.01"


def test_580_driver_runs_13_1_under_minor_version_compatibility(tmp_path: Path) -> None:
    driver = check(preflight(fakes.compat_driver(), tmp_path), "driver")
    assert driver.status is Status.WARN
    assert "below CUDA 13.1's floor 590.44.01" in driver.finding
    assert "minor-version compatibility" in driver.finding and "cannot JIT-compile PTX newer" in driver.finding
    assert driver.evidence["support"] == "minor-version compatibility"


def test_four_gpus_cannot_serve_tp_8(tmp_path: Path) -> None:
    report = preflight(fakes.rtx_pro_6000_pcie(4), tmp_path)
    count = check(report, "gpu.count")
    assert count.status is Status.FAIL
    assert count.finding == "4 GPU(s) visible, the recipe serves with tp 8"
    assert count.evidence == {"nvidia.com/gpu.count": 4, "tp": 8}
    assert [c.name for c in report.failures()] == ["gpu.count"]


def test_missing_library_is_a_failed_driver_check_not_an_exception(tmp_path: Path) -> None:
    nvml = fakes.no_library()
    report = preflight(nvml, tmp_path)
    driver = check(report, "driver")
    assert driver.status is Status.FAIL
    assert driver.finding.startswith("no NVIDIA driver: libnvidia-ml.so.1 cannot be loaded")
    assert driver.evidence["error"] == "NVMLError_LibraryNotFound"
    assert check(report, "gpu").status is Status.SKIP
    assert report.data["gpus"] == [] and report.data["labels"] == {}
    assert nvml.calls == ["nvmlInit"]


def test_unhealthy_gpus(tmp_path: Path) -> None:
    nvml = fakes.rtx_pro_6000_pcie()
    sick = {
        1: {"persistence": pynvml.NVML_FEATURE_DISABLED},
        2: {"ecc_volatile": 3, "ecc_aggregate": 5},
        3: {"remapped_rows": (0, 1, 1, 0)},
        4: {"clocks_reasons": pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap},
        5: {"ecc_volatile": None, "ecc_aggregate": None},
    }
    for index, changes in sick.items():
        nvml.gpus[index] = dataclasses.replace(nvml.gpus[index], **changes)
    report = preflight(nvml, tmp_path)
    assert check(report, "gpu.persistence").status is Status.WARN
    assert "GPU 1" in check(report, "gpu.persistence").finding
    ecc = check(report, "gpu.ecc")
    assert ecc.status is Status.FAIL and "GPU 2: 3" in ecc.finding and ecc.evidence["unsupported_on"] == [5]
    repair = check(report, "gpu.memory-repair")
    assert repair.status is Status.FAIL and repair.finding == "row remaps pending on GPU 3"
    clocks = check(report, "gpu.clocks")
    assert clocks.status is Status.WARN and clocks.finding == "clocks held back: GPU 4: hardware thermal slowdown"


def test_retired_pages_pending_on_pre_ampere_style_gpu(tmp_path: Path) -> None:
    nvml = fakes.rtx_pro_6000_pcie(2)
    nvml.gpus[0] = dataclasses.replace(
        nvml.gpus[0], remapped_rows=None, retired_pages=(0x1000, 0x2000), retired_pending=1
    )
    repair = check(preflight(nvml, tmp_path, tp=2), "gpu.memory-repair")
    assert repair.status is Status.FAIL and "page retirement pending on GPU 0" in repair.finding
    assert repair.evidence["retired_pages"] == {0: 2, 1: None}


def test_read_node_shuts_nvml_down_and_reports_a_lost_gpu(tmp_path: Path) -> None:
    nvml = fakes.rtx_pro_6000_pcie(2)
    facts = read_node(nvml)
    assert nvml.calls[-1] == "nvmlShutdown" and not nvml.initialized
    assert facts.gpus[0].unsupported == ("retired_pages", "nvlink")
    nvml.gpus[1] = dataclasses.replace(nvml.gpus[1], lost=True)
    report = preflight(nvml, tmp_path, tp=2)
    driver = check(report, "driver")
    assert driver.status is Status.FAIL
    assert "GPU 1: nvmlDeviceGetName failed" in driver.finding and "NVMLError_GpuIsLost" in driver.finding
    assert nvml.calls[-1] == "nvmlShutdown"


def test_driver_floor_table() -> None:
    assert floor_for(Version("13.0")) == "580.65.06"
    assert floor_for(Version("13.1")) == "590.44.01"
    assert floor_for(Version("13.1.1")) == "590.48.01"
    assert floor_for(Version("12.8")) is None
    assert judge_driver("590.44.01", Version("13.1")).support is Support.FULL
    assert judge_driver("590.44.01", Version("13.1.1")).support is Support.MINOR_COMPAT
    assert judge_driver("garbage", Version("13.1")).support is Support.UNSUPPORTED
    assert judge_driver("999.1", Version("14.0")).support is Support.UNKNOWN


def test_real_pynvml_on_this_machine_is_a_failed_driver_check(tmp_path: Path) -> None:
    """No GPU and no NVML library here or in CI: the real pynvml path must end in a failed driver check."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    request = PreflightRequest(archs=(SM120,), tp=8, docker=False)
    report = run_preflight(request, host_paths=fake_sys(tmp_path, iommu=False))
    driver = check(report, "driver")
    assert driver.status is Status.FAIL and driver.evidence["error"] == "NVMLError_LibraryNotFound"
    assert report.exit_code == 1


@pytest.mark.parametrize(
    ("arch", "cc", "runs"),
    [
        ("sm120", (12, 0), True),
        ("sm120", (12, 1), False),
        ("sm100", (10, 3), True),
        ("sm80", (8, 6), True),
        ("sm80", (9, 0), False),
    ],
)
def test_recipe_build_target_runs_on(arch: str, cc: tuple[int, int], runs: bool) -> None:
    assert runs_on(parse_arch(arch), cc) is runs


def test_a_failed_row_remap_comes_first_and_asks_for_service(tmp_path: Path) -> None:
    nvml = fakes.rtx_pro_6000_pcie(3)
    nvml.gpus[0] = dataclasses.replace(nvml.gpus[0], remapped_rows=(0, 1, 1, 0))  # pending
    nvml.gpus[2] = dataclasses.replace(nvml.gpus[2], remapped_rows=(0, 1, 0, 1))  # failed
    repair = check(preflight(nvml, tmp_path, tp=3), "gpu.memory-repair")
    assert repair.status is Status.FAIL
    assert repair.finding == "row remapping failed on GPU 2 (the GPU needs service); row remaps pending on GPU 0"
    assert repair.remedy is not None and repair.remedy.startswith("take the GPU out of service (RMA); reset the GPU")
