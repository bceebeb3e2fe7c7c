"""Fleets: the same preflight + provision, run by an existing engine on many nodes.

Renders, from a recipe and an arch, a Kubernetes DaemonSet (one pod per GPU node whose GPU Feature
Discovery labels match the arch and tp) and an Ansible playbook for bare metal. Both are validated
after rendering (the DaemonSet against the Kubernetes schema by kubernetes-validate, then bwstack's own
rules; the playbook's tasks and variables), so a template mistake fails `invoke fleet`, not a rollout.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

import jinja2

from bwstack.errors import RenderError
from bwstack.inputs import writing
from bwstack.nodes.fleet_checks import validate_daemonset, validate_playbook
from bwstack.nodes.fleet_spec import (
    DAEMONSET,
    DEFAULT_RUNNER,
    DNS_LABEL,
    DOCKER_SOCKET,
    PLAYBOOK,
    FleetSpec,
)
from bwstack.recipes.archs import Arch
from bwstack.templating import strict_environment

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates" / "fleet"


def spec_for_recipe(
    recipe: str,
    *,
    arch: str | Arch,
    image: str | None = None,
    repo: str = "bwstack",
    model_dir: str | None = None,
    runner_image: str = DEFAULT_RUNNER,
    namespace: str = "bwstack",
) -> FleetSpec:
    """A FleetSpec from a recipe: its CUDA version, serve.tp and model; the image defaults to render's content tag."""
    from bwstack.images.render import render
    from bwstack.recipes import load_recipe

    loaded = load_recipe(recipe)
    rendered = render(loaded, arch, repo=repo)
    model_name = loaded.serve.model.rstrip("/").split("/")[-1]
    return FleetSpec(
        recipe=loaded.name,
        arch=rendered.arch.name,
        cc=rendered.arch.cc,
        cuda=str(loaded.cuda_version),
        tp=loaded.serve.tp,
        image=image or rendered.tag,
        model_dir=model_dir or f"/models/{model_name}",
        runner_image=runner_image,
        namespace=namespace,
    )


def names_registry(reference: str) -> bool:
    """Whether an image reference starts with a registry host, by Docker's rule: a first path component
    holding '.' or ':', or 'localhost'. Without one, `bwstack:tag` means docker.io/library/bwstack:tag."""
    first, slash, _ = reference.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def fleet_warnings(spec: FleetSpec) -> list[str]:
    """One line per image every node would have to pull from Docker Hub because it names no registry."""
    return [
        f"{what} {reference} names no registry: every node will try to pull it from Docker Hub "
        f"(docker.io/{'' if '/' in reference.split(':')[0] else 'library/'}{reference}); unless it is preloaded "
        f"on every node, push it to your registry and pass {flag}"
        for what, reference, flag in (
            ("image", spec.image, "--repo REGISTRY/PATH (or --image REGISTRY/PATH:TAG)"),
            ("runner image", spec.runner_image, "--runner REGISTRY/PATH:TAG"),
        )
        if not names_registry(reference)
    ]


def _environment() -> jinja2.Environment:
    return strict_environment(TEMPLATES_DIR)


def render_fleet(spec: FleetSpec) -> dict[str, str]:
    """File name -> rendered text, each validated; RenderError names the file and every problem."""
    if not DNS_LABEL.match(spec.name) or not DNS_LABEL.match(spec.namespace):
        raise RenderError(f"{spec.name!r} / namespace {spec.namespace!r}: not valid Kubernetes names (RFC 1123 labels)")
    if spec.tp < 1:
        raise RenderError(f"tp must be >= 1, got {spec.tp}")
    if not spec.model_dir.startswith("/"):
        raise RenderError(
            f"model folder {spec.model_dir!r} is not an absolute path: a Kubernetes hostPath and Ansible need one",
            remedy=f"pass --model-dir /path/on/every/node, e.g. /models/{spec.model_dir.rstrip('/').split('/')[-1]}",
        )
    normal = posixpath.normpath(spec.model_dir)
    taken = {DOCKER_SOCKET, spec.report_dir}
    if (
        normal != spec.model_dir.rstrip("/")
        or normal == "/"
        or any(normal == t or t.startswith(normal + "/") or normal.startswith(t + "/") for t in taken)
    ):
        raise RenderError(
            f"model folder {spec.model_dir!r} cannot be mounted: it must be a plain absolute path (no '..', not '/')"
            f" apart from the pod's other mounts ({', '.join(sorted(taken))})",
            remedy="pass --model-dir the checkpoint folder's real path on the nodes, e.g. /models/Kimi-K2.5",
        )
    env = _environment()
    files = {}
    for name in (DAEMONSET, PLAYBOOK):
        try:
            files[name] = env.get_template(f"{name}.j2").render(spec=spec)
        except jinja2.TemplateError as error:
            raise RenderError(f"{TEMPLATES_DIR / (name + '.j2')}: {error}") from None
    for name, check in ((DAEMONSET, validate_daemonset), (PLAYBOOK, validate_playbook)):
        problems = check(files[name], spec)
        if problems:
            raise RenderError(f"rendered {name} is invalid: " + "; ".join(problems))
    return files


def write_fleet(spec: FleetSpec, out: Path) -> list[Path]:
    """Write <out>/fleet/<recipe>-<arch>/{daemonset.yaml, playbook.yml}; return the paths."""
    files = render_fleet(spec)  # first: a spec that does not render leaves nothing behind
    folder = out / "fleet" / f"{spec.recipe}-{spec.arch}"
    written = []
    with writing(folder, error=RenderError, remedy="pass --out a writable folder"):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = folder / name
            path.write_text(text)
            written.append(path)
    return written
