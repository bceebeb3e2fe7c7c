"""bwstack's front door: thin Invoke tasks. Each parses flags, calls one library function, prints the
report and exits 0 (pass), 1 (a check failed) or 2 (bad input or infrastructure). No logic lives here."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable
from typing import Any

from invoke import Context, Exit, Program, task
from invoke.exceptions import ParseError

from bwstack.errors import BwstackError
from bwstack.flags import number, optional_number
from bwstack.report import Report, check_writable


def _parse_errors_exit_2() -> None:
    """invoke exits 1 for a flag or task it cannot parse (a typo, a missing value), which CI would read as
    "a check failed"; bwstack's contract is exit 2 for bad input. invoke imports this file before it parses
    the task flags, so the two parsing steps are wrapped here, once, to turn ParseError into exit 2."""
    for step in ("parse_tasks", "parse_cleanup"):
        original = getattr(Program, step)
        if getattr(original, "bwstack_exit_2", False):
            continue

        def wrapped(self: Program, _original: Callable[[Program], None] = original) -> None:
            try:
                _original(self)
            except ParseError as error:
                raise Exit(f"bwstack: error: {error}", code=2) from None

        wrapped.bwstack_exit_2 = True  # type: ignore[attr-defined]
        setattr(Program, step, wrapped)


_parse_errors_exit_2()


class TaskInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached a running task. Raised like Ctrl-C so every `finally` and context manager
    runs (probe children killed, the verify container removed, temp folders deleted) before exit."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}")


def _raise_interrupted(signum: int, _frame: object) -> None:
    raise TaskInterrupted(signum)


def guarded(body: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a BwstackError into one line on stderr and exit 2: never a traceback for bad input. While the
    task runs, SIGTERM and SIGHUP unwind it like Ctrl-C (Python's default would skip all clean-up)."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            check_writable(kwargs.get("json"), kwargs.get("junit"))  # invoke passes flags as keywords
            return body(*args, **kwargs)
        except BwstackError as error:
            print(f"bwstack: error: {error.one_line()}", file=sys.stderr)
            raise Exit(code=2) from None
        except KeyboardInterrupt as interrupt:
            # The shell convention, 128 + signal; a signal's interrupt carries its number, Ctrl-C does not.
            signum = int(getattr(interrupt, "signum", signal.SIGINT))
            print(f"bwstack: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
            raise Exit(code=128 + signum) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    return wrapper


def finish(report: Report, *, json: str | None = None, junit: str | None = None) -> None:
    """Print the table, write the machine-readable copies, exit with the report's code."""
    report.print_table()  # first, so a report path that cannot be written loses nothing on screen
    report.write(json_path=json, junit_path=junit)
    if report.exit_code:
        raise Exit(code=report.exit_code)


# --- tasks ------------------------------------------------------------------------------------------


@task(
    help={
        "args": 'extra arguments passed to pytest, e.g. "-k render -x"',
        "lint": "run ruff check and ruff format --check first (default: on; --no-lint skips)",
    }
)
def test(c: Context, args: str = "", lint: bool = True) -> None:
    """Run ruff, then the test suite (pytest)."""
    if lint:
        c.run(f"{sys.executable} -m ruff check .", pty=False)
        c.run(f"{sys.executable} -m ruff format --check .", pty=False)
    c.run(f"{sys.executable} -m pytest {args}", pty=False)


def _setting(c: Context, key: str, given: str | None) -> str:
    """A flag if given, else invoke.yaml's bwstack.<key> (overridable by INVOKE_BWSTACK_<KEY>)."""
    return given if given else str(c.config.bwstack[key])


@task(
    help={
        "arch": "target GPU arch: sm120, sm_120 or 12.0 (see recipes/archs.py for the table)",
        "recipe": "recipe name under recipes/ or a path to a .toml file (default from invoke.yaml: sglang)",
        "out": "output folder; writes <out>/<recipe>-<arch>/Dockerfile and build.json (default: build)",
        "repo": "image repository used in the tag recorded in build.json (default from invoke.yaml)",
        "max_jobs": "MAX_JOBS build-arg default baked into the Dockerfile (default: the recipe's)",
        "nvcc_threads": "NVCC_THREADS build-arg default baked into the Dockerfile (default: the recipe's)",
    }
)
@guarded
def render(
    c: Context,
    arch: str | None = None,
    recipe: str | None = None,
    out: str | None = None,
    repo: str | None = None,
    max_jobs: str | None = None,
    nvcc_threads: str | None = None,
) -> None:
    """Render a recipe into a Dockerfile + build.json for one GPU arch."""
    from pathlib import Path

    from images.render import render as render_image
    from images.render import write
    from recipes.recipe import load_recipe

    if not arch:
        raise BwstackError("no --arch given (e.g. --arch sm120)")
    jobs = optional_number("--max-jobs", max_jobs, int, minimum=1)
    threads = optional_number("--nvcc-threads", nvcc_threads, int, minimum=1)
    overrides = {k: str(v) for k, v in (("MAX_JOBS", jobs), ("NVCC_THREADS", threads)) if v is not None}
    loaded = load_recipe(_setting(c, "recipe", recipe))
    rendered = render_image(loaded, arch, repo=_setting(c, "repo", repo), build_args=overrides)
    print(write(rendered, Path(_setting(c, "out", out))))


