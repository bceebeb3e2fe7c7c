"""Log lines in, the furthest start-up phase reached out (the vocabulary itself is data: vocabulary.py).

Beyond matching lines to phases, three states come from context: `shards-loaded` (every checkpoint bar
that started closed at N/N, bars.py; the one phase that can be left backwards, to loading-weights, when
another rank's bar starts after the others closed), `draft-loading-weights` (a rank that logged `Load weight end` logs
`Load weight begin` again: SGLang loads the speculative draft model after the target), and which CUDA
graph captures began and ended (a stall in a capture phase names the capture that never ended, or says
that every one ended and nothing came after).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bwstack.smoke.bars import CheckpointBars
from bwstack.smoke.logfollow import LogLine
from bwstack.smoke.vocabulary import (
    CUDA_GRAPH,
    DISTRIBUTED_INIT,
    DRAFT_CUDA_GRAPH,
    DRAFT_LOADING_WEIGHTS,
    HTTP_STARTUP,
    LAUNCHING,
    LISTENING,
    LOADING_WEIGHTS,
    MEMORY_POOL,
    READY,
    SHARDS_LOADED,
    VOCABULARIES,
    WEIGHTS_COMMITTED,
    WEIGHTS_LOADED,
    Phase,
    Vocabulary,
    vocabulary,
)

__all__ = [
    "CUDA_GRAPH",
    "DISTRIBUTED_INIT",
    "DRAFT_CUDA_GRAPH",
    "DRAFT_LOADING_WEIGHTS",
    "HTTP_STARTUP",
    "LAUNCHING",
    "LISTENING",
    "LOADING_WEIGHTS",
    "MEMORY_POOL",
    "READY",
    "SHARDS_LOADED",
    "VOCABULARIES",
    "WEIGHTS_COMMITTED",
    "WEIGHTS_LOADED",
    "CheckpointBars",
    "Phase",
    "PhaseChange",
    "PhaseTracker",
    "Vocabulary",
    "vocabulary",
]


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
        self._loads: dict[int | None, int] = {}  # rank -> loads begun
        self._loaded: dict[int | None, int] = {}  # rank -> loads ended
        self._captures: dict[str, int] = {}  # "target decode" -> captures begun minus ended (over ranks)
        self._captured: list[str] = []  # captures that ended, in order

    def feed(self, line: LogLine) -> PhaseChange | None:
        if line.blank:
            self.bars.newline()
            return self._bars_done(line)
        if line.rank is not None:
            self.ranks.add(line.rank)
        markers = self.vocab.markers
        bar = markers.checkpoint_bar.search(line.message)
        if bar:
            done, total = int(bar["done"]), int(bar["total"])
            self.bars.update(done, total, rank=line.rank, ending=line.ending, kind=bar["desc"])
        else:
            other = markers.progress_bar.search(line.message)
            if other:
                self.bars.other(int(other["done"]), int(other["total"]), ending=line.ending)
        if "running on http" in line.message:
            url = re.search(r"https?://\S+", line.message)
            self.listen_url = url.group(0) if url else None
        target = self._match(line.message)
        target = self._context(line, target)
        change = None
        if bar or line.ending == "\n" or self.phase == SHARDS_LOADED:
            change = self._bars_done(line)
        further = self.advance(target, line.raw) if target is not None else None
        return further or change

    def _bars_done(self, line: LogLine) -> PhaseChange | None:
        if self.bars.complete and self._order(self.phase) < self._order(SHARDS_LOADED):
            return self.advance(SHARDS_LOADED, line.raw)
        if self.phase == SHARDS_LOADED and not self.bars.complete:
            # a state, not a line: a rank's bar that starts after the others closed (ranks drift) undoes it
            self.phase = LOADING_WEIGHTS
            return PhaseChange(LOADING_WEIGHTS, line.raw)
        return None

    def _context(self, line: LogLine, target: str | None) -> str | None:
        """Phases that a line alone does not name: the draft model's load, and capture bookkeeping."""
        markers = self.vocab.markers
        if markers.load_begin is not None and markers.load_begin.search(line.message):
            self._loads[line.rank] = self._loads.get(line.rank, 0) + 1
            if self._loaded.get(line.rank, 0) >= 1 and DRAFT_LOADING_WEIGHTS in self.vocab.names:
                return DRAFT_LOADING_WEIGHTS
        if markers.load_end is not None and markers.load_end.search(line.message):
            self._loaded[line.rank] = self._loaded.get(line.rank, 0) + 1
        capture = markers.capture.search(line.message) if markers.capture is not None else None
        if capture:
            name = f"{capture['role']} {capture['graph']}"
            if capture["edge"] == "begin":
                self._captures[name] = self._captures.get(name, 0) + 1
            else:
                self._captures[name] = max(0, self._captures.get(name, 0) - 1)
                self._captured.append(name)
        return target

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
        stalled = self.vocab.phase(self.phase).stalled
        if self.phase == LOADING_WEIGHTS and self.bars.seen:
            return f"{stalled} (bars: {self.bars.describe()})"
        if self.phase == SHARDS_LOADED:
            return f"{stalled} (bars: {self.bars.describe()})"
        if self.phase == DRAFT_LOADING_WEIGHTS and any(n >= 2 for n in self._loaded.values()):
            return "the draft model's weights loaded (`Load weight end`), the KV cache was never allocated"
        if self.phase in (CUDA_GRAPH, DRAFT_CUDA_GRAPH):
            role = "target" if self.phase == CUDA_GRAPH else "draft"
            open_ = [name for name, n in self._captures.items() if n > 0 and name.startswith(role)]
            if open_:
                return f"the {role} model's CUDA graph capture began, never ended ({', '.join(open_)})"
            ended = list(dict.fromkeys(self._captured))
            if ended:
                return (
                    f"every CUDA graph capture that began ended ({', '.join(ended)}); what follows capture "
                    "(the next capture, the deferred weight commit, the scheduler's start) never came"
                )
        return stalled
