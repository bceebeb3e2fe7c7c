"""`invoke preflight` and `invoke fleet` as an operator runs them here: no GPU, no NVML library, a Docker engine."""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from bwstack.nodes.preflight.host import HostFacts, check_docker, read_host
from bwstack.nodes.preflight.host import HostPaths as Paths
from bwstack.report import Status
from tests.helpers import invoke


def _has_nvml() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_has_nvml(), reason="this machine has an NVIDIA driver")
def test_preflight_without_a_driver_exits_1_with_a_driver_finding(tmp_path: Path) -> None:
    out = tmp_path / "preflight.json"
    junit = tmp_path / "preflight.xml"
    result = invoke("preflight", "--arch", "sm120", "--no-docker", "--json", str(out), "--junit", str(junit))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "no NVIDIA driver: libnvidia-ml.so.1 cannot be" in " ".join(result.stdout.split())
    report = json.loads(out.read_text())
    driver = report["checks"][0]
    assert (driver["name"], driver["status"]) == ("driver", "fail")
    assert driver["evidence"]["error"] == "NVMLError_LibraryNotFound"
    assert report["request"] == {
        "recipe": "sglang",
        "cuda": "13.1.0",
        "archs": ["sm120"],
        "tp": 8,
        "model": None,
        "kv_headroom": 0.2,
        "docker": False,
        "gpus": True,
    }
    assert '<failure message="no NVIDIA driver' in junit.read_text()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--tp", "-1"), "--tp must be at least 1, got -1"),
        (("--arch", "sm75"), "unknown arch 'sm75'"),
        (("--arch", "sm89"), "recipe sglang does not build sm89"),
        (("--recipe", "nope"), "unknown recipe 'nope'"),
        (("--model", "/nonexistent/model"), "model folder /nonexistent/model does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: tuple[str, ...], fragment: str) -> None:
    result = invoke("preflight", "--no-docker", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("bwstack: error: ") and fragment in line


def test_fleet_task_writes_validated_manifests(tmp_path: Path) -> None:
    result = invoke("fleet", "--arch", "sm120", "--out", str(tmp_path), "--image", "registry.local/sglang:test")
    assert result.returncode == 0, result.stdout + result.stderr
    written = [Path(line) for line in result.stdout.split()]
    assert [p.name for p in written] == ["daemonset.yaml", "playbook.yml"]
    assert "registry.local/sglang:test" in written[0].read_text()


def test_fleet_warns_about_images_every_node_would_pull_from_docker_hub(tmp_path: Path) -> None:
    result = invoke("fleet", "--arch", "sm120", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = result.stderr.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("bwstack: warning: ") for w in warnings)
    assert "image bwstack:sglang-sm120-cuda13.1-" in warnings[0] and "names no registry" in warnings[0]
    assert "pass --repo REGISTRY/PATH" in warnings[0]
    assert "runner image bwstack-runner:latest names no registry" in warnings[1] and "--runner" in warnings[1]

    result = invoke(
        "fleet",
        "--arch",
        "sm120",
        "--out",
        str(tmp_path),
        "--repo",
        "registry.example.com/ml/bwstack",
        "--runner",
        "registry.example.com/ml/bwstack-runner:1",
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert (
        "registry.example.com/ml/bwstack:sglang-sm120-" in (tmp_path / "fleet/sglang-sm120/daemonset.yaml").read_text()
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((), "no --arch given (e.g. --arch sm120)"),
        (("--arch", "sm120", "--model-dir", "models/Kimi-K2.5"), "model folder 'models/Kimi-K2.5' is not an absolute"),
        (("--arch", "sm120", "--model-dir", "~/models/Kimi"), "(remedy: pass --model-dir /path/on/every/node"),
    ],
)
def test_fleet_bad_input_exits_2_with_one_line(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    result = invoke("fleet", "--out", str(tmp_path), *args)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("bwstack: error: ") and fragment in line
    assert not (tmp_path / "fleet").exists()


def test_docker_check_accepts_a_runtime_or_a_cdi_spec(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    paths = Paths(iommu_class=tmp_path / "none", iommu_groups=tmp_path / "none", cdi_dirs=(cdi,))
    info = {"ServerVersion": "28.1.1", "Runtimes": {"runc": {"path": "runc"}}, "DefaultRuntime": "runc"}
    facts = read_host(paths, disk_path=tmp_path, docker_info=lambda: info)
    assert facts.iommu_enabled is None
    failed = check_docker(facts)
    assert failed.status is Status.FAIL and "no NVIDIA runtime (runtimes: runc)" in failed.finding
    (cdi / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    with_cdi = check_docker(read_host(paths, disk_path=tmp_path, docker_info=lambda: info))
    assert with_cdi.status is Status.PASS and "CDI spec" in with_cdi.finding
    runtime = info | {"Runtimes": {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}}}
    with_runtime = check_docker(read_host(Paths(cdi_dirs=()), disk_path=tmp_path, docker_info=lambda: runtime))
    assert with_runtime.status is Status.PASS and with_runtime.finding == "Docker 28.1.1 with runtime nvidia"


def _refuse() -> dict:
    raise ConnectionError("Error while fetching server API version: connection refused")


@pytest.fixture
def dead_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A unix socket nobody answers on (a short path: sun_path holds 108 bytes); DOCKER_HOST unset."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with tempfile.TemporaryDirectory(dir="/tmp") as folder, socket.socket(socket.AF_UNIX) as listener:
        path = Path(folder) / "docker.sock"
        listener.bind(str(path))
        yield path


def test_unreachable_docker_is_a_failed_check(tmp_path: Path, dead_socket: Path) -> None:
    facts: HostFacts = read_host(Paths(cdi_dirs=(), docker_socket=dead_socket), disk_path=tmp_path, docker_info=_refuse)
    assert (facts.docker_socket, facts.docker_socket_state) == (dead_socket, "socket")
    result = check_docker(facts)
    assert result.status is Status.FAIL
    assert (
        result.finding
        == "Docker engine not reachable (ConnectionError: Error while fetching server API version: connection refused)"
    )


def test_a_node_without_docker_is_named_with_the_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A containerd-only node has no /var/run/docker.sock: the DaemonSet's pod cannot mount it, provision
    cannot run there; preflight (bare metal, Ansible) says so and how to keep the fleet off the node."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    gone = tmp_path / "docker.sock"
    result = check_docker(read_host(Paths(cdi_dirs=(), docker_socket=gone), disk_path=tmp_path, docker_info=_refuse))
    assert result.status is Status.FAIL
    assert result.finding.startswith(f"no Docker engine: {gone} does not exist (a node with containerd alone")
    assert "kubectl label node <node> bwstack/no-docker=true" in result.remedy
    assert result.evidence["socket"] == str(gone)

    gone.mkdir()  # what a hostPath mount without `type: Socket` leaves on a node without Docker
    result = check_docker(read_host(Paths(cdi_dirs=(), docker_socket=gone), disk_path=tmp_path, docker_info=_refuse))
    assert result.finding.startswith(f"no Docker engine: {gone} is not a socket")

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'elsewhere.sock'}")  # the socket the SDK dials
    facts = read_host(Paths(cdi_dirs=()), disk_path=tmp_path, docker_info=_refuse)
    assert (facts.docker_socket, facts.docker_socket_state) == (tmp_path / "elsewhere.sock", "missing")
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2375")  # a remote engine: no socket to look at here
    facts = read_host(Paths(cdi_dirs=(), docker_socket=gone), disk_path=tmp_path, docker_info=_refuse)
    assert facts.docker_socket is None and check_docker(facts).finding.startswith("Docker engine not reachable")


@pytest.mark.docker
def test_real_engine_here_is_judged_by_its_runtimes(docker_client, tmp_path: Path) -> None:
    facts = read_host(Paths(), disk_path=tmp_path)
    assert facts.docker is not None, facts.docker_error
    result = check_docker(facts)
    has_gpu_runtime = any("nvidia" in r for r in facts.docker.get("Runtimes") or {}) or bool(facts.cdi_specs)
    assert result.status is (Status.PASS if has_gpu_runtime else Status.FAIL)
