"""smoke against a real container: a FROM-scratch busybox image carrying images/demo/server (the demo
image's server), run through the Docker SDK with host networking on a free port."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest

from bwstack.errors import DockerError
from bwstack.reaper import extra_labels
from bwstack.smoke import SmokeRequest, run_smoke
from bwstack.smoke.launch import SMOKE_LABEL
from tests.emulator.support import DEMO_SERVER, free_port, signal_smoke_when

pytestmark = pytest.mark.docker

DOCKERFILE = """\
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY server/ /srv/bwstack-demo/
CMD ["/srv/bwstack-demo/entrypoint.sh"]
"""


@pytest.fixture(scope="module")
def demo_image(
    docker_client: Any, static_busybox: Path, tmp_path_factory: pytest.TempPathFactory, module_images, run_label
) -> str:
    context = tmp_path_factory.mktemp("smoke-demo")
    shutil.copy(static_busybox, context / "busybox")
    shutil.copytree(DEMO_SERVER, context / "server")
    (context / "Dockerfile").write_text(DOCKERFILE)
    tag = f"{module_images.repo('smoke-demo')}:latest"
    # The run's label makes the image this run's own (its own id), so clean-up cannot touch anyone else's.
    docker_client.images.build(path=str(context), tag=tag, rm=True, forcerm=True, labels=run_label)
    return tag


def smoke_containers(client: Any, port: int) -> list[Any]:
    """This test's smoke containers: this run's label, named after the port (others may share the engine)."""
    this_run = [f"{key}={value}" for key, value in extra_labels().items()]
    found = client.containers.list(all=True, filters={"label": [SMOKE_LABEL, *this_run]})
    return [c for c in found if c.name.startswith(f"bwstack-smoke-{port}-")]


def incident_container_args(image: str, port: int, log: Path) -> list[str]:
    """smoke flags for the demo image's incident scenario in a container: it hangs in shards-loaded."""
    return [
        "--command", f"/srv/bwstack-demo/entrypoint.sh --port {port}", "--image", image, "--port", str(port),
        "--gpus", "none", "--env", "DEMO_SCENARIO=incident", "--stall-timeout", "60", "--grace", "2",
        "--log", str(log),
    ]  # fmt: skip


def run(image: str, scenario: str, client: Any, tmp_path: Path) -> dict[str, Any]:
    port = free_port()
    command = ("/srv/bwstack-demo/entrypoint.sh", "--port", str(port), "--model-path", str(tmp_path))
    request = SmokeRequest(
        command=command,
        model=tmp_path,  # mounted read-only at the same path
        image=image,
        port=port,
        gpus="none",
        env={"DEMO_SCENARIO": scenario},
        startup_timeout_s=15,
        stall_timeout_s=1.5,
        grace_s=2,
        log_path=tmp_path / "server.log",  # not a new folder under the temp folder, kept after the test
    )
    data = run_smoke(request).to_dict()
    assert f"(bwstack-smoke-{port}-" in data["checks"][1]["finding"]  # the name smoke_containers looks for
    assert not smoke_containers(client, port), "the smoke container was left behind"
    assert data["cleanup"]["container_removed"] is True and data["cleanup"]["clean"]
    assert not [p["pid"] for p in data["processes"] if psutil.pid_exists(p["pid"]) and _not_zombie(p["pid"])]
    return data


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_demo_server_container_is_ready(demo_image: str, docker_client: Any, tmp_path: Path) -> None:
    data = run(demo_image, "healthy", docker_client, tmp_path)
    assert (data["verdict"], data["phase"]) == ("ready", "ready")
    assert data["completion_text"] == " Paris."
    assert data["probes"]["models"]["detail"] == f"serves {tmp_path}"
    assert "container" in data["checks"][1]["finding"]
    names = {p["name"] for p in data["processes"]}
    assert {"docker-init", "nc"} <= names  # the tree was sampled from the host: init, shell, the server


def test_incident_in_a_container_is_a_hang_in_shards_loaded(
    demo_image: str, docker_client: Any, tmp_path: Path
) -> None:
    data = run(demo_image, "incident", docker_client, tmp_path)
    assert (data["verdict"], data["phase"]) == ("hang", "shards-loaded")
    assert data["log_tail"][-1].startswith("Loading safetensors checkpoint shards: 100% Completed | 16/16")
    assert {p["state"] for p in data["processes"]} == {"S"} and len(data["processes"]) >= 4


def test_a_container_the_engine_cannot_start_is_not_left_created(
    demo_image: str, docker_client: Any, tmp_path: Path
) -> None:
    # a GPU no engine has: "could not select device driver" without the NVIDIA runtime, "unknown device"
    # with it; either way the engine created the container and then failed to start it
    port = free_port()
    request = SmokeRequest(
        command=("/srv/bwstack-demo/entrypoint.sh", "--port", str(port)),
        image=demo_image,
        port=port,
        gpus="4711",
        log_path=tmp_path / "server.log",
    )
    with pytest.raises(DockerError, match=f"cannot start a container from {demo_image}"):
        run_smoke(request)
    left = smoke_containers(docker_client, port)
    for container in left:  # not for the next run to find
        container.remove(force=True)
    assert not left, f"left behind: {[(c.name, c.status) for c in left]}"


def test_sigterm_to_smoke_removes_the_container(demo_image: str, docker_client: Any, tmp_path: Path) -> None:
    port = free_port()
    args = incident_container_args(demo_image, port, tmp_path / "s.log")
    try:
        code, stderr = signal_smoke_when(args, "smoke: phase shards-loaded", signal.SIGTERM)
        left = smoke_containers(docker_client, port)
    finally:
        for container in smoke_containers(docker_client, port):  # not for the next run to find
            container.remove(force=True)
    assert not left, f"left behind after SIGTERM: {[(c.name, c.status) for c in left]}"
    assert code == 143 and "smoke: stopped: nothing left running" in stderr, stderr
