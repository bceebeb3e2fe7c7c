"""bench, spec-check and history: does it serve well, does the drafter pay, and how start-ups trend."""

from __future__ import annotations

import sys
from pathlib import Path

from bwstack.cli.program import Context, finish, guarded, task
from bwstack.errors import BenchError

_COMMON_HELP = {
    "requests": "requests per concurrency level (default 64)",
    "concurrency": "parallel streams; repeat for several levels, e.g. --concurrency 1 --concurrency 8 (default 1, 8)",
    "input_len": "prompt length in words, about 1.3 tokens each (default 512)",
    "output_len": "tokens asked of every request; ignore_eos makes each produce that many (default 256)",
    "seed": "seed of the prompts: the same seed sends the same text (default 0)",
    "model_name": "model id sent with each request (default: the first id /v1/models names)",
    "api_key": "sent as 'Authorization: Bearer KEY'",
    "request_timeout": "seconds one request may take, and the longest any read waits (default 600)",
    "recipe": "recipe whose serve command and port start the server with --model (default from invoke.yaml)",
    "port": "port of the server bench starts (default: the recipe's; required with --command)",
    "startup_timeout": "seconds the started server has to become ready (default 1800)",
    "stall_timeout": "seconds without progress that make the start a hang (default 120)",
    "history": "SQLite file the start-up phase timings are recorded in (default $BWSTACK_HISTORY or "
    "~/.local/share/bwstack/history.sqlite; 'off' records nothing)",
    "json": "write the report as JSON to this file",
    "junit": "write the report as JUnit XML to this file",
}


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@task(
    iterable=["concurrency"],
    auto_shortflags=False,
    help={
        "url": "bench a server that already runs here (http://127.0.0.1:30000); nothing is started or stopped",
        "command": "start this server through smoke, bench it when ready, stop it (needs --port)",
        "model": "start the recipe's server for this checkpoint folder through smoke, bench it, stop it",
        "image": "start the server in a container from this local image (with --command or --model)",
        "min_output_tok_s": "exit 1 when a level's aggregate output tokens/s is below this",
        **_COMMON_HELP,
    },
)
@guarded
def bench(
    c: Context,
    url: str | None = None,
    command: str | None = None,
    model: str | None = None,
    image: str | None = None,
    recipe: str | None = None,
    port: str | None = None,
    requests: str = "64",
    concurrency: list[str] | None = None,
    input_len: str = "512",
    output_len: str = "256",
    seed: str = "0",
    model_name: str | None = None,
    api_key: str | None = None,
    request_timeout: str = "600",
    min_output_tok_s: str | None = None,
    startup_timeout: str = "1800",
    stall_timeout: str = "120",
    history: str | None = None,
    json: str | None = None,
    junit: str | None = None,
) -> None:
    """Stream completions at each concurrency level: tok/s, TTFT, ITL, accept length; exit 1 on errors or too slow."""
    from bwstack.bench.progress import progress_printer
    from bwstack.bench.session import bench_report, measure
    from bwstack.cli.requests import bench_floor, bench_settings, bench_target, history_options

    settings = bench_settings(requests, concurrency, input_len, output_len, seed, model_name=model_name,
                         api_key=api_key, request_timeout=request_timeout)  # fmt: skip
    floor = bench_floor(min_output_tok_s)
    target = bench_target(c, url, command, model, image, recipe=recipe, port=port, startup_timeout=startup_timeout,
                     stall_timeout=stall_timeout)  # fmt: skip
    measured = measure(
        target,
        settings,
        progress=progress_printer(sys.stderr),
        say=_say,
        history=history_options(history, fail_on_regression=False, kind="bench"),
    )
    finish(bench_report(measured, settings, min_output_tok_s=floor), json=json, junit=junit)


@task(
    name="spec-check",
    iterable=["concurrency"],
    auto_shortflags=False,
    help={
        "model": "checkpoint folder: the recipe's server is started without and then with the drafter",
        "draft": "drafter checkpoint folder (with --model); with --image it must be a path inside the container",
        "image": "start both servers in containers from this local image (with --model)",
        "command": "the base server's command (with --spec-command; needs --port)",
        "spec_command": "the speculative server's command, the same model with its drafter",
        "url": "a running base server (with --spec-url)",
        "spec_url": "a running speculative server of the same model",
        "min_speedup": "output tokens/s with the drafter over without, at every level (default 1.1)",
        "min_accept_length": "tokens accepted per verify step, bonus token included (default 2.0)",
        **_COMMON_HELP,
    },
)
@guarded
def spec_check(
    c: Context,
    model: str | None = None,
    draft: str | None = None,
    image: str | None = None,
    command: str | None = None,
    spec_command: str | None = None,
    url: str | None = None,
    spec_url: str | None = None,
    recipe: str | None = None,
    port: str | None = None,
    requests: str = "64",
    concurrency: list[str] | None = None,
    input_len: str = "512",
    output_len: str = "256",
    seed: str = "0",
    model_name: str | None = None,
    api_key: str | None = None,
    request_timeout: str = "600",
    min_speedup: str = "1.1",
    min_accept_length: str = "2.0",
    startup_timeout: str = "1800",
    stall_timeout: str = "120",
    history: str | None = None,
    json: str | None = None,
    junit: str | None = None,
) -> None:
    """Bench without and with the drafter; exit 1 when the drafter slows serving or accepts too little."""
    from bwstack.bench.progress import progress_printer
    from bwstack.bench.session import measure
    from bwstack.bench.speccheck import judge
    from bwstack.cli.requests import bench_settings, history_options, spec_check_pair, spec_check_thresholds

    settings = bench_settings(requests, concurrency, input_len, output_len, seed, model_name=model_name,
                         api_key=api_key, request_timeout=request_timeout)  # fmt: skip
    speedup, accept = spec_check_thresholds(min_speedup, min_accept_length)
    flags = {"recipe": recipe, "port": port, "startup_timeout": startup_timeout, "stall_timeout": stall_timeout}
    base, spec = spec_check_pair(c, model, draft, image, command, spec_command, url, spec_url, flags)
    options = history_options(history, fail_on_regression=False, kind="bench")
    results = []
    for label, target in (("base", base), ("speculative", spec)):
        _say(f"spec-check: {label}: {target.describe()}")
        results.append(measure(target, settings, progress=progress_printer(sys.stderr, prefix=label), say=_say,
                               history=options))  # fmt: skip
    finish(judge(*results, settings, min_speedup=speedup, min_accept_length=accept), json=json, junit=junit)


@task(
    auto_shortflags=False,
    help={
        "history": "the SQLite file to read (default $BWSTACK_HISTORY or ~/.local/share/bwstack/history.sqlite)",
        "last": "newest runs to show (default 20)",
        "json": "write the report as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
    },
)
@guarded
def history(
    c: Context, history: str | None = None, last: str = "20", json: str | None = None, junit: str | None = None
) -> None:
    """Start-up phase timings of the last smoke and bench runs, per key (recipe, image, model, engine, GPUs)."""
    from bwstack.cli.requests import history_last
    from bwstack.smoke.history import default_path
    from bwstack.smoke.trend import trend_report

    del c
    count = history_last(last)
    path = Path(history).expanduser() if history else default_path()
    if history and not path.exists():
        raise BenchError(f"history {path} does not exist", remedy="pass the file smoke --history wrote")
    finish(trend_report(path, last=count), json=json, junit=junit)