@task(
    iterable=["arch", "require"],
    help={
        "arch": "GPU arch to check (repeatable): sm120, sm_121, 12.0, or all",
        "wheel": "a wheel file to verify (.so members are streamed, never unpacked all at once)",
        "path": "a folder to verify: site-packages, or the package folder itself",
        "image": "a local Docker image to verify (its filesystem is exported; the image is never run)",
        "package": "import name of the package whose loader picks the binary (default: sgl_kernel)",
        "require": "another binary that must run too (repeatable), e.g. flash_ops; others only warn",
        "kernels": "also list kernel names in every cubin (decompresses them; slower)",
        "json": "write the report as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
        "timeout": "seconds the package's loader may take per arch before it counts as hung (default 30)",
    },
)
@guarded
def verify(
    c: Context,
    arch: list[str],
    wheel: str | None = None,
    path: str | None = None,
    image: str | None = None,
    package: str = "sgl_kernel",
    require: list[str] | None = None,
    kernels: bool = False,
    json: str | None = None,
    junit: str | None = None,
    timeout: str = "30",
) -> None:
    """Check that the binary a package's loader picks has code for each GPU arch (exit 1 if not)."""
    from verify.verify import open_source, parse_archs, verify_tree

    archs = parse_archs(arch)
    with open_source(wheel=wheel, path=path, image=image, import_name=package) as tree:
        report = verify_tree(
            tree,
            archs,
            import_name=package,
            require=require or [],
            kernels=kernels,
            probe_timeout=number("--timeout", timeout, float, minimum=1),
        )
    finish(report, json=json, junit=junit)


@task(
    help={
        "recipe": "recipe whose CUDA version (driver floor), archs and serve.tp the node is checked against "
        "(default from invoke.yaml: sglang)",
        "arch": "the GPU arch the image targets, e.g. sm120 (default: any arch the recipe builds)",
        "tp": "tensor-parallel size: GPUs needed and the weights' split (default 0: the recipe's serve.tp)",
        "model": "checkpoint folder to check by its headers: config, safetensors index and shards, fit in GPU memory",
        "json": "write the report as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
        "docker": "check the Docker engine and its NVIDIA runtime/CDI spec (default: on; --no-docker skips)",
    }
)
@guarded
def preflight(
    c: Context,
    recipe: str | None = None,
    arch: str | None = None,
    tp: str | None = None,
    model: str | None = None,
    json: str | None = None,
    junit: str | None = None,
    docker: bool = True,
) -> None:
    """Check this node (driver, GPUs, links, health, host) and a model folder before serving; exit 1 if not ready."""
    from verify.preflight import request_for_recipe, run_preflight

    tensor_parallel = optional_number("--tp", tp, int, minimum=1)
    request = request_for_recipe(
        _setting(c, "recipe", recipe), arch=arch, tp=tensor_parallel, model=model, docker=docker
    )
    finish(run_preflight(request), json=json, junit=junit)


@task(
    iterable=["arch"],
    help={
        "arch": "GPU arch to build for (repeatable): sm120, sm_100, 12.0 ...",
        "recipe": "recipe name under recipes/ or a path to a .toml file (default from invoke.yaml: sglang)",
        "tag": "image repository for the tags, e.g. registry.example.com/ml/bwstack (default from invoke.yaml)",
        "push": "push the gated tags to the registry after a passing verify",
        "no_verify": "skip the verify gate and tag anyway (the report says so loudly)",
        "max_jobs": "MAX_JOBS for the sgl-kernel compile (default: sized to the Docker host's RAM, 4 GB/thread)",
        "nvcc_threads": "NVCC_THREADS for the sgl-kernel compile (default: the recipe's)",
        "verbose": "print the build's own output as it runs",
        "json": "write the report as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
    },
)
@guarded
def build(
    c: Context,
    arch: list[str],
    recipe: str | None = None,
    tag: str | None = None,
    push: bool = False,
    no_verify: bool = False,
    max_jobs: str | None = None,
    nvcc_threads: str | None = None,
    verbose: bool = False,
    json: str | None = None,
    junit: str | None = None,
) -> None:
    """Build the recipe's image per arch via Docker; tag it only if verify passes."""
    from images.build import build_images

    if not arch:
        raise BwstackError("no --arch given (e.g. --arch sm120)")
    report = build_images(
        _setting(c, "recipe", recipe),
        arch,
        repo=_setting(c, "repo", tag),
        gate=not no_verify,
        push=push,
        max_jobs=optional_number("--max-jobs", max_jobs, int, minimum=1),
        nvcc_threads=optional_number("--nvcc-threads", nvcc_threads, int, minimum=1),
        verbose=verbose,
    )
    finish(report, json=json, junit=junit)


