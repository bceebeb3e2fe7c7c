"""Fleets: the same preflight + provision, run by an existing engine on many nodes.

Renders, from a recipe and an arch, a Kubernetes DaemonSet (one pod per GPU node whose GPU Feature
Discovery labels match the arch and tp) and an Ansible playbook for bare metal. Both are validated
after rendering (YAML parses, required fields present, every name they use defined), so a template
mistake fails `invoke fleet`, not a rollout.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from bwstack.errors import RenderError
from bwstack.recipes.archs import CC
from bwstack.templating import strict_environment

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates" / "fleet"
DAEMONSET = "daemonset.yaml"
PLAYBOOK = "playbook.yml"
DEFAULT_RUNNER = "bwstack-runner:latest"
DEFAULT_REPORTS = "/var/lib/bwstack/reports"
DOCKER_SOCKET = "/var/run/docker.sock"
NO_DOCKER_LABEL = "bwstack/no-docker"  # label a node without Docker with it to keep the DaemonSet off it

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_QUANTITY = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")


@dataclass(frozen=True)
class FleetSpec:
    """Everything the fleet manifests say; built from a recipe by `spec_for_recipe`."""

    recipe: str
    arch: str  # "sm120"
    cc: CC
    cuda: str
    tp: int
    image: str  # the stack image provision verifies and smoke-tests
    model_dir: str  # the checkpoint folder, at the same path on every node
    runner_image: str = DEFAULT_RUNNER  # an image holding bwstack (repo + venv) that runs the checks
    namespace: str = "bwstack"
    report_dir: str = DEFAULT_REPORTS
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"bwstack-{self.recipe}-{self.arch}"

    @property
    def cc_str(self) -> str:
        return f"{self.cc[0]}.{self.cc[1]}"

    @property
    def preflight_command(self) -> list[str]:
        return [
            "bwstack",
            "preflight",
            "--recipe",
            self.recipe,
            "--arch",
            self.arch,
            "--tp",
            str(self.tp),
            "--model",
            self.model_dir,
            "--json",
            f"{self.report_dir}/preflight.json",
        ]

    @property
    def provision_command(self) -> list[str]:
        return [
            "bwstack",
            "provision",
            "--image",
            self.image,
            "--model",
            self.model_dir,
            "--recipe",
            self.recipe,
            "--json",
            f"{self.report_dir}/provision.json",
        ]


def spec_for_recipe(
    recipe: str,
    *,
    arch: str,
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
    if not _DNS_LABEL.match(spec.name) or not _DNS_LABEL.match(spec.namespace):
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
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = folder / name
            path.write_text(text)
            written.append(path)
    except OSError as error:
        raise RenderError(
            f"cannot write {folder}: {error.strerror or error}", remedy="pass --out a writable folder"
        ) from None
    return written


# --- validation ------------------------------------------------------------------------------------------


def _get(doc: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def _load(text: str, what: str) -> tuple[Any, list[str]]:
    try:
        return yaml.safe_load(text), []
    except yaml.YAMLError as error:
        return None, [f"{what} is not YAML: {' '.join(str(error).split())}"]


def validate_daemonset(text: str, spec: FleetSpec) -> list[str]:
    """Required fields of a DaemonSet that runs preflight + provision on GPU nodes; [] when valid."""
    doc, problems = _load(text, DAEMONSET)
    if problems:
        return problems
    if not isinstance(doc, dict):
        return ["not a mapping"]
    expect = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata.name": spec.name,
        "metadata.namespace": spec.namespace,
    }
    problems += [f"{k} is {_get(doc, k)!r}, expected {v!r}" for k, v in expect.items() if _get(doc, k) != v]
    selector = _get(doc, "spec.selector.matchLabels") or {}
    labels = _get(doc, "spec.template.metadata.labels") or {}
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        problems.append("spec.selector.matchLabels must be non-empty and match the pod template's labels")
    pod = _get(doc, "spec.template.spec") or {}
    terms = _get(pod, "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms") or []
    keys = {e.get("key"): e for t in terms for e in t.get("matchExpressions", [])}
    if "nvidia.com/gpu.present" not in keys and "nvidia.com/gpu.present" not in (pod.get("nodeSelector") or {}):
        problems.append("no node affinity or nodeSelector on nvidia.com/gpu.present")
    major = keys.get("nvidia.com/gpu.compute.major", {}).get("values")
    if major != [str(spec.cc[0])]:
        problems.append(f"node affinity nvidia.com/gpu.compute.major is {major!r}, expected ['{spec.cc[0]}']")
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    containers = {c.get("name"): c for c in (pod.get("initContainers") or []) + (pod.get("containers") or [])}
    for step in ("preflight", "provision"):
        container = containers.get(step)
        if container is None:
            problems.append(f"no {step} container")
            continue
        if not container.get("image"):
            problems.append(f"{step}: no image")
        if (
            _get(container, "resources.limits") is None
            or container["resources"]["limits"].get("nvidia.com/gpu") != spec.tp
        ):
            problems.append(f"{step}: resources.limits nvidia.com/gpu must be {spec.tp}")
        command = container.get("command") or []
        if command[:2] != ["bwstack", step] or spec.recipe not in command:
            problems.append(f"{step}: command {command!r} does not run `bwstack {step} --recipe {spec.recipe}`")
    step_order = [c.get("name") for c in pod.get("initContainers") or []]
    if step_order[:2] != ["preflight", "provision"]:
        problems.append(f"initContainers run {step_order}, expected preflight before provision")
    for container in containers.values():
        for mount in container.get("volumeMounts") or []:
            if mount.get("name") not in volumes:
                problems.append(f"{container.get('name')}: mounts undefined volume {mount.get('name')!r}")
    shm = [
        m
        for c in containers.values()
        for m in c.get("volumeMounts") or []
        if m.get("mountPath") == "/dev/shm" and _get(volumes.get(m.get("name")), "emptyDir.medium") == "Memory"
    ]
    if not pod.get("hostIPC") and not shm:
        problems.append("neither hostIPC nor a memory-backed /dev/shm: NCCL between ranks breaks on 64 MB")
    problems += _host_access_problems(pod, containers, volumes, spec)
    size = _get(volumes.get("dshm"), "emptyDir.sizeLimit")
    if size is not None and not _QUANTITY.match(str(size)):
        problems.append(f"/dev/shm sizeLimit {size!r} is not a Kubernetes quantity")
    if pod.get("restartPolicy", "Always") != "Always":
        problems.append("a DaemonSet's pods must use restartPolicy Always")
    return problems


def _host_access_problems(
    pod: dict[str, Any], containers: dict[str, Any], volumes: dict[str, Any], spec: FleetSpec
) -> list[str]:
    """What provision needs of the node from inside the pod: its network, PIDs, Docker and the model's path."""
    problems = [
        f"spec.template.spec.{key} must be {want!r} ({why})"
        for key, want, why in (
            ("hostNetwork", True, "provision probes the server it starts with host networking at 127.0.0.1"),
            ("dnsPolicy", "ClusterFirstWithHostNet", "with hostNetwork, cluster DNS needs it"),
            ("hostPID", True, "smoke follows the server by its host PID"),
        )
        if pod.get(key) != want
    ]
    for step in ("preflight", "provision"):
        mounts = {m.get("mountPath"): m for m in (containers.get(step) or {}).get("volumeMounts") or []}
        socket = _get(volumes.get((mounts.get(DOCKER_SOCKET) or {}).get("name")), "hostPath") or {}
        if socket != {"path": DOCKER_SOCKET, "type": "Socket"}:
            problems.append(f"{step}: no hostPath {DOCKER_SOCKET} (type Socket) mounted at {DOCKER_SOCKET}")
        model = _get(volumes.get((mounts.get(spec.model_dir) or {}).get("name")), "hostPath.path")
        if model != spec.model_dir:
            problems.append(
                f"{step}: the model folder {spec.model_dir} must be the node's {spec.model_dir}, mounted at the same "
                f"path (Docker resolves provision's bind mount on the node), found {model!r}"
            )
    return problems


