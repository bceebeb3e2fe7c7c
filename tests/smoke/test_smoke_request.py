"""smoke's inputs: flags to a request (exit 2 on bad input), the recipe's serve command, container options."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import bwstack.recipes as recipes
from bwstack.cli.requests import smoke_request
from bwstack.errors import DockerError, SmokeError
from bwstack.smoke import SmokeRequest, run_smoke
from bwstack.smoke.launch import ContainerServer, LaunchSpec
from bwstack.smoke.request import resolve_command
from tests.emulator.support import free_port, processes_mentioning

FLAGS: dict[str, Any] = {
    "command": None,
    "model": None,
    "image": None,
    "recipe": "sglang",
    "port": None,
    "host": "127.0.0.1",
    "startup_timeout": "1800",
    "stall_timeout": "120",
    "engine": None,
    "log": None,
}


def flags(**changes: Any) -> SmokeRequest:
    return smoke_request(**{**FLAGS, **changes})


def test_flags_become_a_typed_request() -> None:
    request = flags(command="python3 -m http.server '8 0'", port="8000", stall_timeout="7.5", env=["A=1", "B=x=y"])
    assert request.command == ("python3", "-m", "http.server", "8 0")
    assert (request.port, request.stall_timeout_s, request.env) == (8000, 7.5, {"A": "1", "B": "x=y"})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "nothing to start"),
        ({"command": "x", "port": "eighty"}, "--port 'eighty' is not a whole number"),
        ({"command": "x", "port": "70000"}, "not in 1..65535"),
        ({"command": "x 'unclosed", "port": "1"}, "does not parse"),
        ({"command": "x", "port": "1", "stall_timeout": "0"}, "--stall-timeout must be positive"),
        ({"command": "x", "port": "1", "stall_timeout": "nan"}, "--stall-timeout 'nan' is not a finite number"),
        ({"command": "x", "port": "1", "startup_timeout": "inf"}, "--startup-timeout 'inf' is not a finite number"),
        ({"command": "x", "port": "1", "grace": "-inf"}, "--grace '-inf' is not a finite number"),
        ({"command": "x", "port": "1", "env": ["NOEQUALS"]}, "is not KEY=VALUE"),
        ({"command": "x", "port": "1", "gpus": "some"}, "--gpus 'some'"),
        ({"command": "x", "port": "1", "shm_size": "lots"}, "--shm-size 'lots'"),
        ({"command": "x", "port": "1", "shm_size": "32x"}, "--shm-size '32x'"),
        ({"command": "x", "port": "1", "shm_size": "-1g"}, "--shm-size '-1g'"),
        ({"command": "x", "port": "1", "shm_size": "1.5g"}, "--shm-size '1.5g'"),
        ({"command": "x", "port": "1", "shm_size": "0g"}, "--shm-size '0g'"),
        ({"model": "/does/not/exist"}, "model folder /does/not/exist does not exist"),
    ],
)
def test_bad_flags_are_smoke_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SmokeError, match=message.replace("(", r"\(").replace(".", r"\.")):
        flags(**changes)


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("startup_timeout_s", "--startup-timeout"),
        ("stall_timeout_s", "--stall-timeout"),
        ("grace_s", "--grace"),
        ("poll_s", "poll interval"),
    ],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_request_refuses_non_finite_seconds_however_it_is_built(field: str, flag: str, value: float) -> None:
    with pytest.raises(SmokeError, match=f"^{flag} must be a finite number"):
        SmokeRequest(command=("server",), port=1, **{field: value})


@pytest.mark.parametrize("size", ["32g", "32G", "512m", "64k", "1024", "100b"])
def test_shm_sizes_in_dockers_format_are_taken(size: str) -> None:
    assert flags(command="x", port="1", image="stack:tag", shm_size=size).shm_size == size


def test_command_needs_a_port() -> None:
    with pytest.raises(SmokeError, match="--port is required with --command"):
        resolve_command(flags(command="server"))


def test_the_recipe_api_gives_command_port_and_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    class FakeRecipe:
        serve = SimpleNamespace(port=31000, engine="vllm")

        def serve_command(self, model_path: str, *, host: str, port: int) -> list[str]:
            calls.append((model_path, host, port))
            return ["serve", model_path, str(port)]

    monkeypatch.setattr(recipes, "load_recipe", lambda name: calls.append(("load", name)) or FakeRecipe())
    command = resolve_command(SmokeRequest(model=tmp_path, recipe="kimi"))
    assert calls == [("load", "kimi"), (str(tmp_path), "127.0.0.1", 31000)]
    assert (command.argv, command.port, command.engine) == (("serve", str(tmp_path), "31000"), 31000, "vllm")
    assert resolve_command(SmokeRequest(model=tmp_path, recipe="kimi", port=9, engine="sglang")).port == 9


def test_the_sglang_recipe_runs_sglang_and_a_missing_sglang_is_a_crash_with_its_remedy(tmp_path: Path) -> None:
    if subprocess.run(["python3", "-c", "import sglang"], capture_output=True).returncode == 0:
        pytest.skip("sglang is installed here: the recipe would really start it")
    port = free_port()
    request = SmokeRequest(
        model=tmp_path, recipe="sglang", port=port, stall_timeout_s=5, startup_timeout_s=20, log_path=tmp_path / "s.log"
    )
    expected = recipes.load_recipe("sglang").serve_command(str(tmp_path), host="127.0.0.1", port=port)
    data = run_smoke(request).to_dict()
    assert data["command"] == expected and "--model-path" in expected and str(port) in expected
    assert (data["verdict"], data["phase"], data["engine"]) == ("crash", "launching", "sglang")
    assert [s["name"] for s in data["diagnosis"]["signatures"]] == ["missing-module"]
    assert "sglang" in data["diagnosis"]["signatures"][0]["line"]


def test_a_busy_port_is_refused_before_anything_starts() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SmokeError, match=f"something already listens on 127.0.0.1:{port}"):
            run_smoke(SmokeRequest(command=("sleep", "4711.25"), port=port))
    assert not processes_mentioning("sleep 4711.25")


@pytest.mark.parametrize("host", ["no such host!!", "bad..host"])
def test_an_unresolvable_host_is_refused_before_anything_starts(host: str) -> None:
    # it used to read as "nothing listening" and end, a stall timeout later, as a hang in listening
    request = SmokeRequest(command=("sleep", "4711.75"), port=free_port(), host=host, stall_timeout_s=0.5)
    with pytest.raises(SmokeError, match=f"--host {host!r} does not resolve"):
        run_smoke(request)
    assert not processes_mentioning("sleep 4711.75")


class FakeContainers:
    def __init__(self) -> None:
        self.runs: list[tuple[str, dict[str, Any]]] = []

    def create(self, image: str, **options: Any) -> Any:
        self.runs.append((image, options))
        raise StopLaunch

    def get(self, name: str) -> Any:
        import docker.errors

        raise docker.errors.NotFound(f"no container {name}")  # create failed before the engine made one


class StopLaunch(Exception):
    pass


@pytest.mark.parametrize(
    ("gpus", "shm", "expected_devices", "ipc"),
    [
        ("all", None, [{"Count": -1, "Capabilities": [["gpu"]]}], {"ipc_mode": "host"}),
        ("0,3", "32g", [{"DeviceIDs": ["0", "3"]}], {"shm_size": "32g"}),
        ("none", None, [], {"ipc_mode": "host"}),
    ],
)
def test_container_options(tmp_path: Path, gpus: str, shm: str | None, expected_devices: list, ipc: dict) -> None:
    client = SimpleNamespace(containers=FakeContainers())
    spec = LaunchSpec(
        argv=("serve", "--port", "1"),
        log_path=tmp_path / "log",
        env={"NCCL_P2P_DISABLE": "1"},
        image="stack:tag",
        model_dir=tmp_path,
        gpus=gpus,
        shm_size=shm,
        name="bwstack-smoke-test",
    )
    with pytest.raises(StopLaunch):
        ContainerServer.start(spec, client)
    image, options = client.containers.runs[0]
    assert image == "stack:tag" and options["command"] == ["serve", "--port", "1"]
    assert options["network_mode"] == "host" and options["init"] is True and options["detach"] is True
    assert options["volumes"] == {str(tmp_path): {"bind": str(tmp_path), "mode": "ro"}}
    assert options["environment"] == {"PYTHONUNBUFFERED": "1", "NCCL_P2P_DISABLE": "1"}
    labels = options["labels"]  # its kind, and the reaper's run id and owner (see test_sigkill.py)
    assert labels["bwstack.smoke"] == "1" and labels["io.bwstack.run"] and labels["io.bwstack.owner"]
    for key, value in ipc.items():
        assert options[key] == value
    assert not ({"ipc_mode", "shm_size"} - set(ipc)) & set(options)
    devices = [{k: v for k, v in d.items() if v} for d in options["device_requests"]]
    assert [{k: v for k, v in d.items() if k in e} for d, e in zip(devices, expected_devices, strict=True)] == (
        expected_devices
    )


class FailingStart:
    """A container the engine created but cannot start (no NVIDIA runtime for --gpus all)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        import docker.errors

        self.calls.append("start")
        raise docker.errors.APIError('could not select device driver "" with capabilities: [[gpu]]')

    def remove(self, force: bool = False) -> None:
        self.calls.append(f"remove force={force}")


