"""smoke's vocabulary against the real source of the releases it declares (the wheels are the oracle).

For every declared release of every engine: each phase pattern (and each marker the tracker reads) matches
a line that the release's own logging calls produce, rendered from its source with sample values
(tests/smoke/logstrings.py); phases a release does not log are declared per release and must match
nothing. The recipe's pinned SGLang must be a declared release, so bumping the pin to a release whose
strings changed fails here until the vocabulary is checked against it.
"""

from __future__ import annotations

import functools
import tomllib

import pytest

from bwstack.smoke import phases as ph
from bwstack.smoke.logfollow import LineSplitter
from bwstack.smoke.phases import PhaseTracker
from bwstack.smoke.vocabulary import ENGINE, SGLANG, VOCABULARIES, Release, Vocabulary
from tests.paths import REPO
from tests.released import prefetch, released_wheel
from tests.smoke.logstrings import Rendered, rendered_lines

_PACKAGES = {"sglang": "sglang/srt", "vllm": "vllm", "uvicorn": "uvicorn"}
RELEASES = [(v.engine, r.version) for v in VOCABULARIES.values() for r in v.releases]


@functools.cache
def lines_of(name: str, version: str) -> tuple[Rendered, ...]:
    wheel = released_wheel(name, version)
    return tuple(rendered_lines(wheel, _PACKAGES[name], prefetch.cache_dir() / "logstrings"))


def _pool(vocab: Vocabulary, version: str, source: str) -> tuple[Rendered, ...]:
    return lines_of(vocab.engine, version) if source == ENGINE else lines_of(*vocab.server)


def test_the_recipes_pinned_sglang_is_a_release_the_vocabulary_is_checked_against() -> None:
    pin = tomllib.loads((REPO / "recipes" / "sglang.toml").read_text())["sglang"]["version"]
    assert pin in SGLANG.versions, f"recipes/sglang.toml pins SGLang {pin}: add it to smoke/vocabulary.py's releases"
    assert SGLANG.covers() == f"sglang {SGLANG.versions[0]}..{SGLANG.versions[-1]}"


def mismatches(vocab: Vocabulary, version: str, release: Release) -> tuple[list[str], list[str]]:
    """(patterns the release logs no line for, patterns of phases declared silent that it does log)."""
    unmatched: list[str] = []
    silent_but_logged: list[str] = []
    for phase in vocab.phases:
        for line in phase.lines:
            if not line.logged_by(version):
                continue
            hits = [r for r in _pool(vocab, version, line.source) if line.pattern.search(r.text)]
            if phase.name in release.silent and hits and line.source == ENGINE:
                silent_but_logged.append(f"{phase.name}: {line.pattern.pattern} <- {hits[0].where}")
            elif phase.name not in release.silent and not hits:
                unmatched.append(f"{phase.name}: {line.pattern.pattern}")
    return unmatched, silent_but_logged


def test_the_docs_name_the_versions_the_vocabulary_is_checked_against() -> None:
    vllm = VOCABULARIES["vllm"]
    said = f"smoke understands SGLang {SGLANG.versions[0]}..{SGLANG.versions[-1]} and vLLM {vllm.versions[-1]}"
    assert said in " ".join((REPO / "docs" / "smoke.md").read_text().split())


@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_every_phase_pattern_matches_a_line_the_release_logs(engine: str, version: str) -> None:
    vocab = VOCABULARIES[engine]
    release = next(r for r in vocab.releases if r.version == version)
    unmatched, silent_but_logged = mismatches(vocab, version, release)
    assert not unmatched, f"{engine} {version} logs no line these patterns match: {unmatched}"
    assert not silent_but_logged, f"declared silent in {engine} {version}, yet logged: {silent_but_logged}"
    for phase in vocab.phases:  # a phase with lines is logged by the release, or declared silent there
        if phase.lines and phase.name not in release.silent:
            assert any(line.logged_by(version) for line in phase.lines), (engine, version, phase.name)


def test_the_check_fails_on_a_release_whose_strings_changed() -> None:
    """SGLang 0.5.20, one release older than the range: `Init parallel` did not exist yet (it logged
    `Init torch distributed`), so pinning it without checking the vocabulary against it is caught."""
    unmatched, _ = mismatches(SGLANG, "0.5.20", Release("0.5.20"))
    assert any("Init parallel" in u for u in unmatched), unmatched


