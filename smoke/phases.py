"""The start-up vocabulary of each engine, in one place: which log line means which phase.

SGLang's sequence is docs/facts.md section 5; vLLM's is from its public sources (best effort, not yet
checked against a live vLLM). Phases only move forward: a line that matches an earlier phase (a late
rank, a warm-up request) never moves a server back. `shards-loaded` is not a line but a state: every
checkpoint bar seen has reached N/N. `listening` is also reached when the port opens, and `ready` only
when every probe passed (see watch.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType

from bwstack.errors import SmokeError
from bwstack.smoke.logfollow import LogLine

LAUNCHING = "launching"
DISTRIBUTED_INIT = "distributed-init"
LOADING_WEIGHTS = "loading-weights"
SHARDS_LOADED = "shards-loaded"
WEIGHTS_LOADED = "weights-loaded"
MEMORY_POOL = "memory-pool"
CUDA_GRAPH = "cuda-graph"
HTTP_STARTUP = "http-startup"
LISTENING = "listening"
READY = "ready"


@dataclass(frozen=True)
class Phase:
    """One start-up phase: the lines that announce it and what a stall in it means."""

    name: str
    patterns: tuple[re.Pattern[str], ...]
    stalled: str  # completes "hang in <name>: ..." (what was done, what never came)


@dataclass(frozen=True)
class Vocabulary:
    """An engine's phases in start-up order, and its checkpoint progress bar."""

    engine: str
    phases: tuple[Phase, ...]
    checkpoint_bar: re.Pattern[str]  # groups: done, total

    def phase(self, name: str) -> Phase:
        for phase in self.phases:
            if phase.name == name:
                return phase
        raise KeyError(name)

    def index(self, name: str) -> int:
        return [p.name for p in self.phases].index(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.phases)