_ANSIBLE_MODULES = {
    "ansible.builtin.file",
    "ansible.builtin.unarchive",
    "ansible.builtin.pip",
    "ansible.builtin.command",
    "ansible.builtin.fetch",
}
_TASK_KEYWORDS = {
    "name",
    "register",
    "changed_when",
    "failed_when",
    "loop",
    "when",
    "block",
    "always",
    "rescue",
    "become",
    "args",
}
_ANSIBLE_NAMES = {"item", "inventory_hostname", "bwstack_hosts", "bwstack_serial", "default"}
_VARIABLE = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)")


def _tasks(tasks: list[Any], where: str, problems: list[str]) -> list[dict[str, Any]]:
    flat = []
    for i, task in enumerate(tasks):
        here = f"{where}[{i}]"
        if not isinstance(task, dict) or not task.get("name"):
            problems.append(f"{here}: every task needs a name")
            continue
        flat.append(task)
        if "block" in task:
            for part in ("block", "rescue", "always"):
                flat += _tasks(task.get(part) or [], f"{here}.{part}", problems)
            continue
        modules = [k for k in task if k not in _TASK_KEYWORDS]
        if len(modules) != 1 or modules[0] not in _ANSIBLE_MODULES:
            problems.append(f"{here} {task['name']!r}: expected one of {sorted(_ANSIBLE_MODULES)}, found {modules}")
        elif modules[0] == "ansible.builtin.command" and not isinstance(_get(task[modules[0]], "argv"), list):
            problems.append(f"{here} {task['name']!r}: commands take argv lists (no shell quoting)")
    return flat


def validate_playbook(text: str, spec: FleetSpec) -> list[str]:
    """Required fields of the bare-metal playbook; every {{ variable }} it uses must be defined."""
    doc, problems = _load(text, PLAYBOOK)
    if problems:
        return problems
    if not isinstance(doc, list) or not doc:
        return ["a playbook is a non-empty list of plays"]
    for p, play in enumerate(doc):
        if not isinstance(play, dict):
            problems.append(f"play {p} is not a mapping")
            continue
        for key in ("name", "hosts", "tasks", "vars"):
            if not play.get(key):
                problems.append(f"play {p}: no {key}")
        variables = play.get("vars") or {}
        expect = {
            "bwstack_recipe": spec.recipe,
            "bwstack_arch": spec.arch,
            "bwstack_tp": spec.tp,
            "bwstack_image": spec.image,
            "bwstack_model_dir": spec.model_dir,
        }
        problems += [
            f"play {p}: vars.{k} is {variables.get(k)!r}, expected {v!r}"
            for k, v in expect.items()
            if variables.get(k) != v
        ]
        tasks = _tasks(play.get("tasks") or [], f"play {p} tasks", problems)
        registered = {t["register"] for t in tasks if "register" in t}
        known = set(variables) | registered | _ANSIBLE_NAMES
        used = set(_VARIABLE.findall(yaml.safe_dump(play)))
        problems += [f"play {p}: uses undefined variable {name!r}" for name in sorted(used - known)]
        commands = [" ".join(map(str, (t.get("ansible.builtin.command") or {}).get("argv") or [])) for t in tasks]
        for step in ("preflight", "provision"):
            if not any(f"bin/bwstack {step}" in c for c in commands):
                problems.append(f"play {p}: no task runs `bwstack {step}`")
    return problems
