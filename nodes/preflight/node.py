"""Node checks from NVML facts: driver floor, GPU count and arch, interconnect, GPU health.

Pure functions from NodeFacts (and what the recipe asks for) to Checks; nothing here touches NVML.
Node facts are also named as GPU Feature Discovery labels (`gfd_labels`), so a report from one node
reads the same as the labels a Kubernetes cluster puts on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml
from packaging.version import Version

from bwstack.nodes.preflight.driver import Support, judge_driver
from bwstack.nodes.preflight.nvml import GpuFacts, NodeFacts
from bwstack.recipes.archs import CC, Arch, arch_for_cc, cc_text
from bwstack.report import Check, Status
from bwstack.verify import compat
from bwstack.verify.fatbin import FatbinEntry

NCCL_PCIE_REMEDY = "export NCCL_P2P_DISABLE=1 NCCL_CUMEM_ENABLE=0 (or disable IOMMU/ACS for the GPUs' PCIe path)"

# Clock event reasons that mean the GPU is being held back by something wrong (heat, power, hardware).
# Idle, application clocks and the software power cap are normal on an idle GPU and are not reported.
_BAD_CLOCK_REASONS = {
    pynvml.nvmlClocksEventReasonHwSlowdown: "hardware slowdown",
    pynvml.nvmlClocksEventReasonHwThermalSlowdown: "hardware thermal slowdown",
    pynvml.nvmlClocksEventReasonSwThermalSlowdown: "software thermal slowdown",
    pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown: "power brake (external power supply signal)",
}


@dataclass(frozen=True)
class NodeRequirements:
    """What the recipe asks of the node."""

    cuda: Version | None  # the recipe's CUDA toolkit
    archs: tuple[Arch, ...]  # GPU archs the image can be built for (--arch narrows it to one)
    tp: int


def gfd_labels(facts: NodeFacts) -> dict[str, str]:
    """Node facts under GPU Feature Discovery's label names (values as GFD writes them: strings).

    As GFD does, product/memory/compute describe the node's GPUs as one; on a mixed node they describe GPU 0.
    """
    labels = {"nvidia.com/gpu.present": "true" if facts.gpus else "false", "nvidia.com/gpu.count": str(len(facts.gpus))}
    driver = facts.driver_version.split(".")
    for key, part in zip(("major", "minor", "rev"), driver, strict=False):
        labels[f"nvidia.com/cuda.driver.{key}"] = part
    major, rest = divmod(facts.cuda_driver_version, 1000)
    labels["nvidia.com/cuda.runtime.major"] = str(major)
    labels["nvidia.com/cuda.runtime.minor"] = str(rest // 10)
    if facts.gpus:
        first = facts.gpus[0]
        labels["nvidia.com/gpu.product"] = "-".join(first.name.split())
        labels["nvidia.com/gpu.memory"] = str(first.memory_total // (1024 * 1024))
        labels["nvidia.com/gpu.compute.major"] = str(first.cc[0])
        labels["nvidia.com/gpu.compute.minor"] = str(first.cc[1])
    return labels


def gpu_summary(gpu: GpuFacts) -> dict[str, Any]:
    """One GPU as report.data["gpus"] holds it: the NVML facts plus the arch table's name for its CC."""
    arch = arch_for_cc(gpu.cc)
    return {**gpu.to_dict(), "arch": arch.name if arch else None}


def runs_on(arch: Arch, cc: CC) -> bool:
    """Does the SASS bwstack builds for `arch` (its build_target, e.g. sm_120a) run on a GPU of CC `cc`?

    Answered by verify.compat, NVIDIA's rules as one table, for the cubin the recipe's build produces.
    """
    suffix = arch.build_target.removeprefix(f"sm_{arch.number}")
    built = FatbinEntry(
        kind="sass",
        number=arch.number,
        suffix=suffix,  # type: ignore[arg-type]
        codec="none",
        payload_size=0,
        compressed_size=0,
        uncompressed_size=0,
        offset=0,
        isa_version="",
    )
    return compat.runs_on(built, cc) is not compat.Runs.NONE


