"""preflight, provision and fleet: from a bare node to one that serves the model."""

from __future__ import annotations

import sys

from bwstack.cli.program import Context, finish, guarded, setting, task
from bwstack.errors import BwstackError


@task(
    iterable=["arch"],
    help={
        "recipe": "recipe whose CUDA version (driver floor), archs and serve.tp the node is checked against "
        "(default from invoke.yaml: sglang)",
        "arch": "GPU arch(s) the image targets, e.g. sm120; repeat or use commas (default, or all: any arch the "
        "recipe builds)",
        "tp": "tensor-parallel size: GPUs needed and the weights' split (default 0: the recipe's serve.tp)",
        "model": "checkpoint folder to check by its headers: config, safetensors index and shards, fit in GPU memory",
        "json": "write the report as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
        "docker": "check the Docker engine and its NVIDIA runtime/CDI spec (default: on; --no-docker skips)",
    },
)
@guarded
def preflight(
    c: Context,
    recipe: str | None = None,
    arch: list[str] | None = None,
    tp: str | None = None,
    model: str | None = None,
    json: str | None = None,
    junit: str | None = None,
    docker: bool = True,
) -> None:
    """Check this node (driver, GPUs, links, health, host) and a model folder before serving; exit 1 if not ready."""
    from bwstack.cli.requests import preflight_request
    from bwstack.nodes.preflight import run_preflight

    request = preflight_request(c, recipe=recipe, arch=arch, tp=tp, model=model, docker=docker)
    finish(run_preflight(request), json=json, junit=junit)


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
        "advice": "launch with this `invoke advise --json` file instead of the advice provision derives itself",
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
    advice: str | None = None,
) -> None:
    """Bring up a node: preflight, verify the image for this node's GPUs, advise the launch, smoke-test it."""
    from bwstack.cli.requests import provision_request
    from bwstack.nodes.provision import run_provision

    request = provision_request(
        c,
        image=image,
        model=model,
        recipe=recipe,
        demo=demo,
        port=port,
        startup_timeout=startup_timeout,
        stall_timeout=stall_timeout,
        advice=advice,
    )
    report = run_provision(request, progress=lambda line: print(line, file=sys.stderr, flush=True))
    finish(report, json=json, junit=junit)


@task(
    iterable=["arch"],
    help={
        "arch": "GPU arch(s) the fleet's nodes have, e.g. sm120: picks the image and the nodes (GFD compute "
        "labels); repeat or use commas, all = every arch the recipe builds; one DaemonSet and playbook per arch",
        "recipe": "recipe name under recipes/ or a path to a .toml file (default from invoke.yaml: sglang)",
        "image": "stack image to provision (default: the content tag `invoke render` records for recipe and arch)",
        "repo": "image repository for the default image tag (default from invoke.yaml)",
        "model_dir": "checkpoint folder, same path on every node (default: /models/<last part of serve.model>)",
        "runner": "image holding bwstack that runs preflight/provision in the Kubernetes pods "
        "(default: bwstack-runner:latest)",
        "out": "output folder; writes <out>/fleet/<recipe>-<arch>/daemonset.yaml and playbook.yml (default: build)",
    },
)
@guarded
def fleet(
    c: Context,
    arch: list[str],
    recipe: str | None = None,
    image: str | None = None,
    repo: str | None = None,
    model_dir: str | None = None,
    runner: str | None = None,
    out: str | None = None,
) -> None:
    """Render and validate a Kubernetes DaemonSet and an Ansible playbook that preflight + provision a fleet."""
    from pathlib import Path

    from bwstack.cli.requests import fleet_images
    from bwstack.nodes.fleet import DEFAULT_RUNNER, fleet_warnings, render_fleet, spec_for_recipe, write_fleet
    from bwstack.recipes.recipe import load_recipe

    fleet_images(image, runner)
    name = setting(c, "recipe", recipe)
    targets = load_recipe(name).resolve_archs(arch)
    if image and len(targets) > 1:
        raise BwstackError("--image names one image, so it takes one --arch", remedy="run fleet once per arch")
    specs = [
        spec_for_recipe(
            name,
            arch=target,
            image=image,
            repo=setting(c, "repo", repo),
            model_dir=model_dir,
            runner_image=runner or DEFAULT_RUNNER,
        )
        for target in targets
    ]
    for spec in specs:
        render_fleet(spec)  # every arch renders and validates before any file is written
    for spec in specs:
        for path in write_fleet(spec, Path(setting(c, "out", out))):
            print(path)
        for warning in fleet_warnings(spec):
            print(f"bwstack: warning: {warning}", file=sys.stderr)
