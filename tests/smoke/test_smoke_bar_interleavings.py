"""Bar attribution for any interleaving of real multi-rank writes (tests/smoke/barstreams.py recorded them).

Hypothesis chooses how the ranks' recorded writes interleave (derandomized: every run tries the same
interleavings), so a bar update is glued to another rank's line, a close's newline lands after another
rank's write, and rank 0's `Capturing batches` bar shares the stream. Whatever the order: every bar that
started closed at N/N -> shards-loaded; a bar stuck inside its last shard -> loading-weights, naming the
one bar that stopped short. A few live runs write into one real pipe with fixed seeds.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bwstack.smoke import phases as ph
from bwstack.smoke.logfollow import LineSplitter
from bwstack.smoke.phases import PhaseTracker, vocabulary
from tests.smoke import barstreams
from tests.smoke.barstreams import CASES, SHARDS, Case

_WRITE = re.compile(r"(?=\r)|(?<=\n)")


def writes(chunk: str) -> list[str]:
    """A read back into the writes that made it: tqdm writes '\\r' + state, and on close its newline alone;
    a log record is one write ending in '\\n'."""
    units: list[str] = []
    for part in _WRITE.split(chunk):
        if part.startswith("\r") and part.endswith("\n") and len(part) > 1:
            units += [part[:-1], "\n"]
        elif part:
            units.append(part)
    return units


def recorded(case: Case) -> list[list[str]]:
    return [[unit for chunk in stream for unit in writes(chunk)] for stream in barstreams.load(case)]


def interleave(streams: list[list[str]], rng: random.Random) -> str:
    """One order of all the writes that keeps each rank's own order."""
    cursors = [0] * len(streams)
    out = []
    while True:
        open_ = [r for r, s in enumerate(streams) if cursors[r] < len(s)]
        if not open_:
            return "".join(out)
        rank = rng.choice(open_)
        burst = rng.randint(1, 4)  # a rank often writes several times in a row
        out += streams[rank][cursors[rank] : cursors[rank] + burst]
        cursors[rank] += burst


def track(text: str) -> PhaseTracker:
    tracker = PhaseTracker(vocabulary("sglang"))
    for line in LineSplitter().feed(text.encode()):
        tracker.feed(line)
    return tracker


def check(case: Case, tracker: PhaseTracker) -> None:
    if case.stuck is None:
        assert tracker.bars.complete, tracker.bars.describe()
        assert tracker.vocab.index(tracker.phase) >= tracker.vocab.index(ph.SHARDS_LOADED)
        drawn = case.ranks if case.bars == "per-rank" else 1
        assert tracker.bars.describe().startswith(f"{drawn} bar{'s' if drawn > 1 else ''} closed at {SHARDS}/")
    else:
        assert tracker.phase == ph.LOADING_WEIGHTS, tracker.bars.describe()
        short = tracker.bars.short()
        assert len(short) == 1 and int(short[0].split("/")[0]) < SHARDS, short
        assert f"open: {short[0]}" in tracker.stalled_description()


def test_every_case_was_recorded_with_sglangs_bar_and_its_cases_shape() -> None:
    for case in CASES:
        streams = barstreams.load(case)
        assert len(streams) == case.ranks and all(streams), case.name
        text = "".join(chunk for stream in streams for chunk in stream)
        starts = text.count(f"| 0/{SHARDS} [")
        assert starts == (case.ranks if case.bars == "per-rank" else 1), case.name
        assert ("Capturing batches (bs=" in text) is (case.stuck is None)


def test_the_interleavings_glue_updates_to_lines_and_part_closes_from_their_bars() -> None:
    """What the property test is for: some orders put another rank's line right after a bar update (glued),
    or another rank's write between a bar's close and its newline."""
    streams = recorded(Case(8, "per-rank", None))
    texts = [interleave(streams, random.Random(seed)) for seed in range(20)]
    assert sum(bool(re.search(r"it/s\]\[\d{4}-\d\d-\d\d ", t)) for t in texts) >= 10
    # a close's newline alone after another rank's bar update or log line
    assert sum(bool(re.search(r"TP\d\] [^\r\n]*\n\n|\| (?:\d|1[0-5])/16 \[[^\r\n]*\n", t)) for t in texts) >= 5


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_order_the_recording_arrived_in(case: Case) -> None:
    check(case, track("".join(chunk for _rank, chunk in barstreams.arrival(case))))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_any_interleaving_of_the_recorded_writes(case: Case, rng: random.Random) -> None:
    check(case, track(interleave(recorded(case), rng)))


@pytest.mark.parametrize(
    ("case", "seed"),
    [(Case(2, "per-rank", None), 1), (Case(2, "per-rank", 1), 2), (Case(8, "rank0", None), 3)],
    ids=lambda value: value.name if isinstance(value, Case) else str(value),
)
def test_live_ranks_writing_into_one_pipe(case: Case, seed: int) -> None:
    check(case, track(barstreams.live(case, barstreams.bar_format(), seed).decode()))
