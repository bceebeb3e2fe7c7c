"""Known SGLang-on-Blackwell failure lines, each with the advisor rule (recipes/serving_rules.py) that avoids it.

smoke's crash diagnosis reads this table beside its own generic signatures, so a crash or hang whose log
shows one of these lines names the rule, and `invoke advise` gives the flags that rule would have set.
docs/advise.md cites the upstream reports each line comes from.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownCrash:
    name: str
    pattern: str  # a regular expression searched in each log line
    meaning: str
    avoided_by: str  # a rule name in recipes/serving_rules.py


KNOWN_CRASHES: tuple[KnownCrash, ...] = (
    KnownCrash(
        "ptxas-unknown-arch",
        r"ptxas fatal\s*:\s*Value 'sm_\d+[af]?' is not defined for option 'gpu-name'",
        "the ptxas Triton runs does not know this GPU's arch, so no Triton kernel compiles",
        "triton-ptxas",
    ),
    KnownCrash(
        "trtllm-attention-arch",
        r"TllmGenFmhaRunner|trtllm.*Unsupported architecture|Unsupported architecture.*(?:trtllm|fmha)",
        "a TensorRT-LLM-generated attention kernel (SM100-only) was chosen on another arch",
        "attention-backend",
    ),
    KnownCrash(
        "fused-moe-no-tactics",
        r"No valid tactics available for fused moe op",
        "the fused MoE autotuner found no kernel for this arch and quantisation",
        "moe-runner",
    ),
    KnownCrash(
        "cuda-graph-capture",
        r"Capture cuda graph failed|CUDA graph capture failed",
        "CUDA graph capture ran out of memory or hit a kernel that cannot run on this GPU",
        "memory",
    ),
    KnownCrash(
        "nccl-watchdog",
        r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*(?:timeout|Timeout)|NCCL watchdog",
        "a NCCL collective never completed: peer-to-peer over PCIe with IOMMU/ACS, or a rank died",
        "nccl-pcie",
    ),
    KnownCrash(
        "deepgemm-arch",
        r"DeepGEMM.*(?:[Uu]nsupported|not supported).*(?:arch|sm_?12)|deep_gemm.*sm_?120",
        "DeepGEMM's JIT ran on an arch it has no kernels for",
        "deepgemm-off",
    ),
)
