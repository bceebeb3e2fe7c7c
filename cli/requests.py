"""Flags become typed requests here, and only here.

Tasks take number-like flags as text (invoke would turn `--tp eight` into a traceback) and hand them to
these functions, which parse them with bwstack.inputs' shared checks and return the request dataclass the
library stage defines (SmokeRequest, PreflightRequest, ProvisionRequest, BenchSettings, bench Targets).
Errors name the flag the user typed. Library stages never see a flag string; a task is then parse, one
library call, finish(report). Defaults that come from invoke.yaml (recipe, repo) are read through
`setting`, so these functions take the task's Context where they need one.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bwstack.cli.program import Context, setting
from bwstack.errors import BenchError, BwstackError, SmokeError, SourceError
from bwstack.inputs import image_reference, number, optional_number

if TYPE_CHECKING:
    from bwstack.bench import BenchSettings
    from bwstack.bench.session import Target
    from bwstack.nodes.advice import AdviceRequest
    from bwstack.nodes.preflight import PreflightRequest
    from bwstack.nodes.provision import ProvisionRequest
    from bwstack.recipes.archs import Arch
    from bwstack.smoke import SmokeRequest
    from bwstack.smoke.history import HistoryOptions
    from bwstack.verify.wheel_limits import Limits

MAX_JOBS_LIMIT = 4096  # compile jobs; more than any build host has threads, far below what breaks make/ninja
DEFAULT_GRACE = "10"


# --- smoke -------------------------------------------------------------------------------------------------


def smoke_request(
    *,
    command: str | None,
    model: str | None,
    image: str | None,
    recipe: str,
    port: str | None,
    host: str,
    startup_timeout: str,
    stall_timeout: str,
    engine: str | None,
    log: str | None,
    env: list[str] | None = None,
    gpus: str = "auto",
    shm_size: str | None = None,
    grace: str = DEFAULT_GRACE,
) -> SmokeRequest:
    """smoke's flags (strings, as typed) to a checked SmokeRequest; bad input is a SmokeError (exit 2)."""
    from bwstack.smoke import SmokeRequest

    argv: tuple[str, ...] | None = None
    if command is not None:
        try:
            argv = tuple(shlex.split(command))
        except ValueError as error:
            raise SmokeError(f"--command {command!r} does not parse: {error}") from None
    return SmokeRequest(
        command=argv,
        model=Path(model).expanduser().resolve() if model else None,
        image=image or None,
        recipe=recipe,
        port=number("--port", port, int, error=SmokeError) if port not in (None, "") else None,
        host=host,
        startup_timeout_s=number("--startup-timeout", startup_timeout, float, error=SmokeError),
        stall_timeout_s=number("--stall-timeout", stall_timeout, float, error=SmokeError),
        engine=engine or None,
        log_path=Path(log).expanduser().resolve() if log else None,
        env=env_pairs(env or []),
        gpus=gpus,
        shm_size=shm_size or None,
        grace_s=number("--grace", grace, float, error=SmokeError),
    )


def env_pairs(pairs: list[str]) -> dict[str, str]:
    """Repeated --env KEY=VALUE to a mapping (the value may hold '=')."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SmokeError(f"--env {pair!r} is not KEY=VALUE")
        env[key] = value
    return env


def history_options(given: str | None, *, fail_on_regression: bool, kind: str = "smoke") -> HistoryOptions | None:
    """--history FILE, the default store, or None for 'off'."""
    from bwstack.smoke.history import HistoryOptions, default_path

    if given and given.strip().lower() == "off":
        return None
    path = Path(given).expanduser() if given else default_path()
    return HistoryOptions(path, fail_on_regression=fail_on_regression, kind=kind)


# --- verify ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyOptions:
    """verify's flags that need parsing; the rest pass through as given."""

    archs: list[Arch]
    limits: Limits
    probe_timeout_s: float


