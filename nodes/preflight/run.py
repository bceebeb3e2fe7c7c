"""Node preflight: NVML, host and (optionally) model checks in one Report.

`run_preflight` never raises for what it finds on the node: a missing driver is a failed `driver`
check, a truncated shard a failed `model.shards` check. It raises BwstackError only for bad input
(an unknown recipe or arch, tp < 1, a model path that is not a folder).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml
from packaging.version import Version

from bwstack.errors import PreflightError
from bwstack.inputs import check_model_folder
from bwstack.nodes.preflight.host import (
    DockerInfo,
    HostPaths,
    HostThresholds,
    docker_engine_info,
    host_checks,
    read_host,
)
from bwstack.nodes.preflight.model import DEFAULT_KV_HEADROOM, check_model
from bwstack.nodes.preflight.node import NodeRequirements, gfd_labels, gpu_summary, interconnect_kind, node_checks
from bwstack.nodes.preflight.nvml import Nvml, NvmlUnavailable, read_node
from bwstack.recipes.archs import CC, Arch, parse_arch_list
from bwstack.report import Check, Report, Status


@dataclass(frozen=True)
class PreflightRequest:
    """What the node is checked against. Build one from a recipe with `request_for_recipe`."""

    recipe: str | None = None
    cuda: Version | None = None  # the recipe's CUDA toolkit: picks the driver floor
    archs: tuple[Arch, ...] = ()  # GPU archs the image can target; empty: any GPU is fine
    tp: int = 1
    model: Path | None = None
    kv_headroom: float = DEFAULT_KV_HEADROOM
    docker: bool = True  # check the Docker engine provision will use (--no-docker skips it)
    gpus: bool = True  # check GPUs through NVML (off only for `provision --demo`, which needs none)

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise PreflightError(f"tp must be >= 1, got {self.tp}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "cuda": str(self.cuda) if self.cuda else None,
            "archs": [a.name for a in self.archs],
            "tp": self.tp,
            "model": str(self.model) if self.model else None,
            "kv_headroom": self.kv_headroom,
            "docker": self.docker,
            "gpus": self.gpus,
        }


def request_for_recipe(
    recipe: str | None,
    *,
    archs: Sequence[str | Arch] = (),
    tp: int | None = None,
    model: str | Path | None = None,
    docker: bool = True,
    kv_headroom: float = DEFAULT_KV_HEADROOM,
) -> PreflightRequest:
    """Fill a request from a recipe (CUDA version, archs, serving tp); explicit arguments win."""
    if recipe:
        from bwstack.recipes import load_recipe

        loaded = load_recipe(recipe)
        cuda: Version | None = loaded.cuda_version
        targets = tuple(loaded.resolve_archs(archs)) if archs else tuple(loaded.supported_archs)
        tp = tp or loaded.serve.tp
    else:
        cuda = None
        targets = tuple(parse_arch_list(archs)) if archs else ()
    return PreflightRequest(
        recipe=recipe or None,
        cuda=cuda,
        archs=targets,
        tp=tp or 1,
        model=Path(model) if model else None,
        docker=docker,
        kv_headroom=kv_headroom,
    )


def node_ccs(report: Report) -> list[CC]:
    """The compute capabilities NVML reported, one per GPU (empty when NVML was unavailable)."""
    return [tuple(gpu["cc"]) for gpu in report.data.get("gpus", [])]  # type: ignore[misc]


def run_preflight(
    request: PreflightRequest,
    *,
    nvml: Nvml | None = None,
    host_paths: HostPaths | None = None,
    docker_info: DockerInfo = docker_engine_info,
    thresholds: HostThresholds | None = None,
) -> Report:
    """Check this node (and the model folder, if the request names one) against the request."""
    if request.model is not None:
        check_model_folder(request.model, error=PreflightError)
    want = NodeRequirements(cuda=request.cuda, archs=request.archs, tp=request.tp)
    subject = socket.gethostname() + (f" for recipe {request.recipe}" if request.recipe else "")
    report = Report(kind="preflight", subject=subject)
    report.data["request"] = request.to_dict()

    host = read_host(
        host_paths or HostPaths(),
        disk_path=request.model or Path.cwd(),
        docker_info=docker_info if request.docker else None,
    )
    facts = None
    if not request.gpus:
        report.add(Check("gpu", Status.SKIP, "GPU checks not run: this run needs no GPU (demo)", {}))
    else:
        try:
            facts = read_node(nvml if nvml is not None else pynvml)  # type: ignore[arg-type]
        except NvmlUnavailable as error:
            facts = None
            report.add(
                Check(
                    "driver",
                    Status.FAIL,
                    error.message,
                    {"error": error.error, "library": "libnvidia-ml.so.1"},
                    remedy=error.remedy,
                )
            )
            report.add(Check("gpu", Status.SKIP, "GPU checks not run: no NVML", {}))
    if facts is not None:
        for check in node_checks(facts, want, iommu_enabled=host.iommu_enabled):
            report.add(check)
    for check in host_checks(host, thresholds or HostThresholds(), need_gpus=request.gpus):
        report.add(check)

    report.data["labels"] = gfd_labels(facts) if facts else {}
    report.data["driver"] = {"version": facts.driver_version, "cuda": facts.cuda_driver} if facts else None
    report.data["gpus"] = [gpu_summary(g) for g in facts.gpus] if facts else []
    report.data["interconnect"] = interconnect_kind(facts) if facts else None
    report.data["host"] = host.to_dict()

    if request.model is not None:
        memory = min((g.memory_total for g in facts.gpus), default=None) if facts else None
        checks, summary = check_model(
            request.model, tp=request.tp, gpu_memory_bytes=memory, kv_headroom=request.kv_headroom
        )
        for check in checks:
            report.add(check)
        report.data["model"] = summary.to_dict()
    return report
