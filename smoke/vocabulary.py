"""The start-up vocabulary of each engine, as data: which log line means which phase, for which releases.

Every pattern here is checked against the released wheels of the releases it declares
(tests/smoke/test_smoke_vocab_conformance.py renders the logging calls of the real source and proves
each pattern matches a line that code writes). SGLang's sequence and the source of each line are in
docs/smoke.md. Phases only move forward; `shards-loaded` is a state (every checkpoint bar that started
closed at N/N), `draft-loading-weights` is reached when a rank that finished loading begins a second
load (the draft model), and `ready` only when every probe passed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType

from bwstack.errors import SmokeError

LAUNCHING = "launching"
DISTRIBUTED_INIT = "distributed-init"
LOADING_WEIGHTS = "loading-weights"
SHARDS_LOADED = "shards-loaded"
WEIGHTS_LOADED = "weights-loaded"
DRAFT_LOADING_WEIGHTS = "draft-loading-weights"
MEMORY_POOL = "memory-pool"
CUDA_GRAPH = "cuda-graph"
DRAFT_CUDA_GRAPH = "draft-cuda-graph"
WEIGHTS_COMMITTED = "weights-committed"
HTTP_STARTUP = "http-startup"
LISTENING = "listening"
READY = "ready"

ENGINE = "engine"  # a pattern's source: the engine's own wheel (else the name of the package that logs it)
UVICORN = "uvicorn"


@dataclass(frozen=True)
class Line:
    """One line shape. `source`: whose code writes it; `versions`: the releases that log it (None: all)."""

    pattern: re.Pattern[str]
    source: str = ENGINE
    versions: frozenset[str] | None = None

    def logged_by(self, version: str) -> bool:
        return self.versions is None or version in self.versions


@dataclass(frozen=True)
class Phase:
    """One start-up phase: the lines that announce it and what a stall in it means."""

    name: str
    lines: tuple[Line, ...]
    stalled: str  # completes "hang in <name>: ..." (what was done, what never came)

    @property
    def patterns(self) -> tuple[re.Pattern[str], ...]:
        return tuple(line.pattern for line in self.lines)


@dataclass(frozen=True)
class Release:
    """A release the vocabulary is checked against; `silent`: phases with lines that this release never logs."""

    version: str
    silent: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Markers:
    """Lines the tracker reads for more than a phase change (each is checked against the wheels too)."""

    checkpoint_bar: re.Pattern[str]  # a tqdm checkpoint bar update; groups: desc, done, total
    progress_bar: re.Pattern[str]  # any tqdm bar update (the checkpoint's or another loader's); groups: done, total
    load_begin: re.Pattern[str] | None = None  # a rank starts loading a model (a second one: the draft)
    load_end: re.Pattern[str] | None = None
    capture: re.Pattern[str] | None = None  # groups: role (target|draft), graph (decode|verify|...), edge


@dataclass(frozen=True)
class Vocabulary:
    """An engine's phases in start-up order, the releases they are checked against, and its markers."""

    engine: str
    releases: tuple[Release, ...]
    server: tuple[str, str]  # the HTTP server package and the release its lines are checked against
    phases: tuple[Phase, ...]
    markers: Markers
    notes: tuple[str, ...] = field(default=())

    @property
    def checkpoint_bar(self) -> re.Pattern[str]:
        return self.markers.checkpoint_bar

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

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(r.version for r in self.releases)

    def covers(self) -> str:
        """ "SGLang 0.5.21..0.5.23": the releases checked, oldest to newest."""
        first, last = self.releases[0].version, self.releases[-1].version
        return f"{self.engine} {first}" if first == last else f"{self.engine} {first}..{last}"


def _l(*patterns: str, source: str = ENGINE, versions: tuple[str, ...] | None = None) -> tuple[Line, ...]:
    chosen = None if versions is None else frozenset(versions)
    return tuple(Line(re.compile(p), source, chosen) for p in patterns)


# tqdm's bar as SGLang's and vLLM's BAR_FORMAT render it: "{desc}: {percentage:3.0f}% Completed | {n}/{total} [..."
_BAR_TAIL = r":\s+\d+% Completed \| (?P<done>\d+)/(?P<total>\d+)"
# tqdm's default bar_format (other loaders, graph capture): "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} [..."
_PROGRESS = re.compile(r"(?:% Completed \||%\|[^|]*\|) (?P<done>\d+)/(?P<total>\d+)")

