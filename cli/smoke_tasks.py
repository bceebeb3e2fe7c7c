"""smoke: start a server, follow its phases, probe it, name a hang."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from bwstack.cli.clean_tasks import report_stale
from bwstack.cli.program import Context, finish, guarded, setting, task
from bwstack.errors import SmokeError


@task(
    iterable=["env"],
    auto_shortflags=False,
    help={
        "command": "run this server instead of the recipe's (shlex-split, no shell: wrap in \"sh -c '...'\" for one)",
        "model": "checkpoint folder for the recipe's server command (mounted read-only into --image)",
        "image": "run the server in a container from this local image (host network, GPUs, host IPC)",
        "recipe": "recipe whose serve command, port and engine are used (default from invoke.yaml: sglang)",
        "port": "port the server listens on and smoke probes (default: the recipe's; required with --command)",
        "host": "address to probe; the server is told to bind it (default 127.0.0.1)",
        "startup_timeout": "seconds until a server still starting is a timeout, or unhealthy if listening "
        "(default 1800)",
        "stall_timeout": "seconds without log output, CPU progress or GPU activity that make a hang (default 120)",
        "engine": "log vocabulary for phases: sglang or vllm (default: the recipe's engine, or sglang)",
        "log": "file that receives the server's output (default: a new file under the temp folder)",
        "json": "write the report as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
        "env": "KEY=VALUE for the server's environment (repeatable), e.g. NCCL_P2P_DISABLE=1",
        "gpus": "containers: auto (every GPU NVML sees), all, none, or device ids 0,1 (default auto)",
        "shm_size": "containers: /dev/shm size such as 32g instead of host IPC",
        "grace": "seconds between SIGTERM and SIGKILL at clean-up (default 10)",
        "advice": "an `invoke advise --json` file: its options extend the recipe's command, its environment the "
        "server's (--env wins); refused with --command",
        "advise": "compute the advice here (this node's NVML, --image, --model) and launch with it",
        "history": "SQLite file of phase timings this run is recorded in and compared with (default "
        "$BWSTACK_HISTORY or ~/.local/share/bwstack/history.sqlite; 'off' records nothing)",
        "fail_on_regression": "exit 1 when a phase took more than max(2 x median, median + 60 s) of the last "
        "5 runs with the same key (default: a warning)",
    },
)
@guarded
def smoke(
    c: Context,
    command: str | None = None,
    model: str | None = None,
    image: str | None = None,
    recipe: str | None = None,
    port: str | None = None,
    host: str = "127.0.0.1",
    startup_timeout: str = "1800",
    stall_timeout: str = "120",
    engine: str | None = None,
    log: str | None = None,
    json: str | None = None,
    junit: str | None = None,
    env: list[str] | None = None,
    gpus: str = "auto",
    shm_size: str | None = None,
    grace: str = "10",
    advice: str | None = None,
    advise: bool = False,
    history: str | None = None,
    fail_on_regression: bool = False,
) -> None:
    """Start a server, follow its start-up phases, probe it, name a crash/hang/timeout; exit 0 only when ready."""
    from bwstack.cli.requests import history_options, smoke_request
    from bwstack.recipes import load_recipe
    from bwstack.smoke import run_smoke

    if command is not None and model is not None:
        raise SmokeError(
            "give --model (the recipe's server) or --command (your own server), not both",
            remedy="put the model path into --command",
        )
    load_recipe(setting(c, "recipe", recipe))  # an unknown --recipe is refused even with --command
    report_stale("smoke", containers=bool(image))
    request = smoke_request(
        command=command,
        model=model,
        image=image,
        recipe=setting(c, "recipe", recipe),
        port=port,
        host=host,
        startup_timeout=startup_timeout,
        stall_timeout=stall_timeout,
        engine=engine,
        log=log,
        env=env,
        gpus=gpus,
        shm_size=shm_size,
        grace=grace,
    )
    advised = advised_launch(advice, advise, recipe=request.recipe, image=image, model=request.model)
    if advised is not None:
        request = dataclasses.replace(
            request,
            advice_args=tuple(advised["args"]),
            advised=True,
            env={**advised["env"], **request.env},
        )
    report = run_smoke(
        request,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        history=history_options(history, fail_on_regression=fail_on_regression),
    )
    if advised is not None:
        report.data["advice"] = {"args": advised["args"], "env": advised["env"], "from": advised["from"]}
    finish(report, json=json, junit=junit)


def advised_launch(
    advice: str | None, advise: bool, *, recipe: str, image: str | None, model: Path | None
) -> dict[str, Any] | None:
    """The advice's args and env: read from --advice FILE or computed (--advise); None without either."""
    from bwstack.advise import AdviseError, load_advice

    if advice and advise:
        raise AdviseError("give --advice FILE or --advise, not both")
    if advice:
        return {**load_advice(Path(advice)), "from": advice}
    if not advise:
        return None
    from bwstack.nodes.advice import AdviceRequest, compute_advice

    computed, _report, _base = compute_advice(AdviceRequest(recipe=recipe, image=image, model=model))
    if computed.refused:
        raise AdviseError(f"advice refused by rule {computed.refused[0].rule}: {computed.refused[0].why}")
    return {"args": list(computed.args), "env": computed.env, "from": "--advise"}
