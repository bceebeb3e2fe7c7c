"""provision: preflight -> verify (this node's GPUs) -> smoke, one report, stopping at the first failure."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bwstack.images.build import build_images
from bwstack.nodes.preflight.host import HostPaths, HostThresholds
from bwstack.nodes.provision import DEMO_MODEL, ProvisionRequest, run_provision
from bwstack.reaper import extra_labels
from tests.emulator.support import free_port
from tests.fakes import fake_pynvml as fakes
from tests.helpers import invoke

LENIENT = HostThresholds(shm_fail=0, shm_warn=0, disk_warn=0, ram_warn=0)


def by_name(report_dict: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report_dict["checks"]}


def node_seams(tmp_path: Path) -> dict:
    """A node whose Docker has the NVIDIA runtime and whose /sys shows no IOMMU (the NVML side is faked apart)."""
    (tmp_path / "iommu").mkdir()
    (tmp_path / "groups").mkdir()
    (tmp_path / "cmdline").write_text("BOOT_IMAGE=/vmlinuz quiet\n")
    paths = HostPaths(
        iommu_class=tmp_path / "iommu", iommu_groups=tmp_path / "groups", cmdline=tmp_path / "cmdline", cdi_dirs=()
    )
    info = {"ServerVersion": "28.0.0", "Runtimes": {"runc": {}, "nvidia": {}}, "DefaultRuntime": "runc"}
    return {"host_paths": paths, "docker_info": lambda: info, "thresholds": LENIENT}


@pytest.fixture(scope="module")
def demo_images(docker_client, module_images):
    """The demo image (gated) and the incident twin (built with the gate off, as a careless team would).
    Under a per-run repository; clean-up removes only those tags, never a user's image of the same id."""
    repo = module_images.repo("provision")
    good = build_images("demo", ["sm120"], repo=repo, client=docker_client)
    bad = build_images("demo-incident", ["sm120"], repo=repo, gate=False, client=docker_client)
    assert good.ok and bad.ok
    return {"demo": good.data["images"][0]["tags"][0], "demo-incident": bad.data["images"][0]["tags"][0]}


def smoke_containers(client) -> list:
    """This test run's smoke containers (BWSTACK_LABELS puts the run's label on them; others may share the engine)."""
    this_run = [f"{key}={value}" for key, value in extra_labels().items()]
    return client.containers.list(all=True, filters={"label": ["bwstack.smoke", *this_run]})


@pytest.mark.docker
def test_h200_node_verifies_for_its_own_gpus_then_serves(docker_client, demo_images, tmp_path: Path) -> None:
    request = ProvisionRequest(
        demo_images["demo"],
        DEMO_MODEL,
        "demo",
        port=free_port(),  # never the recipe's 30000: something of the user's may listen there
        startup_timeout_s=60,
        stall_timeout_s=20,
        smoke_log=tmp_path / "s.log",
    )
    report = run_provision(request, nvml=fakes.h200_nvlink(), preflight_options=node_seams(tmp_path)).to_dict()
    assert report["ok"] is True, [c for c in report["checks"] if c["status"] == "fail"]
    assert report["verified_for"] == ["sm90"]  # NVML's CC 9.0, not the recipe's sm120
    loader = report["stages"]["verify"]["targets"][0]["loader"]
    assert loader["selected"] == "sgl_kernel/sm90/common_ops.abi3.so"
    assert report["stages"]["smoke"]["verdict"] == "ready"
    assert report["stopped_at"] is None
    assert not smoke_containers(docker_client)


@pytest.mark.docker
def test_incident_image_stops_at_verify_on_an_rtx_pro_6000_node(docker_client, demo_images, tmp_path: Path) -> None:
    request = ProvisionRequest(demo_images["demo-incident"], DEMO_MODEL, "demo-incident", smoke_log=tmp_path / "s.log")
    report = run_provision(request, nvml=fakes.rtx_pro_6000_pcie(), preflight_options=node_seams(tmp_path))
    data = report.to_dict()
    assert report.exit_code == 1
    assert data["stopped_at"] == "verify"
    checks = by_name(data)
    assert checks["verify"]["status"] == "fail"
    assert "sgl_kernel/sm100/common_ops.abi3.so, which has no code that runs here" in checks["verify"]["finding"]
    assert checks["smoke"]["status"] == "skip" and checks["smoke"]["finding"] == "not run: verify failed"
    assert data["stages"]["smoke"] == {"ok": None, "skipped": "not run: verify failed"}
    assert not smoke_containers(docker_client)