SGLANG = Vocabulary(
    engine="sglang",
    releases=(Release("0.5.21"), Release("0.5.22"), Release("0.5.23")),
    server=(UVICORN, "0.54.0"),
    markers=Markers(
        checkpoint_bar=re.compile(
            r"(?P<desc>Loading safetensors checkpoint shards|Multi-thread loading shards)" + _BAR_TAIL
        ),
        progress_bar=_PROGRESS,
        load_begin=re.compile(r"Load weight begin\."),
        load_end=re.compile(r"Load weight end\. elapsed="),
        capture=re.compile(
            r"Capture (?P<role>target|draft) (?P<graph>decode|verify|prefill|extend) CUDA graph (?P<edge>begin|end)\."
        ),
    ),
    phases=(
        Phase(LAUNCHING, _l(r"server_args="), "process started, the parallel runtime never initialised"),
        Phase(
            DISTRIBUTED_INIT,
            _l(r"Init parallel begin\.", r"Init parallel ends\.", r"Memory baseline taken\."),
            "the parallel runtime (torch distributed, NCCL) began initialising, weights never started loading",
        ),
        Phase(
            LOADING_WEIGHTS,
            _l(
                r"Load weight begin\.",
                r"Loading safetensors checkpoint shards" + _BAR_TAIL,
                r"Multi-thread loading shards" + _BAR_TAIL,
                r"Prepared capture-safe model in",
                r"Started checkpoint prefetching",
            ),
            "checkpoint being read, a shard bar stopped short of N/N",
        ),
        Phase(
            SHARDS_LOADED,
            (),
            "checkpoint fully read on every rank (every bar that started closed at N/N), but the weights never "
            "finished post-processing: `Load weight end` and the next phase never came",
        ),
        Phase(WEIGHTS_LOADED, _l(r"Load weight end\. elapsed="), "weights loaded, the KV cache was never allocated"),
        Phase(
            DRAFT_LOADING_WEIGHTS,
            _l(r"Using draft model load_format"),
            "the target model loaded, the draft model's load began and never finished",
        ),
        Phase(
            MEMORY_POOL,
            _l(r"KV Cache is allocated\.", r"Memory pool end\."),
            "memory pool allocated, CUDA graph capture never began",
        ),
        Phase(
            CUDA_GRAPH,
            _l(
                r"Capture target (?:decode|verify|prefill) CUDA graph begin\.",
                r"Capturing batches \(bs=",
                r"Capturing prefill shape \(",
            ),
            "the target model's CUDA graph capture began, never ended",
        ),
        Phase(
            DRAFT_CUDA_GRAPH,
            _l(
                r"Capture draft (?:decode|extend|prefill|verify) CUDA graph begin\.",
                r"Capture UNO tree draft CUDA graph begin\.",
            ),
            "the draft model's CUDA graph capture began, never ended",
        ),
        Phase(
            WEIGHTS_COMMITTED,
            _l(r"Load weight end\. Committed real weights after CUDA graph capture"),
            "the deferred weights were committed after capture, the scheduler never finished starting",
        ),
        Phase(
            HTTP_STARTUP,
            _l(r"max_total_num_tokens=")
            + _l(
                r"Started server process",
                r"Waiting for application startup",
                r"Application startup complete",
                source=UVICORN,
            ),
            "scheduler ready, the HTTP server never listened",
        ),
        Phase(
            LISTENING,
            _l(r"Uvicorn running on", source=UVICORN),
            "the server listens, but the HTTP probes never passed",
        ),
        Phase(READY, (), "ready"),
    ),
)

VLLM = Vocabulary(
    engine="vllm",
    releases=(Release("0.33.0"),),
    server=(UVICORN, "0.54.0"),
    markers=Markers(
        checkpoint_bar=re.compile(r"(?P<desc>Loading safetensors checkpoint shards)(?: \(eager\))?" + _BAR_TAIL),
        progress_bar=_PROGRESS,
    ),
    phases=(
        Phase(
            LAUNCHING,
            _l(r"vLLM server version", r"non-default args:"),
            "process started, the distributed environment never initialised",
        ),
        Phase(
            DISTRIBUTED_INIT,
            _l(r"world_size=\d+ rank=\d+", r"distributed_init_method="),
            "distributed init began, weights never started loading",
        ),
        Phase(
            LOADING_WEIGHTS,
            _l(
                r"Starting to load model",
                r"Loading model from scratch",
                r"Loading safetensors checkpoint shards(?: \(eager\))?" + _BAR_TAIL,
            ),
            "checkpoint being read, a shard bar stopped short of N/N",
        ),
        Phase(
            SHARDS_LOADED,
            (),
            "checkpoint fully read (every bar that started closed at N/N), but the weights never finished "
            "post-processing: `Loading weights took` and the next phase never came",
        ),
        Phase(
            WEIGHTS_LOADED,
            _l(r"Loading weights took", r"Model loading took"),
            "weights loaded, memory profiling never finished",
        ),
        Phase(
            MEMORY_POOL,
            _l(r"KV cache size: .* tokens", r"Available KV cache memory"),
            "KV cache sized, CUDA graph capture never began",
        ),
        Phase(
            CUDA_GRAPH,
            _l(r"Capturing CUDA graphs \("),
            "CUDA graph capture began, never ended",
        ),
        Phase(
            HTTP_STARTUP,
            _l(
                r"Graph capturing finished in",
                r"init engine \(profile, create kv cache, warmup model\) took",
                r"Starting vLLM server on",
            )
            + _l(
                r"Started server process",
                r"Waiting for application startup",
                r"Application startup complete",
                source=UVICORN,
            ),
            "engine ready, the HTTP server never listened",
        ),
        Phase(
            LISTENING,
            _l(r"Uvicorn running on", source=UVICORN),
            "the server listens, but the HTTP probes never passed",
        ),
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
