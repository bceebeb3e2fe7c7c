"""smoke's phase tracker: SGLang's start-up sequence (0.5.21..0.5.23), multi-rank bars, vLLM, order.

The lines here are inputs shaped like the real ones; that the vocabulary matches what the released wheels
really log is test_smoke_vocab_conformance.py's job."""

from __future__ import annotations

import pytest

from bwstack.errors import SmokeError
from bwstack.smoke import phases as ph
from bwstack.smoke.logfollow import LineSplitter
from bwstack.smoke.phases import PhaseTracker, vocabulary

# SGLang 0.5.23's start-up sequence as a server with two TP ranks logs it (per-rank bars, as up to 0.5.22).
SGLANG_LOG = (
    "[2026-01-02 03:04:00] server_args={'model_path': '/models/Kimi-K2.5', 'tp_size': 2, 'port': 30000}\n"
    "[2026-01-02 03:04:01 TP0] Init parallel begin.\n"
    "[2026-01-02 03:04:01 TP1] Init parallel begin.\n"
    "[2026-01-02 03:04:02 TP0] Init parallel ends. elapsed=0.41 s\n"
    "[2026-01-02 03:04:02 TP0] Load weight begin. avail mem=93.72 GB\n"
    "[2026-01-02 03:04:02 TP1] Load weight begin. avail mem=93.72 GB\n"
    "\rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]"
    "\rLoading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]"
    "\rLoading safetensors checkpoint shards:  50% Completed | 1/2 [00:11<00:11, 0.09it/s]"
    "\rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:22<00:00, 0.09it/s]"
    "\rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:22<00:00, 0.09it/s]\n"
    "\rLoading safetensors checkpoint shards:  50% Completed | 1/2 [00:11<00:11, 0.09it/s]"
    "\rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:22<00:00, 0.09it/s]\n"
    "[2026-01-02 03:04:25 TP0] Load weight end. elapsed=23.00 s, type=DeepseekV3ForCausalLM, avail mem=67 GB\n"
    "[2026-01-02 03:04:25 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, KV size: 17.04 GB\n"
    "[2026-01-02 03:04:25 TP0] Memory pool end. avail mem=48.92 GB\n"
    "[2026-01-02 03:04:26 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
    "avail mem=48.90 GB\n"
    "\rCapturing batches (bs=4 avail_mem=48.60 GB):  50%|####    | 2/4 [00:01<00:01]\n"
    "[2026-01-02 03:04:30 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=4.00 s, "
    "mem usage=0.31 GB, avail mem=48.59 GB.\n"
    "[2026-01-02 03:04:30 TP0] max_total_num_tokens=1048576, chunked_prefill_size=8192, context_len=262144\n"
    "INFO:     Started server process [4242]\n"
    "INFO:     Waiting for application startup.\n"
    "INFO:     Application startup complete.\n"
    "INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)\n"
    "[2026-01-02 03:04:31] The server is fired up and ready to roll!\n"
)


def feed(tracker: PhaseTracker, text: str) -> list[str]:
    changes = []
    for line in LineSplitter().feed(text.encode()):
        change = tracker.feed(line)
        if change:
            changes.append(change.phase)
    return changes


def test_sglang_sequence_walks_every_log_phase_in_order() -> None:
    tracker = PhaseTracker(vocabulary("sglang"))
    changes = feed(tracker, SGLANG_LOG)
    assert changes == [
        ph.DISTRIBUTED_INIT,
        ph.LOADING_WEIGHTS,
        ph.SHARDS_LOADED,
        ph.WEIGHTS_LOADED,
        ph.MEMORY_POOL,
        ph.CUDA_GRAPH,
        ph.HTTP_STARTUP,
        ph.LISTENING,
    ]
    assert tracker.ranks == {0, 1}
    assert tracker.listen_url == "http://127.0.0.1:30000"
    # the order the issue lists, ready last (reached only through the probes)
    assert vocabulary("sglang").names == (
        "launching",
        "distributed-init",
        "loading-weights",
        "shards-loaded",
        "weights-loaded",
        "draft-loading-weights",
        "memory-pool",
        "cuda-graph",
        "draft-cuda-graph",
        "weights-committed",
        "http-startup",
        "listening",
        "ready",
    )


