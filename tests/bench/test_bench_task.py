"""`invoke bench` and `invoke spec-check` end to end against the serving emulator: exit codes, reports,
the incident's drafter refused with its causes, and nothing left running."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from bwstack.smoke.history import HistoryStore
from tests.bench.conftest import Serve
from tests.emulator.support import emulator_command, free_port, processes_mentioning
from tests.paths import REPO

SMALL = ("--requests", "8", "--concurrency", "1", "--concurrency", "4", "--input-len", "16", "--output-len", "32")


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_bench_starts_the_server_through_smoke_measures_and_stops_it(tmp_path: Path) -> None:
    port = free_port()
    command = shlex.join(emulator_command(port, "healthy", "--tp", "1", "--warmup-s", "0", "--enable-metrics"))
    store = tmp_path / "h.sqlite"
    done = invoke("bench", "--command", command, "--port", str(port), *SMALL, "--stall-timeout", "5",
                  "--history", str(store), "--json", str(tmp_path / "b.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    assert (report["kind"], report["ok"], report["smoke"]["verdict"]) == ("bench", True, "ready")
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 4]
    for level in report["levels"]:
        assert (level["requests"], level["errors"], level["output_tokens"]) == (8, 0, 8 * 32)
        assert set(level["ttft_ms"]) == set(level["itl_ms"]) == {"p50", "p90", "p99"}
        assert level["accept_length"] is None and level["output_tok_s"] > 0 and level["request_s"] > 0
    assert "bench: concurrency 4: 8/8 requests" in done.stderr  # plain progress lines off a terminal
    assert "smoke: stopped: nothing left running" in done.stderr
    (run,) = HistoryStore(store).runs()
    assert run.kind == "bench" and "to-ready" in run.timings
    assert not processes_mentioning(f"--port {port}")


def test_bench_fails_on_a_rate_floor_and_on_failed_requests(serve: Serve, tmp_path: Path) -> None:
    with serve() as server:
        done = invoke("bench", "--url", server.url, *SMALL, "--min-output-tok-s", "1e9",
                      "--junit", str(tmp_path / "b.xml"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    failures = ET.parse(tmp_path / "b.xml").getroot().findall("testcase/failure")
    assert len(failures) == 2 and "under --min-output-tok-s 1e+09" in failures[0].get("message", "")
    done = invoke("bench", "--url", f"http://127.0.0.1:{free_port()}", "--requests", "2", "--concurrency", "1",
                  "--model-name", "m", "--json", str(tmp_path / "gone.json"))  # fmt: skip
    assert done.returncode == 1
    (level,) = json.loads((tmp_path / "gone.json").read_text())["levels"]
    assert level["errors"] == 2


def test_bench_bad_input_exits_2_with_one_line() -> None:
    cases = [
        ((), "give exactly one of --url, --command or --model"),
        (("--url", "http://127.0.0.1:1", "--command", "serve"), "give exactly one of"),
        (("--url", "ftp://127.0.0.1:1"), "is not an http(s) URL"),
        (("--url", "http://127.0.0.1:1", "--concurrency", "0"), "--concurrency must be at least 1"),
        (("--url", "http://127.0.0.1:1", "--requests", "many"), "--requests 'many' is not a whole number"),
        (("--command", "serve"), "--port is required with --command"),
    ]
    for args, message in cases:
        done = invoke("bench", *args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_spec_check_refuses_the_incidents_drafter_and_names_the_causes(tmp_path: Path) -> None:
    port = free_port()
    base = shlex.join(emulator_command(port, "healthy", "--tp", "1", "--warmup-s", "0", "--enable-metrics"))
    spec = f"{base} --spec-accept 0.15 --decode-log-interval 10"  # ~15 % acceptance, as in the incident
    done = invoke("spec-check", "--command", base, "--spec-command", spec, "--port", str(port), *SMALL,
                  "--stall-timeout", "5", "--json", str(tmp_path / "s.json"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["verdict"] == "refuse"
    assert all(speedup <= 0.8 for speedup in report["speedup"].values()), report["speedup"]
    assert report["accept_length"] < 1.5 and report["base_accept_length"] is None
    causes = " ".join(report["likely_causes"])
    for cause in ("attention backend", "trained for another target model or tokenizer", "too many draft tokens"):
        assert cause in causes
    verdict = next(c for c in report["checks"] if c["name"] == "verdict")
    assert verdict["status"] == "fail" and verdict["finding"].startswith("refuse the drafter")
    assert not processes_mentioning(f"--port {port}")


def test_spec_check_passes_a_drafter_that_pays(serve: Serve, tmp_path: Path) -> None:
    with serve("--enable-metrics") as base, serve("--enable-metrics", "--spec-accept", "0.8") as spec:
        done = invoke("spec-check", "--url", base.url, "--spec-url", spec.url, *SMALL, "--min-accept-length", "2",
                      "--json", str(tmp_path / "s.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["verdict"] == "pass" and report["likely_causes"] == []
    assert all(speedup >= 1.3 for speedup in report["speedup"].values()), report["speedup"]
    assert report["accept_length"] >= 2


def test_spec_check_bad_input_exits_2() -> None:
    for args, message in [
        ((), "give one pair"),
        (("--url", "http://127.0.0.1:1"), "--url and --spec-url go together"),
        (("--model", "/m", "--draft", "/nope-draft"), "draft folder /nope-draft does not exist"),
        (("--url", "http://127.0.0.1:1", "--spec-url", "http://127.0.0.1:2", "--min-speedup", "x"), "--min-speedup"),
    ]:
        done = invoke("spec-check", *args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_a_server_that_never_gets_ready_fails_the_bench_with_smokes_verdict(tmp_path: Path) -> None:
    port = free_port()
    command = shlex.join(emulator_command(port, "crash-no-kernel-image", "--tp", "1"))
    done = invoke("bench", "--command", command, "--port", str(port), *SMALL, "--stall-timeout", "5",
                  "--json", str(tmp_path / "b.json"))  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads((tmp_path / "b.json").read_text())
    server = next(c for c in report["checks"] if c["name"] == "server")
    assert server["status"] == "fail" and "crash" in server["finding"] and report["levels"] == []
    assert "is ready; measuring" not in done.stderr
    assert not processes_mentioning(f"--port {port}")


def test_sigterm_during_the_bench_stops_the_server_it_started() -> None:
    port = free_port()
    command = shlex.join(emulator_command(port, "healthy", "--tp", "1", "--warmup-s", "0", "--token-rate", "20"))
    bench = subprocess.Popen(
        [sys.executable, "-m", "invoke", "bench", "--command", command, "--port", str(port), "--requests", "50",
         "--concurrency", "2", "--output-len", "64", "--stall-timeout", "5"],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = []
    try:
        assert bench.stderr is not None
        for line in bench.stderr:
            lines.append(line)
            if "is ready; measuring" in line:
                bench.send_signal(signal.SIGTERM)
                break
        _, rest = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    text = "".join(lines) + rest
    assert bench.returncode == 128 + signal.SIGTERM, text
    assert "smoke: stopped: nothing left running" in text
    assert not processes_mentioning(f"--port {port}")


def test_spec_check_from_a_recipe_starts_the_same_server_without_and_with_the_drafter(tmp_path: Path) -> None:
    from invoke import Context

    from bwstack.cli.requests import recipe_pair

    (tmp_path / "model").mkdir()
    (tmp_path / "draft").mkdir()
    flags = {"recipe": "sglang", "port": None, "startup_timeout": "1800", "stall_timeout": "120"}
    base, spec = recipe_pair(Context(), str(tmp_path / "model"), str(tmp_path / "draft"), None, flags)
    assert base.smoke.model == spec.smoke.model == tmp_path / "model"
    assert base.smoke.port == spec.smoke.port == 30000 and base.smoke.engine == "sglang"
    base_argv, spec_argv = list(base.smoke.command), list(spec.smoke.command)
    assert "--enable-metrics" in base_argv and not [a for a in base_argv if a.startswith("--speculative")]
    assert spec_argv[: len(base_argv)] == base_argv  # the same server, plus the drafter
    extra = " ".join(spec_argv[len(base_argv) :])
    assert f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {tmp_path / 'draft'}" in extra


def test_history_of_a_file_that_is_not_a_store_exits_2(tmp_path: Path) -> None:
    (tmp_path / "junk.sqlite").write_text("not a database")
    done = invoke("history", "--history", str(tmp_path / "junk.sqlite"))
    assert done.returncode == 2 and "cannot open the history" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    empty = invoke("history", "--history", str(tmp_path / "fresh.sqlite"))
    assert empty.returncode == 2 and "does not exist" in empty.stderr