def test_a_container_that_fails_to_start_is_removed(tmp_path: Path) -> None:
    container = FailingStart()
    created: list[str] = []

    def create(image: str, **options: Any) -> FailingStart:
        created.append(image)
        return container

    client = SimpleNamespace(containers=SimpleNamespace(create=create))
    spec = LaunchSpec(argv=(), log_path=tmp_path / "log", image="stack:tag", gpus="all", name="bwstack-smoke-t")
    with pytest.raises(DockerError, match=r"cannot start a container from stack:tag: could not select device"):
        ContainerServer.start(spec, client)
    assert created == ["stack:tag"] and container.calls == ["start", "remove force=True"]


def test_an_option_the_docker_sdk_itself_refuses_is_a_docker_error(tmp_path: Path) -> None:
    # the SDK checks some options while it builds the request, before it talks to the engine, and raises
    # its base DockerException (not an APIError): that was a traceback
    import docker

    client = docker.DockerClient(base_url=f"unix://{tmp_path}/no-docker.sock", version="1.45")
    spec = LaunchSpec(argv=(), log_path=tmp_path / "log", image="stack:tag", shm_size="lots", name="bwstack-smoke-t")
    with pytest.raises(DockerError, match=r"cannot create a container from stack:tag: .*lots"):
        ContainerServer.start(spec, client)
