"""bench, spec-check and history: does it serve well, does the drafter pay, and how start-ups trend."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

from bwstack.cli.program import Context, finish, guarded, setting, task
from bwstack.cli.smoke_tasks import history_options
from bwstack.errors import BenchError
from bwstack.inputs import number, optional_number

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


def _settings(
    requests: str, concurrency: list[str] | None, input_len: str, output_len: str, seed: str, **rest: Any
) -> Any:
    from bwstack.bench import BenchSettings

    levels = tuple(number("--concurrency", c, int, minimum=1, error=BenchError) for c in (concurrency or ["1", "8"]))
    if any(c > 1024 for c in levels):
        raise BenchError("--concurrency above 1024 is not a bench this client can drive")
    count = number("--requests", requests, int, minimum=1, error=BenchError)
    if count > 100_000:
        raise BenchError(f"--requests {count} is more than 100000 per level")
    return BenchSettings(
        requests=count,
        concurrency=tuple(dict.fromkeys(levels)),
        input_len=min(number("--input-len", input_len, int, minimum=1, error=BenchError), 200_000),
        output_len=min(number("--output-len", output_len, int, minimum=1, error=BenchError), 100_000),
        seed=number("--seed", seed, int, error=BenchError),
        model_name=rest.get("model_name") or None,
        api_key=rest.get("api_key") or None,
        request_timeout_s=number("--request-timeout", rest.get("request_timeout", "600"), float, minimum=0.1,
                                 error=BenchError),
    )  # fmt: skip


def _smoke_request(c: Context, *, command: str | None, model: str | None, image: str | None, **flags: Any) -> Any:
    from bwstack.smoke import SmokeRequest

    return SmokeRequest.from_flags(
        command=command,
        model=model,
        image=image,
        recipe=setting(c, "recipe", flags.get("recipe")),
        port=flags.get("port"),
        host="127.0.0.1",  # a server bench starts is reached on this machine only
        startup_timeout=flags.get("startup_timeout", "1800"),
        stall_timeout=flags.get("stall_timeout", "120"),
        engine=None,
        log=None,
    )


def _target(c: Context, url: str | None, command: str | None, model: str | None, image: str | None, **flags: Any):
    from bwstack.bench.session import Target

    given = [name for name, value in (("--url", url), ("--command", command), ("--model", model)) if value]
    if len(given) != 1:
        raise BenchError(f"give exactly one of --url, --command or --model (got {', '.join(given) or 'none'})")
    if image and not (command or model):
        raise BenchError("--image needs --command or --model: it says where to start the server")
    if url:
        return Target(url=url)
    return Target(smoke=_smoke_request(c, command=command, model=model, image=image, **flags))


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

    settings = _settings(requests, concurrency, input_len, output_len, seed, model_name=model_name,
                         api_key=api_key, request_timeout=request_timeout)  # fmt: skip
    floor = optional_number("--min-output-tok-s", min_output_tok_s, float, minimum=0, error=BenchError)
    target = _target(c, url, command, model, image, recipe=recipe, port=port, startup_timeout=startup_timeout,
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

    settings = _settings(requests, concurrency, input_len, output_len, seed, model_name=model_name,
                         api_key=api_key, request_timeout=request_timeout)  # fmt: skip
    speedup = number("--min-speedup", min_speedup, float, minimum=0, error=BenchError)
    accept = number("--min-accept-length", min_accept_length, float, minimum=0, error=BenchError)
    flags = {"recipe": recipe, "port": port, "startup_timeout": startup_timeout, "stall_timeout": stall_timeout}
    base, spec = _pair(c, model, draft, image, command, spec_command, url, spec_url, flags)
    options = history_options(history, fail_on_regression=False, kind="bench")
    results = []
    for label, target in (("base", base), ("speculative", spec)):
        _say(f"spec-check: {label}: {target.describe()}")
        results.append(measure(target, settings, progress=progress_printer(sys.stderr, prefix=label), say=_say,
                               history=options))  # fmt: skip
    finish(judge(*results, settings, min_speedup=speedup, min_accept_length=accept), json=json, junit=junit)


def _pair(
    c: Context,
    model: str | None,
    draft: str | None,
    image: str | None,
    command: str | None,
    spec_command: str | None,
    url: str | None,
    spec_url: str | None,
    flags: dict[str, Any],
) -> tuple[Any, Any]:
    from bwstack.bench.session import Target

    modes = [bool(model or draft), bool(command or spec_command), bool(url or spec_url)]
    if sum(modes) != 1:
        raise BenchError("give one pair: --model and --draft, --command and --spec-command, or --url and --spec-url")
    if url or spec_url:
        if not (url and spec_url):
            raise BenchError("--url and --spec-url go together")
        return Target(url=url), Target(url=spec_url)
    if command or spec_command:
        if not (command and spec_command):
            raise BenchError("--command and --spec-command go together")
        return (
            Target(smoke=_smoke_request(c, command=command, model=None, image=image, **flags)),
            Target(smoke=_smoke_request(c, command=spec_command, model=None, image=image, **flags)),
        )
    if not (model and draft):
        raise BenchError("--model and --draft go together")
    if not image and not Path(draft).expanduser().is_dir():
        raise BenchError(f"draft folder {draft} does not exist", remedy="pass the drafter's checkpoint folder")
    return _recipe_pair(c, model, draft, image, flags)


def _recipe_pair(c: Context, model: str, draft: str, image: str | None, flags: dict[str, Any]) -> tuple[Any, Any]:
    from bwstack.bench.session import Target
    from bwstack.recipes import load_recipe
    from bwstack.recipes.recipe import SpeculativeSpec

    recipe = load_recipe(setting(c, "recipe", flags.get("recipe")))
    port = number("--port", flags["port"], int, error=BenchError) if flags.get("port") else recipe.serve.port
    folder = str(Path(model).expanduser().resolve())
    drafter = draft if image else str(Path(draft).expanduser().resolve())
    speculative = dataclasses.replace(
        recipe.speculative or SpeculativeSpec(algorithm="EAGLE3", num_steps=3, eagle_topk=1, num_draft_tokens=4),
        draft_model=drafter,
        enabled=True,
    )
    targets = []
    for spec in (False, speculative):
        argv = recipe.serve_command(folder, host="127.0.0.1", port=port, speculative=spec)
        request = _smoke_request(c, command=shlex.join(argv), model=folder, image=image, **{**flags, "port": str(port)})
        targets.append(Target(smoke=dataclasses.replace(request, engine=recipe.serve.engine)))
    return targets[0], targets[1]


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
    from bwstack.smoke.history import default_path
    from bwstack.smoke.trend import trend_report

    del c
    count = number("--last", last, int, minimum=1, error=BenchError)
    path = Path(history).expanduser() if history else default_path()
    if history and not path.exists():
        raise BenchError(f"history {path} does not exist", remedy="pass the file smoke --history wrote")
    finish(trend_report(path, last=count), json=json, junit=junit)
