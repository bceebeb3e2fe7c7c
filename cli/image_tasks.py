"""render and build: recipes into Dockerfiles, Dockerfiles into verified images."""

from __future__ import annotations

from bwstack.cli.program import Context, finish, guarded, setting, task


@task(
    iterable=["arch"],
    help={
        "arch": "target GPU arch(s): sm120, sm_120 or 12.0; repeat or use commas; all = every arch the recipe "
        "builds (see recipes/archs.py for the table); one Dockerfile per arch",
        "recipe": "recipe name under recipes/ or a path to a .toml file (default from invoke.yaml: sglang)",
        "out": "output folder; writes <out>/<recipe>-<arch>/Dockerfile and build.json (default: build)",
        "repo": "image repository used in the tag recorded in build.json (default from invoke.yaml)",
        "max_jobs": "MAX_JOBS build-arg default baked into the Dockerfile (default: the recipe's)",
        "nvcc_threads": "NVCC_THREADS build-arg default baked into the Dockerfile (default: the recipe's)",
    },
)
@guarded
def render(
    c: Context,
    arch: list[str],
    recipe: str | None = None,
    out: str | None = None,
    repo: str | None = None,
    max_jobs: str | None = None,
    nvcc_threads: str | None = None,
) -> None:
    """Render a recipe into a Dockerfile + build.json per GPU arch."""
    from pathlib import Path

    from bwstack.cli.requests import build_arg_overrides
    from bwstack.images.render import render as render_image
    from bwstack.images.render import write
    from bwstack.recipes.recipe import load_recipe

    overrides = build_arg_overrides(max_jobs, nvcc_threads)
    loaded = load_recipe(setting(c, "recipe", recipe))
    renders = [
        render_image(loaded, target, repo=setting(c, "repo", repo), build_args=overrides)
        for target in loaded.resolve_archs(arch)  # every arch renders before any is written
    ]
    for rendered in renders:
        print(write(rendered, Path(setting(c, "out", out))))


@task(
    iterable=["arch"],
    help={
        "arch": "GPU arch(s) to build for: sm120, sm_100, 12.0 ...; repeat or use commas; all = every arch the "
        "recipe builds",
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
    from bwstack.cli.requests import compile_jobs
    from bwstack.images.build import build_images
    from bwstack.recipes.recipe import load_recipe

    jobs, threads = compile_jobs(max_jobs, nvcc_threads)
    name = setting(c, "recipe", recipe)
    report = build_images(
        name,
        load_recipe(name).resolve_archs(arch),
        repo=setting(c, "repo", tag),
        gate=not no_verify,
        push=push,
        max_jobs=jobs,
        nvcc_threads=threads,
        verbose=verbose,
    )
    finish(report, json=json, junit=junit)
