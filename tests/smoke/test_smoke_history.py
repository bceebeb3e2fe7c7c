"""Phase history: the SQLite store, the regression rule, the key, and smoke recording into it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path

from bwstack.report import Report, Status
from bwstack.smoke.history import (
    HistoryOptions,
    HistoryStore,
    RunKey,
    file_run,
    model_digest,
    phase_durations,
    regressions,
    weights_gb_s,
)
from tests.emulator.support import emulator_command, free_port
from tests.paths import REPO

KEY = RunKey(recipe="sglang", image="sha256:abc", model="m1", engine="sglang 0.5.23", gpus="8x NVIDIA B200")


def smoke_report(phase_history: list[dict[str, object]], verdict: str = "ready") -> Report:
    report = Report(kind="smoke", subject="server")
    report.data.update({"verdict": verdict, "phase_history": phase_history, "ready_after_s": phase_history[-1]["at_s"]})
    return report


def started(loading_s: float) -> list[dict[str, object]]:
    return [
        {"phase": "launching", "at_s": 0.0},
        {"phase": "loading-weights", "at_s": 5.0},
        {
            "phase": "weights-loaded",
            "at_s": 5.0 + loading_s,
            "line": f"Load weight end. elapsed={loading_s:.2f} s, type=X, avail mem=60.00 GB, mem usage=550.00 GB.",
        },
        {"phase": "ready", "at_s": 5.0 + loading_s + 30.0},
    ]


def test_a_20x_slower_weight_load_is_flagged_as_a_regression(tmp_path: Path) -> None:
    options = HistoryOptions(tmp_path / "h.sqlite")
    for seconds in (21.0, 22.0, 23.0, 22.0, 24.0):
        assert file_run(options, KEY, smoke_report(started(seconds))) == []
    report = smoke_report(started(440.0))
    found = {r.phase: r for r in file_run(options, KEY, report)}
    assert found.keys() == {"loading-weights", "to-ready"}  # the start as a whole got slower too
    slow = found["loading-weights"]
    assert (slow.seconds, slow.median_s, slow.runs) == (440.0, 22.0, 5)
    check = next(c for c in report.checks if c.name == "regression")
    assert check.status is Status.WARN and check.finding.startswith("loading-weights 440 s, median 22 s")
    assert report.exit_code == 0  # a warning unless asked to fail
    failing = smoke_report(started(440.0))
    file_run(HistoryOptions(tmp_path / "h.sqlite", fail_on_regression=True), KEY, failing)
    assert failing.exit_code == 1
    assert report.data["history"]["weights_gb_s"] == 1.25  # 550 GB in 440 s, from the log line


def test_the_rule_needs_three_runs_and_ignores_small_absolute_growth() -> None:
    assert regressions({"cuda-graph": 100.0}, [{"cuda-graph": 10.0}] * 2) == []  # two runs: too few to judge
    assert [r.phase for r in regressions({"cuda-graph": 100.0}, [{"cuda-graph": 10.0}] * 3)] == ["cuda-graph"]
    # 2 x 10 s but not 10 s + 60 s: a short phase doubling is noise, not a regression
    assert regressions({"cuda-graph": 45.0}, [{"cuda-graph": 10.0}] * 5) == []
    # 600 s + 60 s but not 2 x 600 s: a long phase a minute slower is not one either
    assert regressions({"loading-weights": 700.0}, [{"loading-weights": 600.0}] * 5) == []
    assert regressions({"loading-weights": 1300.0}, [{"loading-weights": 600.0}] * 5)[0].median_s == 600.0
    # only the last 5 runs count: old slow runs do not hide a new slow one
    history = [{"x": 500.0}] * 10 + [{"x": 10.0}] * 5
    assert [r.phase for r in regressions({"x": 200.0}, history)] == ["x"]


def test_runs_of_another_key_are_not_compared(tmp_path: Path) -> None:
    options = HistoryOptions(tmp_path / "h.sqlite")
    other = RunKey(**{**KEY.__dict__, "gpus": "8x NVIDIA H100"})
    for _ in range(5):
        file_run(options, other, smoke_report(started(22.0)))
    report = smoke_report(started(440.0))
    assert file_run(options, KEY, report) == []
    assert next(c for c in report.checks if c.name == "regression").status is Status.SKIP


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite")
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for index in range(20):
                store.record("smoke", KEY, "ready", {"to-ready": float(worker * 100 + index)})
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    runs = store.runs(key=KEY, last=1000)
    assert len(runs) == 120 and len({r.timings["to-ready"] for r in runs}) == 120


def test_the_model_digest_follows_headers_and_config_not_names_of_other_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 4096}')
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}).encode()
    shard = tmp_path / "model.safetensors"
    shard.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    first = model_digest(tmp_path)
    (tmp_path / "README.md").write_text("notes")
    assert model_digest(tmp_path) == first
    shard.write_bytes(len(header).to_bytes(8, "little") + header + b"\1" * 8)  # weights change, shape does not
    assert model_digest(tmp_path) == first
    (tmp_path / "config.json").write_text('{"hidden_size": 8192}')
    assert model_digest(tmp_path) != first
    assert model_digest(None) == "" and model_digest(tmp_path / "nope") == ""


def test_phase_durations_and_weights_rate() -> None:
    history = started(10.0)
    assert phase_durations(history) == {"launching": 5.0, "loading-weights": 10.0, "weights-loaded": 30.0}
    assert weights_gb_s(history) == 55.0
    assert weights_gb_s([{"phase": "weights-loaded", "at_s": 1.0, "line": "Load weight end. type=X"}]) is None


def run_task(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True, timeout=90)


def test_every_smoke_run_is_recorded_and_history_shows_the_trend(tmp_path: Path) -> None:
    store = tmp_path / "history.sqlite"
    port = free_port()
    command = shlex.join(emulator_command(port, "healthy", "--tp", "1", "--warmup-s", "0"))
    for _ in range(3):
        done = run_task("smoke", "--command", command, "--port", str(port), "--stall-timeout", "5",
                        "--history", str(store))  # fmt: skip
        assert done.returncode == 0, done.stderr
    runs = HistoryStore(store).runs()
    assert len(runs) == 3 and {r.key.digest for r in runs} == {runs[0].key.digest}
    assert runs[0].key.recipe.startswith("--command ") and runs[0].key.engine == "sglang"
    assert {"loading-weights", "to-listening", "to-ready"} <= runs[-1].timings.keys()
    done = run_task("history", "--history", str(store), "--last", "2", "--json", str(tmp_path / "h.json"))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "h.json").read_text())
    assert report["kind"] == "history" and len(report["runs"]) == 2
    assert "2 runs (ready ready)" in report["checks"][0]["finding"]
    assert "to-ready" in report["checks"][0]["finding"]
    missing = run_task("history", "--history", str(tmp_path / "nope.sqlite"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
