"""The incident's own log and the pinned SGLang's own strings, named right.

Regression tests for issue 9: two TP ranks' tqdm bars glued to other ranks' lines, both at 64/64, then
silence, must be a hang in shards-loaded with the shards-loaded remedy; SGLang 0.5.23's `Init parallel`
and `Capture {target|draft} ... CUDA graph` lines must reach distributed-init and the capture phases.
"""

from __future__ import annotations

from bwstack.smoke import diagnose as dx
from bwstack.smoke import phases as ph
from bwstack.smoke.logfollow import LineSplitter
from bwstack.smoke.phases import PhaseTracker, vocabulary

BAR = "\rLoading safetensors checkpoint shards: {p:3d}% Completed | {k}/64 [00:{k:02d}<00:10, 2.50it/s]"


def _bar(k: int) -> str:
    return BAR.format(p=100 * k // 64, k=k)


def incident_stream() -> str:
    """Two ranks, each: 0/64, updates to 64/64 (tqdm's last update), the close (64/64 again, then its
    newline written separately). Rank 1 runs one shard behind; some of its log lines land right after a
    bar update of rank 0 with no separator, and one of rank 0's close newlines lands after rank 1's line."""
    text = "[2026-01-02 03:04:00] server_args={'model_path': '/models/Kimi-K2.5', 'tp_size': 2}\n"
    text += "[2026-01-02 03:04:01 TP0] Init parallel begin.\n[2026-01-02 03:04:01 TP1] Init parallel begin.\n"
    text += "[2026-01-02 03:04:02 TP0] Load weight begin. avail mem=93.72 GB\n"
    text += _bar(0)  # rank 0's bar opens; rank 1's Load weight line is glued to it
    text += "[2026-01-02 03:04:02 TP1] Load weight begin. avail mem=93.72 GB\n"
    text += _bar(0)
    for k in range(1, 65):  # tqdm draws 0/64 once per bar
        text += _bar(k) + (_bar(k - 1) if k > 1 else "")
    text += _bar(64)  # rank 0's close redraw; its newline comes after rank 1's next write
    text += _bar(64)  # rank 1's last update
    text += "\n"  # rank 0's close newline
    text += _bar(64) + "\n"  # rank 1's close
    return text


def feed(tracker: PhaseTracker, text: str) -> None:
    for line in LineSplitter().feed(text.encode()):
        tracker.feed(line)


def test_incident_stream_is_shards_loaded_with_the_shards_loaded_remedy() -> None:
    tracker = PhaseTracker(vocabulary("sglang"))
    feed(tracker, incident_stream())
    assert tracker.phase == ph.SHARDS_LOADED, tracker.stalled_description()
    description = tracker.stalled_description()
    assert "every rank" in description and "64/64" in description
    tries = [t for cause in dx.causes_for(tracker.phase) for t in cause.tries]
    assert any("invoke verify" in t for t in tries)
    assert any("NCCL_P2P_DISABLE=1" in t for t in tries)
    assert not any("read speed" in t for t in tries)


def test_a_bar_stuck_one_short_after_the_other_ranks_update_and_close_is_loading_weights() -> None:
    tracker = PhaseTracker(vocabulary("sglang"))
    text = _bar(0) + _bar(0)
    for k in range(1, 64):
        text += _bar(k) + _bar(k)
    text += _bar(64) + _bar(64) + "\n"  # rank 0: last update, close; rank 1 never leaves 63/64
    feed(tracker, text)
    assert tracker.phase == ph.LOADING_WEIGHTS
    assert "63/64" in tracker.stalled_description()


SGLANG_0_5_23_CAPTURE = (
    "[2026-01-02 03:04:00 TP0] Init parallel begin.\n"
    "[2026-01-02 03:04:01 TP0] Init parallel ends. elapsed=1.02 s\n"
    "[2026-01-02 03:04:02 TP0] Load weight begin. avail mem=93.72 GB\n"
    "[2026-01-02 03:04:20 TP0] Load weight end. elapsed=18.00 s, type=DeepseekV3ForCausalLM, avail mem=67.18 GB, "
    "mem usage=26.54 GB.\n"
    "[2026-01-02 03:04:21 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, K size: 8.5 GB, "
    "V size: 8.5 GB\n"
    "[2026-01-02 03:04:21 TP0] Memory pool end. avail mem=48.92 GB\n"
    "[2026-01-02 03:04:22 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
    "avail mem=48.90 GB\n"
)


def test_sglang_0_5_23_strings_reach_distributed_init_and_cuda_graph() -> None:
    tracker = PhaseTracker(vocabulary("sglang"))
    seen = []
    for line in LineSplitter().feed(SGLANG_0_5_23_CAPTURE.encode()):
        change = tracker.feed(line)
        if change:
            seen.append(change.phase)
    assert seen == [ph.DISTRIBUTED_INIT, ph.LOADING_WEIGHTS, ph.WEIGHTS_LOADED, ph.MEMORY_POOL, ph.CUDA_GRAPH]
    assert "target decode" in tracker.stalled_description()


def test_a_draft_capture_hang_is_its_own_phase_with_its_own_causes() -> None:
    tracker = PhaseTracker(vocabulary("sglang"))
    feed(
        tracker,
        SGLANG_0_5_23_CAPTURE.replace("target decode", "target verify")
        + "[2026-01-02 03:04:30 TP0] Capture target verify CUDA graph end. bs=[1, 2, 4], elapsed=8.00 s, "
        "mem usage=1.00 GB, avail mem=47.90 GB.\n"
        "[2026-01-02 03:04:31 TP0] Capture draft extend CUDA graph begin. backend=full, num_tokens_per_req=4, "
        "bs=[1, 2, 4], avail mem=47.80 GB\n",
    )
    assert tracker.phase == ph.DRAFT_CUDA_GRAPH
    assert "draft extend" in tracker.stalled_description()
    draft = {c.cause for c in dx.causes_for(ph.DRAFT_CUDA_GRAPH)}
    assert draft and draft != {c.cause for c in dx.causes_for(ph.CUDA_GRAPH)}