@task(
    help={
        "arch": "GPU arch the fleet's nodes have, e.g. sm120: picks the image and the nodes (GFD compute labels)",
        "recipe": "recipe name under recipes/ or a path to a .toml file (default from invoke.yaml: sglang)",
        "image": "stack image to provision (default: the content tag `invoke render` records for recipe and arch)",
        "repo": "image repository for the default image tag (default from invoke.yaml)",
        "model_dir": "checkpoint folder, same path on every node (default: /models/<last part of serve.model>)",
        "runner": "image holding bwstack that runs preflight/provision in the Kubernetes pods "
        "(default: bwstack-runner:latest)",
        "out": "output folder; writes <out>/fleet/<recipe>-<arch>/daemonset.yaml and playbook.yml (default: build)",
    }
)
@guarded
def fleet(
    c: Context,
    arch: str | None = None,
    recipe: str | None = None,
    image: str | None = None,
    repo: str | None = None,
    model_dir: str | None = None,
    runner: str | None = None,
    out: str | None = None,
) -> None:
    """Render and validate a Kubernetes DaemonSet and an Ansible playbook that preflight + provision a fleet."""
    from pathlib import Path

    from verify.preflight.fleet import DEFAULT_RUNNER, fleet_warnings, spec_for_recipe, write_fleet

    if not arch:
        raise BwstackError("no --arch given (e.g. --arch sm120)")
    spec = spec_for_recipe(
        _setting(c, "recipe", recipe),
        arch=arch,
        image=image,
        repo=_setting(c, "repo", repo),
        model_dir=model_dir,
        runner_image=runner or DEFAULT_RUNNER,
    )
    for path in write_fleet(spec, Path(_setting(c, "out", out))):
        print(path)
    for warning in fleet_warnings(spec):
        print(f"bwstack: warning: {warning}", file=sys.stderr)


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
) -> None:
    """Start a server, follow its start-up phases, probe it, name a crash/hang/timeout; exit 0 only when ready."""
    from verify.smoke import SmokeRequest, run_smoke

    request = SmokeRequest.from_flags(
        command=command,
        model=model,
        image=image,
        recipe=_setting(c, "recipe", recipe),
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
    finish(run_smoke(request, progress=lambda line: print(line, file=sys.stderr, flush=True)), json=json, junit=junit)


@task(
    help={
        "image": "the image to provision with (verified against this node's GPUs, then smoke-tested)",
        "model": "the model folder (checked by its headers, then served read-only by the smoke test)",
        "recipe": "recipe the image was built from (serving command, CUDA version; default from invoke.yaml)",
        "demo": "run the whole flow on the demo stack with only Docker: build, preflight, verify, smoke",
        "port": "port the server listens on (default: the recipe's)",
        "startup_timeout": "seconds the server may take to become ready (default 1800; demo 60)",
        "stall_timeout": "seconds of no log, CPU or GPU progress that count as a hang (default 120; demo 20)",
        "json": "write the report (every stage) as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
    }
)
@guarded
def provision(
    c: Context,
    image: str | None = None,
    model: str | None = None,
    recipe: str | None = None,
    demo: bool = False,
    port: str | None = None,
    startup_timeout: str | None = None,
    stall_timeout: str | None = None,
    json: str | None = None,
    junit: str | None = None,
) -> None:
    """Bring up a node: preflight, verify the image for this node's GPUs, smoke-test it; one report."""
    import dataclasses
    from pathlib import Path

    from verify.provision import ProvisionRequest, run_provision

    port_number = optional_number("--port", port, int, minimum=1)
    if demo:
        request = ProvisionRequest.for_demo(port=port_number, repo=_setting(c, "repo", None))
    elif not image or not model:
        raise BwstackError("provision needs --image REF and --model DIR (or --demo)")
    else:
        request = ProvisionRequest(image, Path(model), _setting(c, "recipe", recipe), port=port_number)
    timeouts = {
        "startup_timeout_s": optional_number("--startup-timeout", startup_timeout, float, minimum=1),
        "stall_timeout_s": optional_number("--stall-timeout", stall_timeout, float, minimum=1),
    }
    request = dataclasses.replace(request, **{k: v for k, v in timeouts.items() if v is not None})
    report = run_provision(request, progress=lambda line: print(line, file=sys.stderr, flush=True))
    finish(report, json=json, junit=junit)