def test_shards_loaded_waits_for_every_ranks_bar_even_when_one_redraws_its_end() -> None:
    tracker = PhaseTracker(vocabulary("sglang"))
    bar = "\rLoading safetensors checkpoint shards: {p}% Completed | {k}/64 [00:01<00:01, 2.5it/s]"
    text = "[2026-01-02 03:04:02 TP0] Load weight begin.\n" + bar.format(p=0, k=0) + bar.format(p=0, k=0)
    for k in range(1, 64):  # the two ranks' bars interleaved, rank 0 a little ahead
        text += bar.format(p=k, k=k) + bar.format(p=k - 1, k=k - 1) if k > 1 else bar.format(p=1, k=1)
    text += bar.format(p=100, k=64) + bar.format(p=100, k=64) + "\n"  # rank 0: last update, then close
    feed(tracker, text)
    assert tracker.phase == ph.LOADING_WEIGHTS, tracker.bars.describe()
    feed(tracker, bar.format(p=100, k=63) + bar.format(p=100, k=64) + "\n")  # rank 1 finishes
    assert tracker.phase == ph.SHARDS_LOADED
    assert tracker.stalled_description().endswith("(bars: 2 bars closed at 64/64)")


def test_bars_with_rank_prefixes_are_tracked_per_rank() -> None:
    tracker = PhaseTracker(vocabulary("sglang"))
    line = "[2026-01-02 03:04:02 TP{r}] Loading safetensors checkpoint shards: 100% Completed | {k}/8 [00:01<00:00]\n"
    feed(tracker, line.format(r=0, k=0) + line.format(r=1, k=0) + line.format(r=0, k=8) + line.format(r=0, k=8))
    assert tracker.phase == ph.LOADING_WEIGHTS
    assert "TP1 0/8" in tracker.stalled_description()
    feed(tracker, line.format(r=1, k=8))
    assert tracker.phase == ph.SHARDS_LOADED


def test_phases_never_move_back() -> None:
    tracker = PhaseTracker(vocabulary("sglang"))
    feed(tracker, "[2026-01-02 03:04:25 TP0] Capture target decode CUDA graph begin. backend=full\n")
    assert feed(tracker, "[2026-01-02 03:04:26 TP1] Load weight begin.\n") == []
    assert tracker.phase == ph.CUDA_GRAPH
    assert tracker.advance(ph.LOADING_WEIGHTS) is None
    assert tracker.advance(ph.LISTENING) is not None


def test_vllm_vocabulary_maps_its_start_up_lines() -> None:
    tracker = PhaseTracker(vocabulary("vllm"))
    changes = feed(
        tracker,
        "(APIServer pid=1) INFO 01-02 03:04:00 [utils.py:1] non-default args: {'model': 'm'}\n"
        "INFO 01-02 03:04:01 [parallel_state.py:1] world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://\n"
        "INFO 01-02 03:04:02 [gpu_model_runner.py:1] Starting to load model /models/m...\n"
        "\rLoading safetensors checkpoint shards: 100% Completed | 4/4 [00:05<00:00]\n"
        "INFO 01-02 03:04:08 [default_loader.py:1] Loading weights took 5.10 seconds\n"
        "INFO 01-02 03:04:09 [kv_cache_utils.py:1] GPU KV cache size: 1,048,576 tokens\n"
        "\rCapturing CUDA graphs (FULL): 100%|##########| 4/4 [00:09<00:00,  2.2it/s]\n"
        "INFO 01-02 03:04:10 [gpu_model_runner.py:1] Graph capturing finished in 9 secs, took 0.5 GiB\n"
        "INFO 01-02 03:04:20 [entry.py:139] Starting vLLM server on http://127.0.0.1:8000\n"
        "INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)\n",
    )
    assert changes == [
        ph.DISTRIBUTED_INIT,
        ph.LOADING_WEIGHTS,
        ph.SHARDS_LOADED,
        ph.WEIGHTS_LOADED,
        ph.MEMORY_POOL,
        ph.CUDA_GRAPH,
        ph.HTTP_STARTUP,
        ph.LISTENING,
    ]


def test_every_phase_says_what_a_stall_in_it_means() -> None:
    for engine in ("sglang", "vllm"):
        for phase in vocabulary(engine).phases:
            assert phase.stalled.strip(), (engine, phase.name)


def test_unknown_engine_is_bad_input() -> None:
    with pytest.raises(SmokeError, match="no start-up vocabulary for engine 'tgi'"):
        vocabulary("tgi")