def verify_options(arch: list[str], require: list[str] | None, timeout: str, max_member_size: str) -> VerifyOptions:
    """--arch (sm120, sm_120, 12.0, commas, all), --require, --timeout and --max-member-size, checked."""
    from bwstack.recipes.archs import parse_arch_list
    from bwstack.verify.wheel_limits import Limits, parse_size

    archs = parse_arch_list(arch)
    if any(not name.strip() for name in require or []):
        raise SourceError("--require needs a binary name, got an empty one", remedy="e.g. --require flash_ops")
    return VerifyOptions(archs, Limits(parse_size(max_member_size)), number("--timeout", timeout, float, minimum=1))


# --- advise ------------------------------------------------------------------------------------------------


def advice_request(
    c: Context,
    *,
    image: str | None,
    path: str | None,
    arch: str | None,
    preflight: str | None,
    model: str | None,
    recipe: str | None,
    port: str | None,
) -> AdviceRequest:
    """advise's flags to an AdviceRequest; a --preflight report is read here, so a bad file is exit 2."""
    from bwstack.advise import AdviseError
    from bwstack.advise.facts import read_json
    from bwstack.nodes.advice import AdviceRequest

    if arch and preflight:
        raise AdviseError("give one of --arch or --preflight FILE: the report names the node's GPUs")
    return AdviceRequest(
        recipe=setting(c, "recipe", recipe),
        image=image,
        path=Path(path) if path else None,
        arch=arch,
        preflight=read_json(Path(preflight), "preflight report") if preflight else None,
        model=Path(model).expanduser().resolve() if model else None,
        port=optional_number("--port", port, int, minimum=1),
    )


# --- nodes -------------------------------------------------------------------------------------------------


def preflight_request(
    c: Context, *, recipe: str | None, arch: list[str] | None, tp: str | None, model: str | None, docker: bool
) -> PreflightRequest:
    """preflight's flags to a PreflightRequest filled from the recipe (explicit flags win)."""
    from bwstack.nodes.preflight import request_for_recipe

    tensor_parallel = optional_number("--tp", tp, int, minimum=1)
    return request_for_recipe(setting(c, "recipe", recipe), archs=arch or (), tp=tensor_parallel, model=model,
                              docker=docker)  # fmt: skip


def provision_request(
    c: Context,
    *,
    image: str | None,
    model: str | None,
    recipe: str | None,
    demo: bool,
    port: str | None,
    startup_timeout: str | None,
    stall_timeout: str | None,
    advice: str | None,
) -> ProvisionRequest:
    """provision's flags to a ProvisionRequest; the request itself checks port, seconds and model folder."""
    from bwstack.nodes.provision import ProvisionRequest

    port_number = optional_number("--port", port, int, minimum=1)
    if demo:
        request = ProvisionRequest.for_demo(port=port_number, repo=setting(c, "repo", None))
    elif not image or not model:
        raise BwstackError("provision needs --image REF and --model DIR (or --demo)")
    else:
        request = ProvisionRequest(image, Path(model), setting(c, "recipe", recipe), port=port_number)
    timeouts = {
        "startup_timeout_s": optional_number("--startup-timeout", startup_timeout, float, minimum=1),
        "stall_timeout_s": optional_number("--stall-timeout", stall_timeout, float, minimum=1),
    }
    request = dataclasses.replace(request, **{k: v for k, v in timeouts.items() if v is not None})
    if advice:
        from bwstack.advise import load_advice

        load_advice(Path(advice))  # a bad file is exit 2 now, not after a build and a verify
        request = dataclasses.replace(request, advice=Path(advice))
    return request


# --- images ------------------------------------------------------------------------------------------------


def compile_jobs(max_jobs: str | None, nvcc_threads: str | None) -> tuple[int | None, int | None]:
    """--max-jobs and --nvcc-threads as numbers; None where the flag was not given (images.sizing decides)."""
    jobs = optional_number("--max-jobs", max_jobs, int, minimum=1, maximum=MAX_JOBS_LIMIT)
    return jobs, optional_number("--nvcc-threads", nvcc_threads, int, minimum=1)