def check_driver(facts: NodeFacts, want: NodeRequirements) -> Check:
    evidence: dict[str, Any] = {
        "driver": facts.driver_version,
        "cuda_driver": facts.cuda_driver,
        "nvidia.com/cuda.driver.major": facts.driver_version.split(".")[0],
    }
    if want.cuda is None:
        return Check("driver", Status.PASS, f"driver {facts.driver_version} (CUDA {facts.cuda_driver})", evidence)
    verdict = judge_driver(facts.driver_version, want.cuda, driver_cuda=facts.cuda_driver)
    evidence |= {
        "recipe_cuda": str(want.cuda),
        "floor": str(verdict.floor) if verdict.floor else None,
        "minor_compat_floor": str(verdict.compat_floor) if verdict.compat_floor else None,
        "support": str(verdict.support),
    }
    install = f"install NVIDIA driver >= {verdict.floor or verdict.compat_floor}"
    status = {
        Support.FULL: Status.PASS,
        Support.MINOR_COMPAT: Status.WARN,
        Support.UNKNOWN: Status.WARN,
        Support.UNSUPPORTED: Status.FAIL,
    }[verdict.support]
    remedy = None if status is Status.PASS else install if verdict.floor or verdict.compat_floor else None
    return Check("driver", status, verdict.reason, evidence, remedy)


def check_count(facts: NodeFacts, want: NodeRequirements) -> Check:
    count = len(facts.gpus)
    evidence = {"nvidia.com/gpu.count": count, "tp": want.tp}
    if count >= want.tp:
        return Check("gpu.count", Status.PASS, f"{count} GPU(s) for tp {want.tp}", evidence)
    return Check(
        "gpu.count",
        Status.FAIL,
        f"{count} GPU(s) visible, the recipe serves with tp {want.tp}",
        evidence,
        remedy=f"run on a node with >= {want.tp} GPUs, check CUDA_VISIBLE_DEVICES / the container's GPU request, "
        "or lower --tp",
    )


def check_arch(facts: NodeFacts, want: NodeRequirements) -> Check:
    per_gpu = [
        {
            "index": g.index,
            "name": g.name,
            "nvidia.com/gpu.compute.major": g.cc[0],
            "nvidia.com/gpu.compute.minor": g.cc[1],
            "arch": (a.name if (a := arch_for_cc(g.cc)) else None),
        }
        for g in facts.gpus
    ]
    targets = [a.name for a in want.archs]
    evidence: dict[str, Any] = {"gpus": per_gpu, "recipe_archs": targets}
    if not facts.gpus:
        return Check("gpu.arch", Status.FAIL, "NVML lists no GPUs", evidence, remedy="check `nvidia-smi`")
    kinds = Counter((g.name, g.cc) for g in facts.gpus)
    mixed = len(kinds) > 1
    evidence["mixed"] = mixed
    if not want.archs:
        status = Status.WARN if mixed else Status.PASS
        return Check("gpu.arch", status, _describe(kinds) + ("; mixed node" if mixed else ""), evidence)
    misfits = [g for g in facts.gpus if not any(runs_on(a, g.cc) for a in want.archs)]
    if misfits:
        unknown = [g for g in misfits if arch_for_cc(g.cc) is None]
        names = ", ".join(f"GPU {g.index} {g.name} (CC {cc_text(g.cc)})" for g in misfits)
        why = f"{names}: not covered by {' / '.join(a.build_target for a in want.archs)}"
        if unknown:
            why += "; bwstack's arch table has no row for that CC"
        remedy = (
            "build the image for the GPUs present (--arch "
            + ", ".join(sorted({a.name for g in misfits if (a := arch_for_cc(g.cc))}))
            + ")"
            if len(unknown) < len(misfits)
            else "add the GPU's arch to recipes/archs.py"
        )
        if mixed:
            remedy += ", or hide the other GPUs with CUDA_VISIBLE_DEVICES"
        return Check("gpu.arch", Status.FAIL, ("mixed node: " if mixed else "") + why, evidence, remedy)
    if mixed:
        # Every GPU runs the code, but tensor parallelism runs at the pace (and memory) of the smallest one.
        return Check(
            "gpu.arch",
            Status.WARN,
            f"mixed node: {_describe(kinds)}; every GPU runs {'/'.join(targets)}, but tensor parallelism is "
            "bound by the slowest and smallest GPU",
            evidence,
            remedy="serve from one kind of GPU (CUDA_VISIBLE_DEVICES)",
        )
    return Check("gpu.arch", Status.PASS, f"{_describe(kinds)}; runs {'/'.join(targets)}", evidence)


