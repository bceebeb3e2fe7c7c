"""bwstack's front door: thin Invoke tasks. Each parses flags, calls one library function, prints the
report and exits 0 (pass), 1 (a check failed) or 2 (bad input or infrastructure). No logic lives here."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from invoke import Context, Exit, task

from bwstack.errors import BwstackError
from bwstack.report import Report


def guarded(body: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a BwstackError into one line on stderr and exit 2: never a traceback for bad input."""

    @functools.wraps(body)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except BwstackError as error:
            print(f"bwstack: error: {error.one_line()}", file=sys.stderr)
            raise Exit(code=2) from None

    return wrapper


def finish(report: Report, *, json: str | None = None, junit: str | None = None) -> None:
    """Write the machine-readable copies, print the table, exit with the report's code."""
    report.write(json_path=json, junit_path=junit)
    report.print_table()
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
    arch: str,
    recipe: str | None = None,
    out: str | None = None,
    repo: str | None = None,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
) -> None:
    """Render a recipe into a Dockerfile + build.json for one GPU arch."""
    from pathlib import Path

    from images.render import render as render_image
    from images.render import write
    from recipes.recipe import load_recipe

    overrides = {k: str(v) for k, v in (("MAX_JOBS", max_jobs), ("NVCC_THREADS", nvcc_threads)) if v is not None}
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
    timeout: float = 30.0,
) -> None:
    """Check that the binary a package's loader picks has code for each GPU arch (exit 1 if not)."""
    from verify.verify import open_source, parse_archs, verify_tree

    archs = parse_archs(arch)
    with open_source(wheel=wheel, path=path, image=image, import_name=package) as tree:
        report = verify_tree(
            tree, archs, import_name=package, require=require or [], kernels=kernels, probe_timeout=float(timeout)
        )
    finish(report, json=json, junit=junit)
