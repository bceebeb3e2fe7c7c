"""Fleet manifests rendered from the recipe: a Kubernetes DaemonSet and an Ansible playbook."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from bwstack.errors import RenderError
from bwstack.nodes import fleet
from bwstack.nodes.fleet import FleetSpec, render_fleet, spec_for_recipe, validate_daemonset, validate_playbook
from bwstack.recipes import load_recipe


@pytest.fixture(scope="module")
def spec() -> FleetSpec:
    return spec_for_recipe("sglang", arch="sm120")


@pytest.fixture(scope="module")
def files(spec: FleetSpec) -> dict[str, str]:
    return render_fleet(spec)


def test_spec_comes_from_the_recipe(spec: FleetSpec) -> None:
    recipe = load_recipe("sglang")
    assert (spec.recipe, spec.arch, spec.cc, spec.tp) == ("sglang", "sm120", (12, 0), recipe.serve.tp)
    assert spec.cuda == str(recipe.cuda_version)
    assert spec.image.startswith("bwstack:sglang-sm120-cuda13.1-")
    assert spec.model_dir == "/models/Kimi-K2.5"


def test_daemonset_targets_gpu_nodes_of_the_arch(spec: FleetSpec, files: dict[str, str]) -> None:
    doc = yaml.safe_load(files[fleet.DAEMONSET])
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == ("apps/v1", "DaemonSet", "bwstack-sglang-sm120")
    pod = doc["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    match = {e["key"]: (e["operator"], e.get("values")) for e in terms[0]["matchExpressions"]}
    assert match == {
        "nvidia.com/gpu.present": ("In", ["true"]),
        "nvidia.com/gpu.compute.major": ("In", ["12"]),
        "nvidia.com/gpu.compute.minor": ("In", ["0"]),
        "nvidia.com/gpu.count": ("Gt", ["7"]),
        "bwstack/no-docker": ("DoesNotExist", None),
    }
    preflight, provision = pod["initContainers"]
    assert preflight["command"] == spec.preflight_command
    assert preflight["command"][:4] == ["bwstack", "preflight", "--recipe", "sglang"]
    assert provision["command"][:4] == ["bwstack", "provision", "--image", spec.image]
    assert preflight["resources"]["limits"]["nvidia.com/gpu"] == 8 == provision["resources"]["limits"]["nvidia.com/gpu"]
    assert validate_daemonset(files[fleet.DAEMONSET], spec) == []


def test_pods_see_what_provision_starts_on_the_node(spec: FleetSpec, files: dict[str, str]) -> None:
    """provision runs the server through the node's Docker with host networking and a bind mount of the model,
    probes 127.0.0.1 and follows the server by its host PID: the pod must share all of that with the node."""
    pod = yaml.safe_load(files[fleet.DAEMONSET])["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["hostPID"] is True
    assert pod["hostIPC"] is True  # the node's /dev/shm, which the server gets too: host.shm measures that one
    assert not any(m["mountPath"] == "/dev/shm" for c in pod["initContainers"] for m in c["volumeMounts"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["initContainers"]:
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        socket = volumes[mounts["/var/run/docker.sock"]["name"]]
        assert socket["hostPath"] == {"path": "/var/run/docker.sock", "type": "Socket"}
        model = mounts[spec.model_dir]
        assert volumes[model["name"]]["hostPath"] == {"path": spec.model_dir, "type": "Directory"}
        assert model["readOnly"] is True


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("hostNetwork: true", "hostNetwork: false"), "hostNetwork must be True"),
        (("\n      dnsPolicy: ClusterFirstWithHostNet", ""), "dnsPolicy must be 'ClusterFirstWithHostNet'"),
        (("hostPID: true", "hostPID: false"), "hostPID must be True"),
        (("type: Socket", "type: DirectoryOrCreate"), "provision: no hostPath /var/run/docker.sock (type Socket)"),
        (("mountPath: /var/run/docker.sock", "mountPath: /run/docker.sock"), "preflight: no hostPath"),
        (
            ('mountPath: "/models/Kimi-K2.5"', 'mountPath: "/model"'),
            "provision: the model folder /models/Kimi-K2.5 must be the node's /models/Kimi-K2.5",
        ),
        (('path: "/models/Kimi-K2.5"', 'path: "/srv/Kimi-K2.5"'), "mounted at the same path"),
    ],
)
def test_validator_requires_the_node_access_provision_needs(
    spec: FleetSpec, files: dict[str, str], edit: tuple[str, str], problem: str
) -> None:
    old, new = edit
    assert old in files[fleet.DAEMONSET]
    problems = validate_daemonset(files[fleet.DAEMONSET].replace(old, new), spec)
    assert any(problem in p for p in problems), problems


def test_daemonset_passes_the_kubernetes_schema(files: dict[str, str]) -> None:
    kubernetes_validate.validate(yaml.safe_load(files[fleet.DAEMONSET]), "1.30", strict=True)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("hostPID: true", "hostPID: yes-please"), "$.spec.template.spec.hostPID: 'yes-please' is not of type"),
        (("hostPID: true", "hostPid: true"), "Additional properties are not allowed ('hostPid' was unexpected)"),
        (("kind: DaemonSet", "kind: DaemonSett"), "Couldn't find schema for kind DaemonSett"),
        (("apiVersion: apps/v1", "apiVersion: apps/v2"), "Couldn't find schema for kind DaemonSet with api version"),
    ],
)
def test_schema_problems_come_from_the_kubernetes_schema(
    spec: FleetSpec, files: dict[str, str], edit: tuple[str, str], problem: str
) -> None:
    """Structure, types and unknown fields are the schema's to judge; the bwstack rules do not run on them."""
    old, new = edit
    assert old in files[fleet.DAEMONSET]
    (found,) = validate_daemonset(files[fleet.DAEMONSET].replace(old, new), spec)
    assert problem in found