def _describe(kinds: Counter[tuple[str, CC]]) -> str:
    return ", ".join(f"{n}x {name} (CC {cc_text(cc)})" for (name, cc), n in kinds.items())


def interconnect_kind(facts: NodeFacts) -> str | None:
    """ "nvlink" when every GPU pair has NVLink peer-to-peer, "pcie" when none does, "mixed" otherwise."""
    if len(facts.gpus) < 2:
        return None
    nvlink = [link.p2p_nvlink == "OK" for link in facts.links]
    if all(nvlink):
        return "nvlink"
    return "mixed" if any(nvlink) else "pcie"


def check_interconnect(facts: NodeFacts, want: NodeRequirements, *, iommu_enabled: bool | None) -> Check:
    kind = interconnect_kind(facts)
    levels = Counter(link.topology for link in facts.links if link.topology)
    evidence: dict[str, Any] = {
        "interconnect": kind,
        "nvlink_active": {g.index: g.nvlink_active for g in facts.gpus},
        "pcie_topology": dict(levels),
        "p2p": dict(Counter(link.p2p_pcie for link in facts.links if link.p2p_pcie)),
        "iommu_enabled": iommu_enabled,
        "tp": want.tp,
        "links": [link.to_dict() for link in facts.links],
    }
    if kind is None or want.tp < 2:
        return Check("interconnect", Status.SKIP, "fewer than 2 GPUs in use: no GPU-to-GPU traffic", evidence)
    if kind == "nvlink":
        return Check("interconnect", Status.PASS, f"NVLink between all {len(facts.gpus)} GPUs", evidence)
    topo = ", ".join(f"{n} pairs {level}" for level, n in levels.most_common())
    notes = [f"{'PCIe only' if kind == 'pcie' else 'NVLink between some GPUs only'} ({topo or 'topology unknown'})"]
    if want.tp > 2:
        notes.append(f"custom all-reduce is off above 2 PCIe GPUs, so tp {want.tp} all-reduce goes through NCCL")
    if iommu_enabled:
        notes.append(
            "IOMMU is enabled: NCCL peer-to-peer over PCIe can hang the first collective (no error, idle GPUs)"
        )
        return Check("interconnect", Status.WARN, "; ".join(notes), evidence, remedy=NCCL_PCIE_REMEDY)
    if iommu_enabled is None:
        notes.append("IOMMU state unknown; if it is on, NCCL peer-to-peer may hang (NCCL_P2P_DISABLE=1)")
    return Check("interconnect", Status.PASS, "; ".join(notes), evidence)


def check_persistence(facts: NodeFacts) -> Check:
    off = [g.index for g in facts.gpus if g.persistence is False]
    evidence = {"persistence": {g.index: g.persistence for g in facts.gpus}}
    if off:
        return Check(
            "gpu.persistence",
            Status.WARN,
            f"persistence mode off on GPU {_list(off)}: each start re-initialises the GPUs (slow, can race)",
            evidence,
            remedy="enable nvidia-persistenced (or nvidia-smi -pm 1)",
        )
    return Check("gpu.persistence", Status.PASS, "persistence mode on (or not applicable)", evidence)


def check_ecc(facts: NodeFacts) -> Check:
    bad = [g for g in facts.gpus if g.ecc_uncorrected_volatile]
    evidence = {
        "uncorrected_volatile": {g.index: g.ecc_uncorrected_volatile for g in facts.gpus},
        "uncorrected_aggregate": {g.index: g.ecc_uncorrected_aggregate for g in facts.gpus},
        "unsupported_on": [g.index for g in facts.gpus if "ecc" in g.unsupported],
    }
    if bad:
        detail = ", ".join(f"GPU {g.index}: {g.ecc_uncorrected_volatile}" for g in bad)
        return Check(
            "gpu.ecc",
            Status.FAIL,
            f"uncorrected ECC errors since the driver loaded ({detail})",
            evidence,
            remedy="drain the node, reset the GPU (nvidia-smi -r) and check dmesg for Xid 48/63/64",
        )
    if all("ecc" in g.unsupported for g in facts.gpus):
        return Check("gpu.ecc", Status.PASS, "ECC not reported by these GPUs (ECC off or not supported)", evidence)
    return Check("gpu.ecc", Status.PASS, "no uncorrected ECC errors since the driver loaded", evidence)


