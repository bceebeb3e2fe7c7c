"""Likely causes of a stall in each start-up phase, what to try, and the evidence that tells them apart.

Data only (docs/smoke.md explains each). A cause's `frames` is a pattern over the py-spy dumps of the
hung processes: when a dump matches, the diagnosis names the cause as the one the evidence points at and
lists it first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from bwstack.smoke import vocabulary as v


@dataclass(frozen=True)
class Cause:
    cause: str
    tries: tuple[str, ...]
    evidence: str = ""  # what separates this cause from the others (process states, py-spy frames, GPUs)
    frames: re.Pattern[str] | None = None  # py-spy frames that point at it

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cause": self.cause, "try": list(self.tries)}
        if self.evidence:
            out["evidence"] = self.evidence
        return out


_NCCL_P2P = (
    "--env NCCL_P2P_DISABLE=1 --env NCCL_CUMEM_ENABLE=0 (NCCL peer-to-peer over PCIe with IOMMU/ACS; "
    "`invoke advise` rule nccl-pcie)"
)
_NCCL_IB = "--env NCCL_IB_DISABLE=1 on a single node, and check that the IOMMU is off or in passthrough (iommu=pt)"
_NCCL_DEBUG = "--env NCCL_DEBUG=INFO to see which rank waits in which collective"
_VERIFY = "invoke verify on the image for this GPU's arch (e.g. sm120): are its kernels in the binary the loader picks?"
_BISECT_GRAPH = (
    "--cuda-graph-backend-decode disabled in the server command (older SGLang: --disable-cuda-graph), to bisect"
)
_ATTENTION = (
    "--attention-backend flashinfer (or triton): no FA3/FlashMLA kernels exist for sm_120 "
    "(`invoke advise` rule attention-backend)"
)
_DRAFT_ATTENTION = "--speculative-draft-attention-backend flashinfer (or triton) for the draft model"
_DEEPGEMM = (
    "--env SGLANG_ENABLE_JIT_DEEPGEMM=0 (DeepGEMM is off on sm_120 unless a recent sgl-deep-gemm is installed; "
    "`invoke advise` rule deepgemm-off)"
)
_MOE_BACKEND = (
    "--moe-runner-backend triton (or another backend built for this arch) instead of auto "
    "(`invoke advise` rule moe-runner)"
)
_PY_SPY = "read the py-spy dumps below: the call each rank waits in tells these causes apart"
_SHM = "containers: host IPC (smoke's default) or --shm-size 32g; Docker's 64 MB /dev/shm breaks NCCL between ranks"
_DRAFT_OFF = "start once without --speculative-algorithm: does the target alone start?"

_COLLECTIVE = re.compile(r"all_reduce|all_gather|broadcast|barrier|reduce_scatter|ProcessGroupNCCL|torch/distributed")
_POST_LOAD = re.compile(r"process_weights_after_loading|post_load_weights|sgl_kernel|load_library|ctypes")
_MOE_QUANT = re.compile(r"(?i)(?:moe|marlin|compressed_tensors|w4a\d|int4|awq|gptq|repack)")

_NCCL_AFTER_LOAD = Cause(
    "a NCCL collective after the load deadlocked over PCIe (peer-to-peer through an IOMMU or ACS)",
    (_NCCL_P2P, _NCCL_IB, _NCCL_DEBUG),
    "main threads in a torch.distributed collective (all_reduce, barrier, broadcast) in the py-spy dumps; "
    "every rank waits in the same call; the GPUs often sit at 100 % utilisation (NCCL kernels spin) where NVML "
    "is available",
    _COLLECTIVE,
)

LIKELY_CAUSES: MappingProxyType[str, tuple[Cause, ...]] = MappingProxyType(
    {
        v.LAUNCHING: (
            Cause("imports or argument parsing stuck before any rank started", (_PY_SPY,)),
            Cause("kernels for this GPU missing from a compiled extension loaded at import", (_VERIFY,)),
        ),
        v.DISTRIBUTED_INIT: (
            Cause(
                "NCCL rendezvous or first collective hangs over PCIe (idle GPUs, no error)",
                (_NCCL_P2P, _NCCL_DEBUG),
                "main threads in init_process_group or a first all_reduce/barrier",
                _COLLECTIVE,
            ),
            Cause("/dev/shm too small for NCCL between ranks", (_SHM,)),
        ),
        v.LOADING_WEIGHTS: (
            Cause(
                "a checkpoint read is slow or stuck (network file system, failing disk; threads in state D)",
                ("check the model folder's storage and its read speed", _PY_SPY),
                "processes or threads in state D with a file-system wait channel; py-spy frames in safe_open, "
                "get_tensor or read",
                re.compile(r"safe_open|get_tensor|safetensors|\bread\b"),
            ),
        ),
        v.SHARDS_LOADED: (
            Cause(
                "kernels for this GPU missing in the binary the loader picked (e.g. sgl_kernel's sm90/ build on a "
                "Blackwell GPU): the first post-load weight processing waits on a kernel that never runs",
                (_VERIFY,),
                "py-spy frames in process_weights_after_loading or an sgl_kernel call; GPUs idle (0 %) where NVML "
                "is available; every process asleep (S)",
                _POST_LOAD,
            ),
            _NCCL_AFTER_LOAD,
            Cause(
                "quantised MoE weight post-processing (INT4/FP4 repacking, Marlin or DeepGEMM set-up) on a new arch",
                (_MOE_BACKEND, _DEEPGEMM, _VERIFY),
                "py-spy frames in a MoE or quantisation method's process_weights_after_loading (compressed_tensors, "
                "marlin, repack); CPU or GPU busy for a while first when it is a slow JIT compile rather than a hang",
                _MOE_QUANT,
            ),
            Cause("which one it is", (_PY_SPY,)),
        ),
        v.WEIGHTS_LOADED: (
            Cause(
                "memory profiling / KV-cache sizing waits in a collective",
                (_NCCL_P2P, _NCCL_DEBUG, _SHM),
                "main threads in a collective in the py-spy dumps",
                _COLLECTIVE,
            ),
        ),
        v.DRAFT_LOADING_WEIGHTS: (
            Cause(
                "the draft model's checkpoint read or weight post-processing is stuck (its own checkpoint folder, "
                "its own quantisation)",
                (_DRAFT_OFF, "check --speculative-draft-model-path and its storage", _PY_SPY),
                "py-spy frames under the draft worker (eagle_worker, draft_worker) loading weights",
                re.compile(r"draft|eagle"),
            ),
            _NCCL_AFTER_LOAD,
        ),
        v.MEMORY_POOL: (
            Cause("attention backend set-up for this arch", (_ATTENTION,)),
            Cause("triton attention exceeds sm_120's ~99 KB shared memory per block", (_ATTENTION,)),
            Cause("CUDA graph capture starting", (_BISECT_GRAPH,)),
        ),
        v.CUDA_GRAPH: (
            Cause(
                "CUDA graph capture stuck in a kernel or a collective",
                (_BISECT_GRAPH, _NCCL_P2P),
                "py-spy frames in capture / capture_one_batch_size; a collective in them points at NCCL",
                re.compile(r"capture"),
            ),
            Cause("attention kernels for this arch", (_ATTENTION,)),
        ),
        v.DRAFT_CUDA_GRAPH: (
            Cause(
                "the draft model's graph capture (draft decode / draft extend) stuck in its attention kernels",
                (_DRAFT_ATTENTION, _DRAFT_OFF),
                "py-spy frames in the draft worker's _capture_cuda_graphs or its cuda graph runner",
                re.compile(r"draft|eagle"),
            ),
            Cause(
                "speculative settings this arch cannot capture (topk, steps, draft tokens)",
                ("--speculative-eagle-topk 1 and fewer --speculative-num-steps, to bisect", _BISECT_GRAPH),
            ),
        ),
        v.WEIGHTS_COMMITTED: (
            Cause(
                "the deferred weight commit (--startup-weight-load-mode overlap) stuck after capture",
                ("--startup-weight-load-mode serial, to bisect", _PY_SPY),
            ),
        ),
        v.HTTP_STARTUP: (
            Cause("the warm-up forward pass is stuck or compiling (JIT) for this arch", (_VERIFY, _DEEPGEMM)),
            Cause("CUDA graphs replayed for the first time", (_BISECT_GRAPH,)),
        ),
        v.LISTENING: (
            Cause(
                "/health runs a 1-token generation in newer SGLang: a failing forward pass keeps it from 200",
                ("curl /health_generate and read the log tail", _BISECT_GRAPH, _ATTENTION, _VERIFY),
            ),
        ),
        v.READY: (),
    }
)

SLOW_START = Cause("a slow but working start (the log or the CPU kept moving)", ("raise --startup-timeout",))


def stack_frames(dumps: list[str]) -> list[str]:
    """The frame lines of `py-spy dump` texts ("    function (file.py:line)"), not their process lines."""
    return [line.strip() for dump in dumps for line in dump.splitlines() if line.startswith("    ")]


def pointed_at(causes: list[Cause], dumps: list[str]) -> list[tuple[Cause, str]]:
    """The causes whose frame pattern matches a frame of the dumps, with that frame (the first match each)."""
    frames = stack_frames(dumps)
    found = []
    for cause in causes:
        if cause.frames is None:
            continue
        hit = next((f for f in frames if cause.frames.search(f)), None)
        if hit is not None:
            found.append((cause, hit))
    return found
