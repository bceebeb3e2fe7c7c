"""The facts the advisor reads, as data: the node, the model, the image. Unknown is None, never a guess.

Each comes from a recorded report (preflight JSON, its model summary) or is gathered by the task layer;
`Facts.named()` flattens them into the mapping the rule table (recipes/serving_rules.py) reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bwstack.errors import BwstackError
from bwstack.recipes.archs import CC

# Model families whose attention is multi-head latent attention (MLA) and whose FFN is a MoE.
MLA_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "kimi_k25", "kimi_vl"})
MLA_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "KimiK25ForConditionalGeneration",
        "KimiVLForConditionalGeneration",
    }
)
_MOE_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
TRITON_WNA16_GROUPS = (32, 128)  # what SGLang's Triton WNA16 MoE accepts (symmetric, no actorder)


class AdviseError(BwstackError):
    """Facts the advisor was given that it cannot read (a malformed preflight report, a bad --arch)."""


@dataclass(frozen=True)
class NodeFacts:
    cc: CC | None = None
    gpu_count: int | None = None
    gpu_memory: int | None = None  # bytes of the smallest GPU
    interconnect: str | None = None  # nvlink, pcie, mixed, or single (one GPU)
    iommu: bool | None = None
    acs: bool | None = None  # preflight does not read ACS yet: unknown unless a report says
    shm_bytes: int | None = None
    source: str = "none"

    @classmethod
    def from_preflight(cls, report: Mapping[str, Any], *, source: str = "preflight") -> NodeFacts:
        """The node facts of a `invoke preflight --json` report."""
        gpus = report.get("gpus")
        host = report.get("host") or {}
        if not isinstance(gpus, list) or not isinstance(host, dict):
            raise AdviseError(f"{source}: not a preflight report (no gpus list / host table)")
        try:
            ccs = {(int(g["cc"][0]), int(g["cc"][1])) for g in gpus}
            memory = [int(g["memory_bytes"]) for g in gpus if g.get("memory_bytes") is not None]
        except (KeyError, TypeError, ValueError, IndexError):
            raise AdviseError(f"{source}: a GPU entry lacks cc [major, minor] or memory_bytes") from None
        interconnect = report.get("interconnect")
        if len(gpus) == 1:
            interconnect = "single"
        return cls(
            cc=next(iter(ccs)) if len(ccs) == 1 else None,  # a mixed node has no one answer
            gpu_count=len(gpus) or None,
            gpu_memory=min(memory) if memory else None,
            interconnect=interconnect if isinstance(interconnect, str) else None,
            iommu=_bool(host.get("iommu_enabled")),
            acs=_bool(host.get("acs_enabled")),
            shm_bytes=host.get("shm_bytes") if isinstance(host.get("shm_bytes"), int) else None,
            source=source,
        )


@dataclass(frozen=True)
class ModelFacts:
    architecture: str | None = None
    model_type: str | None = None
    mla: bool | None = None
    int4_moe: bool | None = None
    int4_triton_ok: bool | None = None
    weight_bytes: int | None = None
    path: str | None = None

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> ModelFacts:
        """From preflight's model summary (report["model"]) and, when at hand, the model's config.json."""
        architecture = summary.get("architecture")
        model_type = summary.get("model_type")
        text = (config or {}).get("text_config") if isinstance((config or {}).get("text_config"), dict) else {}
        types = {model_type, text.get("model_type")} if config else {model_type}
        archs = set((config or {}).get("architectures") or []) | set(text.get("architectures") or []) | {architecture}
        known = bool(types & MLA_MODEL_TYPES or archs & MLA_ARCHITECTURES)
        if config is not None:
            mla: bool | None = known or any("kv_lora_rank" in c for c in (config, text))
            moe: bool | None = known or any(k in c for c in (config, text) for k in _MOE_KEYS)
        else:
            mla = moe = True if known else None
        quant = summary.get("quantization")
        weights = _weights(quant, config)
        int4 = None if quant is None and "quantization" not in summary else _is_int4(quant, weights)
        int4_moe = False if int4 is False else (int4 and moe) if moe is not None else None
        weight_bytes = summary.get("weight_bytes")
        return cls(
            architecture=architecture,
            model_type=model_type,
            mla=mla,
            int4_moe=int4_moe,
            int4_triton_ok=_triton_ok(weights) if int4_moe else None,
            weight_bytes=weight_bytes if isinstance(weight_bytes, int) and weight_bytes > 0 else None,
            path=summary.get("path"),
        )


def _weights(quant: Any, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The first weight scheme: from config.json when given (it carries actorder), else the summary's."""
    if config:
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        raw = config.get("quantization_config") or text.get("quantization_config") or {}
        for group in (raw.get("config_groups") or {}).values():
            if isinstance(group, dict) and isinstance(group.get("weights"), dict):
                return {"actorder": None, **group["weights"]}  # compressed-tensors' default: no actorder
    if isinstance(quant, dict) and quant.get("weights"):
        first = quant["weights"][0]
        return first if isinstance(first, dict) else {}
    return {}


def _is_int4(quant: Any, weights: Mapping[str, Any]) -> bool:
    if not isinstance(quant, dict):
        return False
    return (
        quant.get("quant_method") == "compressed-tensors"
        and weights.get("type") == "int"
        and weights.get("num_bits") in (4, "4")
    )


def _triton_ok(weights: Mapping[str, Any]) -> bool | None:
    if "actorder" not in weights:
        return None  # the summary does not carry it; config.json does
    return (
        weights.get("symmetric") is True
        and weights.get("strategy") == "group"
        and weights.get("group_size") in TRITON_WNA16_GROUPS
        and not weights.get("actorder")
    )


@dataclass(frozen=True)
class ImageFacts:
    flashinfer_runs: bool | None = None
    triton_ptxas_knows: bool | None = None
    triton_ptxas_env: str | None = None
    cuda_ptxas: str | None = None
    cuda_ptxas_knows: bool | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Facts:
    node: NodeFacts
    model: ModelFacts
    image: ImageFacts
    tp: int
    speculative: Mapping[str, Any] | None  # None: the recipe schema has no [speculative] table

    def named(self) -> dict[str, Any]:
        """The flat mapping the rules read; a None value is an unknown fact."""
        n, m, i = self.node, self.model, self.image
        return {
            "cc": n.cc,
            "gpu_count": n.gpu_count,
            "gpu_memory": n.gpu_memory,
            "interconnect": "single" if self.tp < 2 and n.interconnect is None else n.interconnect,
            "iommu": n.iommu,
            "acs": n.acs,
            "shm_bytes": n.shm_bytes,
            "tp": self.tp,
            "mla": m.mla,
            "int4_moe": m.int4_moe,
            "int4_triton_ok": m.int4_triton_ok,
            "weight_bytes": m.weight_bytes,
            "flashinfer_runs": i.flashinfer_runs,
            "triton_ptxas_knows": i.triton_ptxas_knows,
            "triton_ptxas_env": i.triton_ptxas_env,
            "cuda_ptxas": i.cuda_ptxas,
            "cuda_ptxas_knows": i.cuda_ptxas_knows,
            "speculative": self.speculative,
        }


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A small JSON object from a file, or AdviseError naming the file."""
    try:
        if path.stat().st_size > 64 << 20:
            raise AdviseError(f"{what} {path}: larger than any report bwstack writes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AdviseError(f"{what} {path}: file not found") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise AdviseError(f"{what} {path}: not readable JSON: {' '.join(str(error).split())[:200]}") from None
    if not isinstance(data, dict):
        raise AdviseError(f"{what} {path}: not a JSON object")
    return data