# Memory-repair states NVML reports per GPU, each a problem when any GPU is in it; the first is the gravest.
_REPAIR_PROBLEMS: tuple[tuple[Callable[[GpuFacts], bool], str], ...] = (
    (
        lambda g: bool(g.remapped_rows and g.remapped_rows.failed),
        "row remapping failed on GPU {gpus} (the GPU needs service)",
    ),
    (lambda g: bool(g.remapped_rows and g.remapped_rows.pending), "row remaps pending on GPU {gpus}"),
    (lambda g: bool(g.retired_pages_pending), "page retirement pending on GPU {gpus}"),
)
_REPAIR_REMEDY = "reset the GPU (nvidia-smi -r) or reboot to apply pending remaps/retirements"


def check_memory_repair(facts: NodeFacts) -> Check:
    evidence = {
        "remapped_rows": {g.index: vars(g.remapped_rows) if g.remapped_rows else None for g in facts.gpus},
        "retired_pages": {g.index: g.retired_pages for g in facts.gpus},
        "retired_pages_pending": {g.index: g.retired_pages_pending for g in facts.gpus},
    }
    found = [(text, [g.index for g in facts.gpus if state(g)]) for state, text in _REPAIR_PROBLEMS]
    problems = [text.format(gpus=_list(gpus)) for text, gpus in found if gpus]
    if not problems:
        return Check("gpu.memory-repair", Status.PASS, "no pending row remaps or page retirements", evidence)
    failed = bool(found[0][1])
    remedy = ("take the GPU out of service (RMA); " if failed else "") + _REPAIR_REMEDY
    return Check("gpu.memory-repair", Status.FAIL, "; ".join(problems), evidence, remedy)


def check_clocks(facts: NodeFacts) -> Check:
    findings = []
    for g in facts.gpus:
        reasons = [text for bit, text in _BAD_CLOCK_REASONS.items() if (g.clocks_event_reasons or 0) & bit]
        if reasons:
            findings.append(f"GPU {g.index}: {', '.join(reasons)}")
    evidence = {"clocks_event_reasons": {g.index: g.clocks_event_reasons for g in facts.gpus}}
    if findings:
        return Check(
            "gpu.clocks",
            Status.WARN,
            "clocks held back: " + "; ".join(findings),
            evidence,
            remedy="check cooling and power (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER)",
        )
    return Check("gpu.clocks", Status.PASS, "no thermal, power-brake or hardware slowdown", evidence)


def check_read_errors(facts: NodeFacts) -> Check | None:
    errors = {g.index: g.errors for g in facts.gpus if g.errors}
    if not errors:
        return None
    detail = "; ".join(f"GPU {i}: " + ", ".join(f"{k} ({v})" for k, v in e.items()) for i, e in errors.items())
    return Check(
        "gpu.nvml",
        Status.WARN,
        f"NVML could not read some facts: {detail}",
        {"errors": errors},
        remedy="check `nvidia-smi -q` and dmesg for Xid errors",
    )


def node_checks(facts: NodeFacts, want: NodeRequirements, *, iommu_enabled: bool | None) -> list[Check]:
    checks = [
        check_driver(facts, want),
        check_count(facts, want),
        check_arch(facts, want),
        check_interconnect(facts, want, iommu_enabled=iommu_enabled),
        check_persistence(facts),
        check_ecc(facts),
        check_memory_repair(facts),
        check_clocks(facts),
    ]
    read_errors = check_read_errors(facts)
    return checks + ([read_errors] if read_errors else [])


def _list(indexes: list[int]) -> str:
    return ", ".join(str(i) for i in indexes)