def test_stops_at_preflight_without_a_driver(tmp_path: Path) -> None:
    """This machine has no NVIDIA driver: the first stage fails and nothing is pulled or started."""
    result = invoke(
        "provision",
        "--image",
        "never-pulled:latest",
        "--model",
        str(DEMO_MODEL),
        "--recipe",
        "demo",
        "--json",
        str(tmp_path / "p.json"),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    checks = by_name(data)
    assert data["stopped_at"] == "preflight"
    assert checks["preflight: driver"]["status"] == "fail"
    assert "no NVIDIA driver" in checks["preflight: driver"]["finding"]
    assert checks["verify"]["status"] == checks["smoke"]["status"] == "skip"


def test_missing_shard_stops_provisioning_naming_the_file(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for path in DEMO_MODEL.iterdir():
        if path.name != "model-00002-of-00002.safetensors":
            (model / path.name).write_bytes(path.read_bytes())
    request = ProvisionRequest("never-pulled:latest", model, "demo", smoke_log=tmp_path / "s.log")
    report = run_provision(request, nvml=fakes.rtx_pro_6000_pcie(), preflight_options=node_seams(tmp_path)).to_dict()
    assert report["stopped_at"] == "preflight"
    failing = [c for c in report["checks"] if c["status"] == "fail" and c["name"].startswith("preflight: model")]
    assert failing and "model-00002-of-00002.safetensors" in failing[0]["finding"]


@pytest.mark.docker
def test_demo_passes_end_to_end(docker_client, tmp_path: Path) -> None:
    # the task has no flag for the smoke log: its folder goes under tmp_path through TMPDIR
    result = invoke(
        "provision",
        "--demo",
        "--port",
        str(free_port()),
        "--json",
        str(tmp_path / "p.json"),
        env={"TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "p.json").read_text())
    assert [data["stages"][s]["ok"] for s in ("build", "preflight", "verify", "advise", "smoke")] == [True] * 5
    assert data["stages"]["smoke"]["verdict"] == "ready"
    checks = by_name(data)
    # the demo is advised for its arch (sm120) and Kimi-shaped model, and smoke launched with that advice
    advice = data["stages"]["advise"]["advice"]
    assert "--attention-backend" in advice["args"] and advice["env"]["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    assert checks["advise: nccl-pcie"]["status"] == "pass"  # tp 1: not needed
    launched = checks["smoke: launch"]["evidence"]["argv"]
    assert launched[-len(advice["args"]) :] == advice["args"]
    assert checks["smoke: completion"]["status"] == "pass"
    assert not smoke_containers(docker_client)


def test_provision_needs_an_image_and_a_model() -> None:
    result = invoke("provision", "--image", "x:y")
    assert result.returncode == 2 and "needs --image REF and --model DIR (or --demo)" in result.stderr


def test_the_smoke_stage_writes_its_log_where_it_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # without a place, every provision (and every test of it) left a bwstack-smoke-* folder in the temp folder
    import bwstack.nodes.provision as provision
    from bwstack.report import Report
    from bwstack.smoke import SmokeRequest

    @contextlib.contextmanager
    def no_image(*args: object, **kwargs: object) -> Iterator[None]:
        yield None

    asked: list[SmokeRequest] = []

    def fake_smoke(request: SmokeRequest, **kwargs: object) -> Report:
        asked.append(request)
        return Report(kind="smoke", subject="fake")

    monkeypatch.setattr(provision, "run_preflight", lambda *args, **kwargs: Report(kind="preflight", subject="x"))
    monkeypatch.setattr(provision, "_node_archs", lambda preflight, demo: ([provision.parse_arch("sm90")], []))
    monkeypatch.setattr(provision.sources, "open_image", no_image)
    monkeypatch.setattr(provision, "verify_tree", lambda *args, **kwargs: Report(kind="verify", subject="x"))
    monkeypatch.setattr(provision, "image_facts", lambda *args: None)
    advised = Report(kind="advise", subject="x", data={"advice": {"args": [], "env": {}}})
    monkeypatch.setattr(provision, "_advise", lambda *args: advised)
    monkeypatch.setattr(provision, "run_smoke", fake_smoke)
    log = tmp_path / "smoke" / "server.log"
    report = run_provision(ProvisionRequest("stack:tag", DEMO_MODEL, "demo", smoke_log=log))
    assert report.data["stopped_at"] is None
    assert [r.log_path for r in asked] == [log]
    run_provision(ProvisionRequest("stack:tag", DEMO_MODEL, "demo"))
    assert asked[-1].log_path is None  # the default: smoke's own folder, kept for the person to read