def build_arg_overrides(max_jobs: str | None, nvcc_threads: str | None) -> dict[str, str]:
    """render's --max-jobs and --nvcc-threads as the Dockerfile ARG defaults they override."""
    jobs, threads = compile_jobs(max_jobs, nvcc_threads)
    return {k: str(v) for k, v in (("MAX_JOBS", jobs), ("NVCC_THREADS", threads)) if v is not None}


def fleet_images(image: str | None, runner: str | None) -> None:
    """--image and --runner must be references Docker would accept (checked before any rendering)."""
    for flag, ref in (("--image", image), ("--runner", runner)):
        if ref is not None:
            image_reference(flag, ref)


# --- bench -------------------------------------------------------------------------------------------------


def bench_settings(
    requests: str, concurrency: list[str] | None, input_len: str, output_len: str, seed: str, **rest: Any
) -> BenchSettings:
    """The load flags every bench task shares, to BenchSettings (bounded so one typo cannot run for days)."""
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


def bench_floor(min_output_tok_s: str | None) -> float | None:
    """--min-output-tok-s: None when not given."""
    return optional_number("--min-output-tok-s", min_output_tok_s, float, minimum=0, error=BenchError)


def spec_check_thresholds(min_speedup: str, min_accept_length: str) -> tuple[float, float]:
    """--min-speedup and --min-accept-length."""
    speedup = number("--min-speedup", min_speedup, float, minimum=0, error=BenchError)
    return speedup, number("--min-accept-length", min_accept_length, float, minimum=0, error=BenchError)


def history_last(last: str) -> int:
    """history's --last."""
    return number("--last", last, int, minimum=1, error=BenchError)


def bench_smoke_request(
    c: Context, *, command: str | None, model: str | None, image: str | None, **flags: Any
) -> SmokeRequest:
    """The smoke request that starts a server bench measures."""
    return smoke_request(
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


def bench_target(
    c: Context, url: str | None, command: str | None, model: str | None, image: str | None, **flags: Any
) -> Target:
    """bench's --url, --command or --model (exactly one) to the Target it measures."""
    from bwstack.bench.session import Target

    given = [name for name, value in (("--url", url), ("--command", command), ("--model", model)) if value]
    if len(given) != 1:
        raise BenchError(f"give exactly one of --url, --command or --model (got {', '.join(given) or 'none'})")
    if image and not (command or model):
        raise BenchError("--image needs --command or --model: it says where to start the server")
    if url:
        return Target(url=url)
    return Target(smoke=bench_smoke_request(c, command=command, model=model, image=image, **flags))


def spec_check_pair(
    c: Context,
    model: str | None,
    draft: str | None,
    image: str | None,
    command: str | None,
    spec_command: str | None,
    url: str | None,
    spec_url: str | None,
    flags: dict[str, Any],
) -> tuple[Target, Target]:
    """spec-check's one pair of flags (model+draft, command+spec-command or url+spec-url) to base and
    speculative Targets."""
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
            Target(smoke=bench_smoke_request(c, command=command, model=None, image=image, **flags)),
            Target(smoke=bench_smoke_request(c, command=spec_command, model=None, image=image, **flags)),
        )
    if not (model and draft):
        raise BenchError("--model and --draft go together")
    if not image and not Path(draft).expanduser().is_dir():
        raise BenchError(f"draft folder {draft} does not exist", remedy="pass the drafter's checkpoint folder")
    return recipe_pair(c, model, draft, image, flags)


def recipe_pair(c: Context, model: str, draft: str, image: str | None, flags: dict[str, Any]) -> tuple[Target, Target]:
    """The recipe's server for --model, started without and then with --draft as its drafter."""
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
        request = bench_smoke_request(c, command=shlex.join(argv), model=folder, image=image,
                                      **{**flags, "port": str(port)})  # fmt: skip
        targets.append(Target(smoke=dataclasses.replace(request, engine=recipe.serve.engine)))
    return targets[0], targets[1]
