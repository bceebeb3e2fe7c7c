"""Checks of the rendered fleet manifests, so that a template mistake fails `invoke fleet`, not a rollout.

The DaemonSet's structure and types are checked against the Kubernetes API schema by kubernetes-validate;
what the schema cannot say (the API server's cross-references, and what bwstack's pods need of the node)
is a table of rules. The playbook's tasks must use known modules and every {{ variable }} must be defined.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import kubernetes_validate
import yaml

from bwstack.nodes.fleet_spec import DAEMONSET, DOCKER_SOCKET, PLAYBOOK, FleetSpec

KUBERNETES_VERSION = "1.30"  # the oldest Kubernetes whose schema the DaemonSet must pass
_QUANTITY = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")


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


def _schema_problems(doc: dict[str, Any]) -> list[str]:
    """What the Kubernetes API schema (strict: unknown fields too) says; the first error only, as the
    library reports one at a time."""
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"Kubernetes {KUBERNETES_VERSION} schema: {error.json_path}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [error.message]
    except KeyError as missing:  # the library indexes apiVersion and kind before it validates
        return [f"no {missing.args[0]}"]
    return []


@dataclass(frozen=True)
class _Pod:
    """A schema-valid DaemonSet, indexed the way the bwstack rules read it."""

    doc: dict[str, Any]
    spec: dict[str, Any]  # spec.template.spec
    containers: dict[str, dict[str, Any]]  # init containers and containers by name
    volumes: dict[str, dict[str, Any]]
    affinity: dict[str, dict[str, Any]]  # required node-affinity expressions by label key

    @classmethod
    def of(cls, doc: dict[str, Any]) -> _Pod:
        pod = _get(doc, "spec.template.spec") or {}
        terms = _get(pod, "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms")
        return cls(
            doc=doc,
            spec=pod,
            containers={c["name"]: c for c in (pod.get("initContainers") or []) + (pod.get("containers") or [])},
            volumes={v["name"]: v for v in pod.get("volumes") or []},
            affinity={e["key"]: e for t in terms or [] for e in t.get("matchExpressions") or []},
        )

    def mounts(self, container: str) -> dict[str, dict[str, Any]]:
        """mountPath -> the volume mounted there (an empty mapping for an undefined one)."""
        mounts = (self.containers.get(container) or {}).get("volumeMounts") or []
        return {m["mountPath"]: self.volumes.get(m["name"]) or {} for m in mounts}


STEPS = ("preflight", "provision")  # the init containers, in the order they must run

# Fields the DaemonSet must carry, with why: provision runs the server through the node's Docker with host
# networking, probes 127.0.0.1 and follows the server by its host PID.
_REQUIRED_FIELDS = (
    ("spec.template.spec.hostNetwork", True, "provision probes the server it starts with host networking at 127.0.0.1"),
    ("spec.template.spec.dnsPolicy", "ClusterFirstWithHostNet", "with hostNetwork, cluster DNS needs it"),
    ("spec.template.spec.hostPID", True, "smoke follows the server by its host PID"),
)


def _identity(pod: _Pod, spec: FleetSpec) -> list[str]:
    expect = {"metadata.name": spec.name, "metadata.namespace": spec.namespace}
    return [f"{k} is {_get(pod.doc, k)!r}, expected {v!r}" for k, v in expect.items() if _get(pod.doc, k) != v] + [
        f"{key} must be {want!r} ({why})" for key, want, why in _REQUIRED_FIELDS if _get(pod.doc, key) != want
    ]


def _selects_its_pods(pod: _Pod, spec: FleetSpec) -> list[str]:
    """The API server's rule (not in the schema): the selector must match the template's labels."""
    selector = _get(pod.doc, "spec.selector.matchLabels") or {}
    labels = _get(pod.doc, "spec.template.metadata.labels") or {}
    if selector and all(labels.get(k) == v for k, v in selector.items()):
        return []
    return ["spec.selector.matchLabels must be non-empty and match the pod template's labels"]


def _gpu_nodes_of_the_arch(pod: _Pod, spec: FleetSpec) -> list[str]:
    problems = []
    if "nvidia.com/gpu.present" not in pod.affinity and "nvidia.com/gpu.present" not in (
        pod.spec.get("nodeSelector") or {}
    ):
        problems.append("no node affinity or nodeSelector on nvidia.com/gpu.present")
    major = (pod.affinity.get("nvidia.com/gpu.compute.major") or {}).get("values")
    if major != [str(spec.cc[0])]:
        problems.append(f"node affinity nvidia.com/gpu.compute.major is {major!r}, expected ['{spec.cc[0]}']")
    return problems


def _step_problems(step: str, container: dict[str, Any] | None, spec: FleetSpec) -> list[str]:
    if container is None:
        return [f"no {step} container"]
    problems = [] if container.get("image") else [f"{step}: no image"]
    if (_get(container, "resources.limits") or {}).get("nvidia.com/gpu") != spec.tp:
        problems.append(f"{step}: resources.limits nvidia.com/gpu must be {spec.tp}")
    command = container.get("command") or []
    if command[:2] != ["bwstack", step] or spec.recipe not in command:
        problems.append(f"{step}: command {command!r} does not run `bwstack {step} --recipe {spec.recipe}`")
    return problems


def _steps(pod: _Pod, spec: FleetSpec) -> list[str]:
    problems = [p for step in STEPS for p in _step_problems(step, pod.containers.get(step), spec)]
    order = [c["name"] for c in pod.spec.get("initContainers") or []]
    if tuple(order[: len(STEPS)]) != STEPS:
        problems.append(f"initContainers run {order}, expected preflight before provision")
    return problems


def _volumes_defined(pod: _Pod, spec: FleetSpec) -> list[str]:
    """The API server's rule (not in the schema): every mount names a volume of the pod."""
    return [
        f"{name}: mounts undefined volume {mount['name']!r}"
        for name, container in pod.containers.items()
        for mount in container.get("volumeMounts") or []
        if mount["name"] not in pod.volumes
    ]