def _p(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


_CHECKPOINT_BAR = re.compile(r"Loading safetensors checkpoint shards:\s+\d+% Completed \| (\d+)/(\d+)")

SGLANG = Vocabulary(
    engine="sglang",
    checkpoint_bar=_CHECKPOINT_BAR,
    phases=(
        Phase(LAUNCHING, _p(r"server_args=ServerArgs\("), "process started, torch distributed never initialised"),
        Phase(
            DISTRIBUTED_INIT,
            _p(r"Init torch distributed begin", r"Init torch distributed ends"),
            "torch distributed init began, weights never started loading",
        ),
        Phase(
            LOADING_WEIGHTS,
            _p(r"Load weight begin", r"Loading safetensors checkpoint shards:"),
            "checkpoint being read, a shard bar stopped short of N/N",
        ),
        Phase(SHARDS_LOADED, (), "checkpoint fully read, weights never finished"),
        Phase(WEIGHTS_LOADED, _p(r"Load weight end"), "weights loaded, the KV cache was never allocated"),
        Phase(
            MEMORY_POOL,
            _p(r"KV Cache is allocated", r"Memory pool end", r"Init attention backend"),
            "memory pool allocated, CUDA graph capture never finished starting",
        ),
        Phase(
            CUDA_GRAPH,
            _p(r"Capture cuda graph begin", r"Capturing batches \(bs="),
            "CUDA graph capture began, never ended",
        ),
        Phase(
            HTTP_STARTUP,
            _p(
                r"Capture cuda graph end",
                r"max_total_num_tokens=",
                r"Started server process",
                r"Waiting for application startup",
                r"Application startup complete",
            ),
            "scheduler ready, the HTTP server never listened",
        ),
        Phase(LISTENING, _p(r"Uvicorn running on"), "the server listens, but the HTTP probes never passed"),
        Phase(READY, (), "ready"),
    ),
)

VLLM = Vocabulary(
    engine="vllm",
    checkpoint_bar=_CHECKPOINT_BAR,
    phases=(
        Phase(
            LAUNCHING,
            _p(r"Initializing a V\d+ LLM engine", r"vLLM API server version", r"non-default args:"),
            "process started, the distributed environment never initialised",
        ),
        Phase(
            DISTRIBUTED_INIT,
            _p(r"distributed_init_method=", r"world_size=\d+ rank=\d+"),
            "distributed init began, weights never started loading",
        ),
        Phase(
            LOADING_WEIGHTS,
            _p(r"Starting to load model", r"Loading safetensors checkpoint shards:"),
            "checkpoint being read, a shard bar stopped short of N/N",
        ),
        Phase(SHARDS_LOADED, (), "checkpoint fully read, weights never finished"),
        Phase(
            WEIGHTS_LOADED,
            _p(r"Loading weights took", r"Model loading took"),
            "weights loaded, memory profiling never finished",
        ),
        Phase(
            MEMORY_POOL,
            _p(r"Memory profiling takes", r"GPU KV cache size:", r"# GPU blocks:", r"Available KV cache memory"),
            "KV cache sized, CUDA graph capture never finished starting",
        ),
        Phase(
            CUDA_GRAPH,
            _p(r"Capturing CUDA graph", r"Capturing cudagraphs", r"Graph capturing finished"),
            "CUDA graph capture began, never ended",
        ),
        Phase(
            HTTP_STARTUP,
            _p(
                r"init engine \(profile, create kv cache, warmup model\) took",
                r"Starting vLLM API server",
                r"Started server process",
                r"Waiting for application startup",
                r"Application startup complete",
            ),
            "engine ready, the HTTP server never listened",
        ),
        Phase(LISTENING, _p(r"Uvicorn running on"), "the server listens, but the HTTP probes never passed"),
        Phase(READY, (), "ready"),
    ),
)

VOCABULARIES = MappingProxyType({v.engine: v for v in (SGLANG, VLLM)})


def vocabulary(engine: str) -> Vocabulary:
    """The vocabulary for an engine name; SmokeError naming the known ones otherwise."""
    try:
        return VOCABULARIES[engine]
    except KeyError:
        raise SmokeError(
            f"no start-up vocabulary for engine {engine!r}", remedy=f"use --engine {' or '.join(VOCABULARIES)}"
        ) from None


@dataclass
class _Bar:
    done: int
    total: int
    closed: bool = False  # tqdm drew its last state and a newline


@dataclass
class CheckpointBars:
    """Which checkpoint bars are complete, across ranks writing into one stream.

    Prefixed bar lines belong to their rank. SGLang's tqdm bars carry no prefix, so an unprefixed update
    goes to the bar it most plausibly continues. A 0/N opens a new bar. A '\r'-terminated update goes to
    the bar with the highest count below it (else one at the same count: a redraw). A newline-terminated
    one is tqdm closing a bar: it redraws the last state, so it goes to an open bar at the same count,
    else to the highest below; each bar closes once.
    """

    ranked: dict[int, _Bar] = field(default_factory=dict)
    anonymous: list[_Bar] = field(default_factory=list)

    def update(self, done: int, total: int, rank: int | None, *, closing: bool = False) -> None:
        if rank is not None:
            self.ranked[rank] = _Bar(done, total, closing)
            return
        bars = [b for b in self.anonymous if b.total == total and not b.closed]
        below = [b for b in bars if b.done < done]
        same = [b for b in bars if b.done == done]
        if done == 0:
            target = None
        elif closing:
            target = same[0] if same else max(below, key=lambda b: b.done, default=None)
        else:
            target = max(below, key=lambda b: b.done) if below else (same[0] if same else None)
        if target is None:
            target = _Bar(done, total)
            self.anonymous.append(target)
        target.done = done
        target.closed = closing

    @property
    def seen(self) -> int:
        return len(self.ranked) + len(self.anonymous)

    @property
    def complete(self) -> bool:
        bars = [*self.ranked.values(), *self.anonymous]
        return bool(bars) and all(b.done >= b.total for b in bars)

    def describe(self) -> str:
        bars = [*(f"TP{r} {b.done}/{b.total}" for r, b in sorted(self.ranked.items()))]
        bars += [f"{b.done}/{b.total}" for b in self.anonymous]
        return ", ".join(bars) or "no bar"


@dataclass
class PhaseChange:
    phase: str
    line: str  # the line that moved it ('' when a probe moved it)


class PhaseTracker:
    """Maps log lines to the furthest phase reached."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.phase = vocab.phases[0].name
        self.bars = CheckpointBars()
        self.ranks: set[int] = set()
        self.listen_url: str | None = None  # what the server says it listens on

    def feed(self, line: LogLine) -> PhaseChange | None:
        if line.rank is not None:
            self.ranks.add(line.rank)
        bar = self.vocab.checkpoint_bar.search(line.message)
        if bar:
            self.bars.update(int(bar.group(1)), int(bar.group(2)), line.rank, closing=not line.transient)
        if "running on http" in line.message:
            url = re.search(r"https?://\S+", line.message)
            self.listen_url = url.group(0) if url else None
        target = self._match(line.message)
        if bar and self.bars.complete and (target is None or self._order(target) < self._order(SHARDS_LOADED)):
            target = SHARDS_LOADED
        return self.advance(target, line.raw) if target is not None else None

    def advance(self, name: str, line: str = "") -> PhaseChange | None:
        """Move forward to `name` (never back); the change, or None when already there or beyond."""
        if self._order(name) <= self._order(self.phase):
            return None
        self.phase = name
        return PhaseChange(name, line)

    def _match(self, message: str) -> str | None:
        best: str | None = None
        for phase in self.vocab.phases:
            if any(p.search(message) for p in phase.patterns):
                best = phase.name
        return best

    def _order(self, name: str) -> int:
        return self.vocab.index(name)

    def stalled_description(self) -> str:
        if self.phase == LOADING_WEIGHTS and self.bars.seen:
            return f"{self.vocab.phase(self.phase).stalled} (bars: {self.bars.describe()})"
        return self.vocab.phase(self.phase).stalled