def test_a_manifest_without_kind_is_named_not_crashed_on(spec: FleetSpec) -> None:
    assert validate_daemonset("apiVersion: apps/v1\nmetadata: {name: x}\n", spec) == ["no kind"]


def test_playbook_runs_preflight_then_provision_with_the_recipe_values(spec: FleetSpec, files: dict[str, str]) -> None:
    (play,) = yaml.safe_load(files[fleet.PLAYBOOK])
    assert play["vars"]["bwstack_recipe"] == "sglang" and play["vars"]["bwstack_tp"] == 8
    assert play["vars"]["bwstack_image"] == spec.image
    (block,) = [t for t in play["tasks"] if "block" in t]
    steps = [t["ansible.builtin.command"]["argv"][1] for t in block["block"]]
    assert steps == ["preflight", "provision"]
    assert block["always"][0]["ansible.builtin.fetch"]["fail_on_missing"] is False
    assert validate_playbook(files[fleet.PLAYBOOK], spec) == []


def test_validators_catch_broken_manifests(spec: FleetSpec, files: dict[str, str]) -> None:
    daemonset = files[fleet.DAEMONSET]
    problems = validate_daemonset(daemonset.replace("nvidia.com/gpu: 8", "nvidia.com/gpu: 1", 1), spec)
    assert problems == ["preflight: resources.limits nvidia.com/gpu must be 8"]
    problems = validate_daemonset(daemonset.replace("hostIPC: true", "hostIPC: false"), spec)
    assert any("/dev/shm" in p for p in problems)
    problems = validate_daemonset(daemonset.replace("nvidia.com/gpu.present", "example.com/gpu"), spec)
    assert "no node affinity or nodeSelector on nvidia.com/gpu.present" in problems
    assert validate_daemonset("kind: [", spec)[0].startswith("daemonset.yaml is not YAML")

    playbook = files[fleet.PLAYBOOK]
    problems = validate_playbook(playbook.replace("{{ bwstack_reports }}/preflight.json", "{{ reports }}/p.json"), spec)
    assert problems == ["play 0: uses undefined variable 'reports'"]
    problems = validate_playbook(playbook.replace("ansible.builtin.fetch", "fetch"), spec)
    assert len(problems) == 1 and "found ['fetch']" in problems[0]
    problems = validate_playbook(playbook.replace("- preflight\n", "- prefight\n"), spec)
    assert problems == ["play 0: no task runs `bwstack preflight`"]


def test_render_refuses_names_kubernetes_would_reject(spec: FleetSpec) -> None:
    with pytest.raises(RenderError, match="not valid Kubernetes names"):
        render_fleet(dataclasses.replace(spec, recipe="SGLang_v2"))


@pytest.mark.parametrize(
    ("reference", "registry"),
    [
        ("bwstack:sglang-sm120-cuda13.1-abc", False),
        ("bwstack-runner:latest", False),
        ("myorg/bwstack:1", False),  # Docker Hub's myorg
        ("registry.example.com/ml/bwstack:1", True),
        ("localhost:5000/bwstack:1", True),
        ("localhost/bwstack", True),
        ("10.0.0.7:5000/bwstack@sha256:" + "0" * 64, True),
        ("docker.io/library/python:3.12", True),
    ],
)
def test_names_registry_follows_dockers_rule(reference: str, registry: bool) -> None:
    assert fleet.names_registry(reference) is registry


def test_default_images_without_a_registry_are_warned_about(spec: FleetSpec) -> None:
    image, runner = fleet.fleet_warnings(spec)
    assert image.startswith(f"image {spec.image} names no registry: every node will try to pull it from Docker Hub")
    assert f"(docker.io/library/{spec.image})" in image
    assert runner.startswith("runner image bwstack-runner:latest names no registry")
    pushed = spec_for_recipe(
        "sglang", arch="sm120", repo="registry.example.com/ml/bwstack", runner_image="registry.example.com/r:1"
    )
    assert fleet.fleet_warnings(pushed) == []


@pytest.mark.parametrize("model_dir", ["models/Kimi-K2.5", "./Kimi-K2.5", "~/models", ""])
def test_render_refuses_a_relative_model_folder(spec: FleetSpec, model_dir: str) -> None:
    with pytest.raises(RenderError, match="is not an absolute path: a Kubernetes hostPath and Ansible need one"):
        render_fleet(dataclasses.replace(spec, model_dir=model_dir))


def test_write_fleet(spec: FleetSpec, tmp_path: Path) -> None:
    written = fleet.write_fleet(spec, tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "fleet/sglang-sm120/daemonset.yaml",
        "fleet/sglang-sm120/playbook.yml",
    ]


@pytest.mark.parametrize(
    "model_dir", ["/models/../etc", "/", "/var/run/docker.sock", "/var/run", "/var/lib/bwstack", "/models//x"]
)
def test_render_refuses_a_model_folder_kubernetes_or_the_pod_cannot_mount(spec: FleetSpec, model_dir: str) -> None:
    with pytest.raises(RenderError, match="cannot be mounted"):
        render_fleet(dataclasses.replace(spec, model_dir=model_dir))


def test_an_unwritable_out_folder_is_a_render_error(spec: FleetSpec, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RenderError, match=r"cannot write .*: Not a directory"):
        fleet.write_fleet(spec, blocker)
