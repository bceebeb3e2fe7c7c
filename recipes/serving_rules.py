"""How to launch SGLang on a given node, model and image: the advisor's rules as one table.

Each rule reads named facts (a flat mapping the advise stage fills from preflight, the model's headers and
verify), and when it fires it sets server options and environment variables. A rule whose facts are not
all known is "not evaluated", never guessed. Options are named by a key, not a spelling: `OPTIONS` maps
each key to the flag of each SGLang version (options get renamed), and a test checks every spelling the
rules can emit against the real released SGLang's option definitions. docs/advise.md cites the sources.

The table lives here, below advise and smoke, because smoke's crash signatures name the rule that avoids
each one (recipes/crash_signatures.py).

Facts (absent or None means unknown):
  cc (major, minor) | gpu_count | gpu_memory (bytes, smallest GPU) | interconnect nvlink/pcie/mixed/single |
  iommu, acs (bools) | shm_bytes | tp | mla (model uses multi-head latent attention) | int4_moe (MoE with
  compressed-tensors INT4 weights) | int4_triton_ok (symmetric group-32/128 INT4, what SGLang's Triton
  WNA16 MoE accepts) | weight_bytes | flashinfer_runs (the image's flashinfer binaries hold code for cc) |
  triton_ptxas_knows (the ptxas Triton uses for cc knows its arch) | triton_ptxas_env (the variable that
  Triton reads for that ptxas) | cuda_ptxas (the image's CUDA ptxas path) | cuda_ptxas_knows | speculative
  (the recipe's [speculative] table as a mapping; {} when the recipe has none).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

Facts = Mapping[str, Any]
GiB = 1 << 30
# The SGLang releases whose options and choices the rules are checked against (tests/advise): older ones
# lack choices the rules emit (0.5.10 has no `marlin` MoE runner), so advice for them is refused.
SUPPORTED_SGLANG = SpecifierSet(">=0.5.15")

# Option key -> (SGLang versions, flag) in order; the first row whose versions match is the spelling.
OPTIONS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "attention-backend": (("", "--attention-backend"),),
    "moe-runner-backend": (("", "--moe-runner-backend"),),
    "disable-custom-all-reduce": (("", "--disable-custom-all-reduce"),),
    "mem-fraction-static": (("", "--mem-fraction-static"),),
    # 0.5.15 split it per phase (-decode/-prefill); 0.5.20 removed the old name, now an ambiguous prefix (exit 2).
    "cuda-graph-max-bs": ((">=0.5.15", "--cuda-graph-max-bs-decode"), ("<0.5.15", "--cuda-graph-max-bs")),
    "speculative-algorithm": (("", "--speculative-algorithm"),),
    "speculative-draft-model-path": (("", "--speculative-draft-model-path"),),
    "speculative-num-steps": (("", "--speculative-num-steps"),),
    "speculative-eagle-topk": (("", "--speculative-eagle-topk"),),
    "speculative-num-draft-tokens": (("", "--speculative-num-draft-tokens"),),
    "speculative-draft-attention-backend": (("", "--speculative-draft-attention-backend"),),
}


def option_flag(key: str, version: str) -> str:
    """The spelling of option `key` in SGLang `version`; KeyError for a key or version the table lacks."""
    for versions, flag in OPTIONS[key]:
        if Version(version) in SpecifierSet(versions):
            return flag
    raise KeyError(f"option {key!r} has no spelling for SGLang {version}")


@dataclass(frozen=True)
class Emit:
    """What a firing rule sets: options by key (value None for a switch) and environment variables."""

    args: tuple[tuple[str, str | None], ...] = ()
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ServingRule:
    name: str
    decides: str  # what the rule chooses, one line
    needs: tuple[str, ...]  # facts it reads; one unknown and it is not evaluated
    applies: Callable[[Facts], bool]
    emit: Callable[[Facts], Emit]
    why: Callable[[Facts], str]  # the facts that decided it, fired or not
    source: str
    refuse: Callable[[Facts], str | None] = field(default=lambda _f: None)  # a launch that cannot work
    more_needs: Callable[[Facts], tuple[str, ...]] = field(default=lambda _f: ())  # facts needed given the first
    better: str = ""  # a better remedy outside the launch command, when there is one


def _cc(f: Facts) -> str:
    return f"CC {f['cc'][0]}.{f['cc'][1]}"


def _blackwell_consumer(f: Facts) -> bool:
    return f["cc"][0] == 12


# --- attention backend -------------------------------------------------------------------------------


def _attention_choice(f: Facts) -> str:
    return "flashinfer" if f.get("flashinfer_runs") is True else "triton"


def _attention_why(f: Facts) -> str:
    if not (_blackwell_consumer(f) and f["mla"]):
        kind = "MLA" if f["mla"] else "no MLA"
        return f"{kind} model on {_cc(f)}: SGLang's default attention backend has kernels here"
    how = (
        "the image's flashinfer binaries hold code for it"
        if f.get("flashinfer_runs") is True
        else "flashinfer's kernels for it are not proven present in the image, so triton"
    )
    return f"MLA model on {_cc(f)}: trtllm_mla / trtllm-gen attention kernels exist only for SM100; {how}"


# --- MoE runner ---------------------------------------------------------------------------------------


def _moe_choice(f: Facts) -> str:
    return "triton" if f.get("int4_triton_ok") is True else "marlin"


def _moe_why(f: Facts) -> str:
    if not (_blackwell_consumer(f) and f["int4_moe"]):
        return f"{'INT4' if f['int4_moe'] else 'no INT4 compressed-tensors'} MoE on {_cc(f)}: the default runner fits"
    which = {
        True: "symmetric INT4 in groups of 32 or 128 without actorder, which SGLang's Triton WNA16 MoE accepts",
        False: "INT4 outside what the Triton WNA16 MoE accepts (symmetric, group 32/128, no actorder), so marlin",
        None: "INT4 whose actorder is not known (give --model for config.json), so marlin, which takes any",
    }[f.get("int4_triton_ok")]
    return f"compressed-tensors INT4 MoE on {_cc(f)}: a Blackwell default may pick an SM100-only fused MoE; {which}"


# --- Triton's ptxas -----------------------------------------------------------------------------------


def _gpu_name(f: Facts) -> str:
    """What Triton passes as ptxas --gpu-name: sm_XYa from CC 9.0 on (triton/backends/nvidia/compiler.py)."""
    number = f["cc"][0] * 10 + f["cc"][1]
    return f"sm_{number}{'a' if number >= 90 else ''}"


def _ptxas_why(f: Facts) -> str:
    arch = _gpu_name(f)
    if f["triton_ptxas_knows"]:
        return f"the ptxas Triton uses on {_cc(f)} knows {arch}"
    where = f.get("cuda_ptxas") or "the image's CUDA ptxas"
    return f"the ptxas bundled with Triton does not know {arch}; {where} does"


def _ptxas_emit(f: Facts) -> Emit:
    variable = f.get("triton_ptxas_env") or "TRITON_PTXAS_PATH"
    return Emit(env=((variable, f.get("cuda_ptxas") or "/usr/local/cuda/bin/ptxas"),))


def _ptxas_refuse(f: Facts) -> str | None:
    if not f["triton_ptxas_knows"] and f.get("cuda_ptxas_knows") is False:
        return (
            f"no ptxas in the image knows {_gpu_name(f)}: Triton cannot compile kernels for "
            f"{_cc(f)} (use an image with a newer CUDA toolkit or Triton)"
        )
    return None


# --- NCCL over PCIe -----------------------------------------------------------------------------------


def _pcie_p2p_risk(f: Facts) -> bool:
    return f["tp"] > 1 and f["interconnect"] in ("pcie", "mixed") and (f.get("iommu") or f.get("acs")) is True


def _pcie_more_needs(f: Facts) -> tuple[str, ...]:
    """PCIe traffic decides on IOMMU/ACS: one of them on is enough; to rule the risk out both must be known."""
    if f["tp"] < 2 or f["interconnect"] not in ("pcie", "mixed") or f.get("iommu") or f.get("acs"):
        return ()
    return ("iommu", "acs")


def _pcie_why(f: Facts) -> str:
    if f["tp"] < 2 or f["interconnect"] in ("single", None):
        return f"tp {f['tp']}: no GPU-to-GPU traffic"
    if f["interconnect"] == "nvlink":
        return f"NVLink between all GPUs: peer-to-peer does not cross the PCIe root (tp {f['tp']})"
    on = [name for name in ("iommu", "acs") if f.get(name)]
    if on:
        return (
            f"{f['interconnect']} interconnect with {' and '.join(n.upper() for n in on)} on: NCCL peer-to-peer "
            f"and custom all-reduce over PCIe can hang the first collective (tp {f['tp']})"
        )
    return f"{f['interconnect']} interconnect with IOMMU and ACS off: peer-to-peer over PCIe works"


# --- memory -------------------------------------------------------------------------------------------

_RESERVE_FLOOR = 8 * GiB  # activations, CUDA graphs, NCCL buffers: SGLang keeps this outside the static pool
_RESERVE_SHARE = 0.10
_MIN_KV_SHARE = 0.05  # below this the server starts but serves almost no context
_GRAPH_BS = ((0.30, 256), (0.15, 128), (_MIN_KV_SHARE, 64))  # KV share of the GPU -> largest decode graph


def memory_plan(f: Facts) -> dict[str, Any]:
    """Per-GPU weights, the static fraction, the KV room left and the decode graph size it supports."""
    gpu = f["gpu_memory"]
    per_gpu = -(-f["weight_bytes"] // f["tp"])
    reserve = max(_RESERVE_FLOOR, _RESERVE_SHARE * gpu)
    fraction = min(0.90, math.floor((gpu - reserve) / gpu * 100) / 100)
    kv = gpu * fraction - per_gpu
    share = kv / gpu
    bs = next((size for floor, size in _GRAPH_BS if share >= floor), None)
    return {"per_gpu": per_gpu, "fraction": fraction, "kv_bytes": kv, "kv_share": share, "graph_bs": bs}


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _memory_why(f: Facts) -> str:
    p = memory_plan(f)
    return (
        f"weights {_gb(p['per_gpu'])} per GPU at tp {f['tp']} on {_gb(f['gpu_memory'])} GPUs; "
        f"static pool {p['fraction']:.2f} leaves {_gb(max(p['kv_bytes'], 0))} ({max(p['kv_share'], 0):.0%}) "
        f"for KV cache"
    )


def _memory_emit(f: Facts) -> Emit:
    p = memory_plan(f)
    return Emit(args=(("mem-fraction-static", f"{p['fraction']:.2f}"), ("cuda-graph-max-bs", str(p["graph_bs"]))))


def _memory_refuse(f: Facts) -> str | None:
    p = memory_plan(f)
    if p["graph_bs"] is not None:
        return None
    return (
        f"the model does not fit: {_gb(p['per_gpu'])} of weights per GPU at tp {f['tp']} leave "
        f"{_gb(max(p['kv_bytes'], 0))} of a {_gb(f['gpu_memory'])} GPU for KV cache (need "
        f"{_MIN_KV_SHARE:.0%}); raise tp or use larger GPUs"
    )


def _shm_why(f: Facts) -> str:
    size = f"/dev/shm is {f['shm_bytes'] / 2**20:.0f} MiB for tp {f['tp']}"
    if f["tp"] < 2:
        return size + ": one rank, no NCCL between ranks"
    return size + (": too small for NCCL between ranks" if f["shm_bytes"] < GiB else ": room for NCCL between ranks")


# --- speculative decoding -----------------------------------------------------------------------------

_SPEC_KEYS = (
    ("algorithm", "speculative-algorithm"),
    ("draft_model", "speculative-draft-model-path"),
    ("num_steps", "speculative-num-steps"),
    ("eagle_topk", "speculative-eagle-topk"),
    ("num_draft_tokens", "speculative-num-draft-tokens"),
)


def _spec_on(f: Facts) -> bool:
    spec = f["speculative"] or {}
    return bool(spec) and spec.get("enabled", True) is not False


def _spec_emit(f: Facts) -> Emit:
    spec = f["speculative"]
    args = [(key, str(spec[name])) for name, key in _SPEC_KEYS if spec.get(name) not in (None, "")]
    if _blackwell_consumer(f):
        # The draft's attention runs the same kernels as the target's: the target's sm_12x-safe choice.
        args.append(("speculative-draft-attention-backend", _attention_choice(f)))
    return Emit(args=tuple(args))


def _spec_why(f: Facts) -> str:
    if not _spec_on(f):
        return "the recipe enables no speculative decoding"
    spec = f["speculative"]
    text = f"recipe's [speculative]: {spec.get('algorithm', '?')} with draft {spec.get('draft_model', '?')}"
    if _blackwell_consumer(f):
        text += f"; draft attention on {_cc(f)} uses {_attention_choice(f)}, not an SM100-only backend"
    return text


RULES: tuple[ServingRule, ...] = (
    ServingRule(
        name="attention-backend",
        decides="--attention-backend for MLA models on CC 12.x: triton, or flashinfer where the image has its kernels",
        needs=("cc", "mla"),
        applies=lambda f: _blackwell_consumer(f) and f["mla"],
        emit=lambda f: Emit(args=(("attention-backend", _attention_choice(f)),)),
        why=_attention_why,
        source="sglang#24633, sglang#9140 (TllmGenFmhaRunner: Unsupported architecture on sm_120)",
    ),
    ServingRule(
        name="deepgemm-off",
        decides="SGLANG_ENABLE_JIT_DEEPGEMM=0 on CC 12.x, where DeepGEMM has no build",
        needs=("cc",),
        applies=_blackwell_consumer,
        emit=lambda f: Emit(env=(("SGLANG_ENABLE_JIT_DEEPGEMM", "0"),)),
        why=lambda f: f"{_cc(f)}: DeepGEMM {'has no sm_12x build' if _blackwell_consumer(f) else 'supports it'}",
        source="DeepGEMM#236 (no sm_120 support); sglang/srt/environ.py SGLANG_ENABLE_JIT_DEEPGEMM",
    ),
    ServingRule(
        name="moe-runner",
        decides="--moe-runner-backend with sm_12x code for compressed-tensors INT4 MoE on CC 12.x",
        needs=("cc", "int4_moe"),
        applies=lambda f: _blackwell_consumer(f) and f["int4_moe"],
        emit=lambda f: Emit(args=(("moe-runner-backend", _moe_choice(f)),)),
        why=_moe_why,
        source="sglang#24692 (No valid tactics available for fused moe op); "
        "sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py WNA16 MoE scheme choice",
    ),
    ServingRule(
        name="triton-ptxas",
        decides="TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH to the image's CUDA ptxas when Triton's own "
        "lacks the GPU's arch",
        needs=("cc", "triton_ptxas_knows"),
        applies=lambda f: not f["triton_ptxas_knows"],
        emit=_ptxas_emit,
        why=_ptxas_why,
        refuse=_ptxas_refuse,
        source="triton#8539, sglang#15342 (ptxas fatal: Value 'sm_120' is not defined for option 'gpu-name'); "
        "triton/knobs.py TRITON_<TOOL>_PATH",
    ),
    ServingRule(
        name="nccl-pcie",
        decides="NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce on PCIe GPUs with IOMMU or ACS on",
        needs=("tp", "interconnect"),
        applies=_pcie_p2p_risk,
        more_needs=_pcie_more_needs,
        emit=lambda f: Emit(args=(("disable-custom-all-reduce", None),), env=(("NCCL_P2P_DISABLE", "1"),)),
        why=_pcie_why,
        source="nccl#2079, nccl#1999 (P2P over PCIe with IOMMU/ACS hangs); NCCL's NCCL_P2P_DISABLE",
        better="turn the host's IOMMU to passthrough (iommu=pt) or off and disable ACS on the GPUs' PCIe "
        "switches: peer-to-peer then works and is faster than the staged copies NCCL_P2P_DISABLE forces",
    ),
    ServingRule(
        name="memory",
        decides="--mem-fraction-static and the decode CUDA-graph batch size that fit the weights per GPU",
        needs=("weight_bytes", "gpu_memory", "tp"),
        applies=lambda f: True,
        emit=_memory_emit,
        why=_memory_why,
        refuse=_memory_refuse,
        source="SGLang server arguments (--mem-fraction-static, --cuda-graph-max-bs-decode); headroom rule in "
        "docs/advise.md",
    ),
    ServingRule(
        name="shm",
        decides="containers: host IPC or --shm-size 32g when /dev/shm is Docker's 64 MB default",
        needs=("tp", "shm_bytes"),
        applies=lambda f: f["tp"] > 1 and f["shm_bytes"] < GiB,
        emit=lambda f: Emit(),
        why=_shm_why,
        source="Docker's default /dev/shm is 64 MB; NCCL's shared-memory transport lives there",
        better="run the container with host IPC (--ipc=host, smoke's default) or --shm-size 32g",
    ),
    ServingRule(
        name="speculative",
        decides="EAGLE-3 options from the recipe's [speculative] table, draft attention safe on the CC",
        needs=("speculative", "cc"),
        applies=_spec_on,
        emit=_spec_emit,
        why=_spec_why,
        source="SGLang speculative decoding docs (EAGLE-3 options); recipe [speculative]",
    ),
)

_BY_NAME = {rule.name: rule for rule in RULES}


def rule_named(name: str) -> ServingRule | None:
    return _BY_NAME.get(name)


def rule_names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def emittable(version: str) -> list[tuple[str, str | None]]:
    """Every (flag, value) the rules can emit for SGLang `version`, values None where they are computed."""
    fixed = {
        "attention-backend": ("triton", "flashinfer"),
        "moe-runner-backend": ("triton", "marlin"),
        "speculative-draft-attention-backend": ("triton", "flashinfer"),
    }
    out: list[tuple[str, str | None]] = []
    for key in OPTIONS:
        flag = option_flag(key, version)
        out += [(flag, value) for value in fixed.get(key, (None,))]
    return out