def _shared_memory(pod: _Pod, spec: FleetSpec) -> list[str]:
    """NCCL between ranks needs more than Docker's 64 MB /dev/shm (docs/facts.md section 6)."""
    in_memory = any(_get(pod.mounts(name).get("/dev/shm"), "emptyDir.medium") == "Memory" for name in pod.containers)
    problems = (
        []
        if pod.spec.get("hostIPC") or in_memory
        else ["neither hostIPC nor a memory-backed /dev/shm: NCCL between ranks breaks on 64 MB"]
    )
    size = _get(pod.volumes.get("dshm"), "emptyDir.sizeLimit")
    if size is not None and not _QUANTITY.match(str(size)):  # the schema lets any string through
        problems.append(f"/dev/shm sizeLimit {size!r} is not a Kubernetes quantity")
    if pod.spec.get("restartPolicy") not in (None, "Always"):
        problems.append("a DaemonSet's pods must use restartPolicy Always")
    return problems


def _node_paths(pod: _Pod, spec: FleetSpec) -> list[str]:
    """provision's containers are started by the node's Docker, which resolves bind mounts on the node."""
    problems = []
    for step in STEPS:
        mounts = pod.mounts(step)
        if _get(mounts.get(DOCKER_SOCKET), "hostPath") != {"path": DOCKER_SOCKET, "type": "Socket"}:
            problems.append(f"{step}: no hostPath {DOCKER_SOCKET} (type Socket) mounted at {DOCKER_SOCKET}")
        model = _get(mounts.get(spec.model_dir), "hostPath.path")
        if model != spec.model_dir:
            problems.append(
                f"{step}: the model folder {spec.model_dir} must be the node's {spec.model_dir}, mounted at the same "
                f"path (Docker resolves provision's bind mount on the node), found {model!r}"
            )
    return problems


# bwstack's own rules, and the API server's that the schema cannot express; each returns its problems.
DAEMONSET_RULES = (
    _identity,
    _selects_its_pods,
    _gpu_nodes_of_the_arch,
    _steps,
    _volumes_defined,
    _shared_memory,
    _node_paths,
)


def validate_daemonset(text: str, spec: FleetSpec) -> list[str]:
    """Problems of a DaemonSet that runs preflight + provision on GPU nodes; [] when valid. Structure and
    types are the Kubernetes schema's job; the rules run on a schema-valid document only."""
    doc, problems = _load(text, DAEMONSET)
    if problems:
        return problems
    if not isinstance(doc, dict):
        return ["not a mapping"]
    problems = _schema_problems(doc)
    if problems:
        return problems
    pod = _Pod.of(doc)
    return [problem for rule in DAEMONSET_RULES for problem in rule(pod, spec)]


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
