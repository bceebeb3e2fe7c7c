"""Recorded facts for the advisor's tests: preflight reports of the two worked-example nodes (made by the real
preflight over the fake NVML), a Kimi-K2.5 INT4 model summary and config, and image facts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bwstack.advise import Facts, ImageFacts, ModelFacts, NodeFacts
from bwstack.nodes.preflight import request_for_recipe, run_preflight
from bwstack.nodes.preflight.host import HostThresholds
from tests.fakes import fake_pynvml as fakes
from tests.nodes.test_preflight_node import fake_sys

KIMI_WEIGHT_BYTES = 594_000_000_000  # Kimi-K2.5 INT4: about 594 GB of safetensors
LENIENT = HostThresholds(shm_fail=0, shm_warn=0, disk_warn=0, ram_warn=0)


def b200_nvlink() -> fakes.FakeNvml:
    b200 = dataclasses.replace(fakes.H200, name="NVIDIA B200", cc=(10, 0), memory_mib=183_359)
    return fakes.FakeNvml(gpus=[dataclasses.replace(b200, numa=i // 4) for i in range(8)])


def preflight_report(nvml: fakes.FakeNvml, tmp_path: Path, *, iommu: bool) -> dict[str, Any]:
    """`invoke preflight --json` of a node, as a recorded report."""
    request = request_for_recipe("sglang", docker=False)
    report = run_preflight(request, nvml=nvml, host_paths=fake_sys(tmp_path, iommu=iommu), thresholds=LENIENT)
    return report.to_dict()


def kimi_config() -> dict[str, Any]:
    """The fields of Kimi-K2.5's config.json the advisor reads (text_config carries the language model)."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "kimi_k2",
            "kv_lora_rank": 512,
            "n_routed_experts": 384,
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {"group_0": {"weights": {**weights, "actorder": None}}},
            },
        },
    }


def kimi_summary() -> dict[str, Any]:
    """preflight's model summary of the Kimi-K2.5 INT4 checkpoint."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    return {
        "path": "/models/Kimi-K2.5",
        "architecture": "KimiK25ForConditionalGeneration",
        "model_type": "kimi_k25",
        "quantization": {"quant_method": "compressed-tensors", "format": "pack-quantized", "weights": [weights]},
        "weight_bytes": KIMI_WEIGHT_BYTES,
    }


def kimi() -> ModelFacts:
    return ModelFacts.from_summary(kimi_summary(), kimi_config())


def dense_bf16() -> ModelFacts:
    summary = {"architecture": "LlamaForCausalLM", "model_type": "llama", "quantization": None, "weight_bytes": 16e9}
    return ModelFacts.from_summary({**summary, "weight_bytes": 16_000_000_000}, {"architectures": ["LlamaForCausalLM"]})


def image(**known: Any) -> ImageFacts:
    base = {"flashinfer_runs": None, "triton_ptxas_knows": True, "triton_ptxas_env": "TRITON_PTXAS_BLACKWELL_PATH"}
    return ImageFacts(**{**base, "cuda_ptxas": "/usr/local/cuda/bin/ptxas", "cuda_ptxas_knows": True, **known})


def facts(node: NodeFacts, model: ModelFacts | None = None, img: ImageFacts | None = None, **kw: Any) -> Facts:
    return Facts(node, model or kimi(), img or image(), tp=kw.pop("tp", 8), speculative=kw.pop("speculative", {}))