@pytest.mark.parametrize(("engine", "version"), RELEASES)
def test_the_checkpoint_bar_reads_done_and_total_from_the_bar_real_tqdm_draws(engine: str, version: str) -> None:
    """The release's own desc + bar_format, drawn by tqdm at 63/64: the marker reads (63, 64)."""
    bar = VOCABULARIES[engine].markers.checkpoint_bar
    read = {(m["desc"], m["done"], m["total"]) for r in lines_of(engine, version) if (m := bar.search(r.text))}
    assert ("Loading safetensors checkpoint shards", "63", "64") in read
    descs = {desc for desc, _, _ in read}
    assert descs == set(bar.pattern.split("(?P<desc>")[1].split(")")[0].split("|")), descs
    progress = VOCABULARIES[engine].markers.progress_bar
    other = [r.text for r in lines_of(engine, version) if "Capturing" in r.text and progress.search(r.text)]
    assert other and all(progress.search(t)["done"] in ("0", "63", "64") for t in other)


@pytest.mark.parametrize("version", SGLANG.versions)
def test_the_capture_marker_reads_every_target_and_draft_capture_the_release_logs(version: str) -> None:
    capture = SGLANG.markers.capture
    assert capture is not None
    seen = {(m["role"], m["graph"], m["edge"]) for r in lines_of("sglang", version) if (m := capture.search(r.text))}
    for role, graph in (("target", "decode"), ("target", "verify"), ("draft", "decode"), ("draft", "extend")):
        assert {(role, graph, "begin"), (role, graph, "end")} <= seen, (version, role, graph)


@pytest.mark.parametrize("version", SGLANG.versions)
def test_the_releases_own_lines_walk_the_tracker_through_every_phase(version: str) -> None:
    """One real line per phase, in start-up order, as rank 0 of a TP-2 server writes it; then a capture hang."""
    lines = lines_of("sglang", version)
    uvicorn = lines_of(*SGLANG.server)

    def real(needle: str, pool: tuple[Rendered, ...] = lines) -> str:
        return next(r.text for r in pool if r.text.startswith(needle))

    bar = real("Loading safetensors checkpoint shards:   0%")
    stream = "[2026-01-02 03:04:00] " + real("server_args=") + "\n"
    for needle in ("Init parallel begin", "Load weight begin"):
        stream += f"[2026-01-02 03:04:01 TP0] {real(needle)}\n"
    stream += "\r" + bar + "\r" + real("Loading safetensors checkpoint shards: 100%") + "\n"
    expected = [ph.DISTRIBUTED_INIT, ph.LOADING_WEIGHTS, ph.SHARDS_LOADED]
    for needle, phase in (
        ("Load weight end. elapsed=", ph.WEIGHTS_LOADED),
        ("Load weight begin", ph.DRAFT_LOADING_WEIGHTS),  # the same rank loads a second model: the draft
        ("KV Cache is allocated", ph.MEMORY_POOL),
        ("Capture target verify CUDA graph begin", ph.CUDA_GRAPH),
        ("Capture target verify CUDA graph end", None),
        ("Capture draft decode CUDA graph begin", ph.DRAFT_CUDA_GRAPH),
    ):
        stream += f"[2026-01-02 03:04:02 TP0] {real(needle)}\n"
        expected += [phase] if phase else []
    tracker = PhaseTracker(SGLANG)
    changes = [c.phase for line in LineSplitter().feed(stream.encode()) if (c := tracker.feed(line))]
    assert changes == expected
    assert "draft decode" in tracker.stalled_description()  # a hang here is the draft's capture, named
    tail = f"[2026-01-02 03:04:03 TP0] {real('Capture draft decode CUDA graph end')}\n"
    tail += f"[2026-01-02 03:04:03 TP0] {real('Load weight end. Committed')}\n"
    tail += f"[2026-01-02 03:04:04 TP0] {real('max_total_num_tokens=')}\n"
    tail += f"INFO:     {real('Uvicorn running on', uvicorn)}\n"
    changes = [c.phase for line in LineSplitter().feed(tail.encode()) if (c := tracker.feed(line))]
    assert changes == [ph.WEIGHTS_COMMITTED, ph.HTTP_STARTUP, ph.LISTENING]
