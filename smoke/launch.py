"""Start the server under test: a process in its own session and process group, or a container.

Either way its output goes to one log file that logfollow reads as it grows: a process writes there
directly (a pipe nobody drains would block the server and look like a hang); a container's stream is
copied there by a pump thread. Containers get host networking, host IPC or a large /dev/shm (NCCL
between ranks needs more than Docker's 64 MB), the GPUs as device requests, and the model folder
mounted read-only at the same path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bwstack.docker_engine import connect
from bwstack.errors import DockerError, SmokeError
from bwstack.reaper import Lifeline
from bwstack.smoke.activity import ProcessTree
from bwstack.smoke.cleanup import CleanupResult, stop_container, stop_process_group
from bwstack.smoke.logfollow import StreamPump

SMOKE_LABEL = "bwstack.smoke"


@dataclass(frozen=True)
class LaunchSpec:
    """What to start and how. `image` None: a host process; otherwise a container from that image."""

    argv: tuple[str, ...]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    model_dir: Path | None = None  # mounted read-only (containers)
    gpus: str = "none"  # containers: "all", "none" or device ids "0,1"
    shm_size: str | None = None  # containers: None means host IPC
    name: str = "bwstack-smoke"


@dataclass(frozen=True)
class ExitStatus:
    code: int | None
    signal: int | None = None
    oom_killed: bool = False

    def describe(self) -> str:
        if self.signal is not None:
            return f"killed by {signal.Signals(self.signal).name}"
        text = f"exited with code {self.code}"
        if self.code is not None and self.code > 128 and (self.code - 128) in signal.valid_signals():
            text += f" ({signal.Signals(self.code - 128).name}?)"
        return text + (" (OOM-killed)" if self.oom_killed else "")

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "signal": self.signal, "oom_killed": self.oom_killed, "text": self.describe()}


class Server(Protocol):
    """A started server, whatever runs it."""

    kind: str  # "process" or "container"
    log_path: Path
    tree: ProcessTree

    def describe(self) -> str: ...

    def poll(self) -> ExitStatus | None:
        """None while it runs; how it ended once it has."""
        ...

    def stop(self, grace_s: float) -> CleanupResult: ...


def _not_a_log(path: Path, why: str) -> SmokeError:
    return SmokeError(f"--log {path} {why}", remedy="pass --log a file path in a writable folder")


def check_log_path(path: Path) -> None:
    """Refuse, before anything starts, a server log smoke could not both write and follow: a directory, a
    FIFO (its open() blocks until a reader comes, and no signal ends that wait), a device (/dev/full reads
    as endless zeros: a busy loop), a kernel file (/proc, /sys: writes fail), an unwritable path. Only stat
    is used on what exists; a regular file is then opened without blocking and written once (the run
    truncates it anyway)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:  # ENOTDIR (a parent is a file), EACCES, ELOOP
        raise _not_a_log(path, f"cannot be used: {error.strerror}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise _not_a_log(path, "is a directory")
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise _not_a_log(path, f"is {kind}, not a regular file")
    _truncate(path)


def _truncate(path: Path) -> None:
    """Create or empty the log, never blocking (O_NONBLOCK) and never on anything but a regular file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        descriptor = os.open(path, flags, 0o644)
    except OSError as error:
        raise _not_a_log(path, f"cannot be written: {error.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise _not_a_log(path, "is not a regular file")
        os.write(descriptor, b"\n")  # a kernel file (/proc/version) opens for root but refuses every write
        os.ftruncate(descriptor, 0)
    except OSError as error:
        raise _not_a_log(path, f"cannot be written: {error.strerror}") from None
    finally:
        os.close(descriptor)


class ProcessServer:
    kind = "process"

    def __init__(self, popen: subprocess.Popen[bytes], spec: LaunchSpec, lifeline: Lifeline) -> None:
        self.popen = popen
        self.spec = spec
        self.lifeline = lifeline
        self.log_path = spec.log_path
        self.tree = ProcessTree(lambda: [popen.pid], session=popen.pid, exclude=frozenset({popen.pid}))
        self.tree.refresh()

    @classmethod
    def start(cls, spec: LaunchSpec) -> ProcessServer:
        _truncate(spec.log_path)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
        _check_runnable(spec.argv[0], env.get("PATH"))
        # The server runs under the reaper shim: if smoke is killed outright (SIGKILL: no clean-up runs),
        # the shim sees the lifeline close and kills the server and everything it forked.
        lifeline = Lifeline().__enter__()
        argv, fds = lifeline.guarded(list(spec.argv))
        try:
            with spec.log_path.open("ab") as log:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**env, **lifeline.environment()},
                    pass_fds=fds,
                )
        except BaseException:
            lifeline.close()
            raise
        try:
            return cls(popen, spec, lifeline)
        except BaseException:  # interrupted (SIGTERM) before the caller holds the server: stop it here
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
            lifeline.close()
            raise

    def describe(self) -> str:
        return f"pid {self.popen.pid} (process group {self.popen.pid})"

    def poll(self) -> ExitStatus | None:
        code = self.popen.poll()
        if code is None:
            return None
        return ExitStatus(code=None, signal=-code) if code < 0 else ExitStatus(code=code)

    def stop(self, grace_s: float) -> CleanupResult:
        try:
            return stop_process_group(self.popen, self.tree, grace_s)
        finally:
            self.lifeline.close()


def _check_runnable(program: str, path: str | None) -> None:
    """The reaper shim execs the command, so a missing one is caught here, as Popen would have."""
    found = program if "/" in program else shutil.which(program, path=path)
    problem = None
    if found is None or not os.path.exists(found):
        problem = "No such file or directory"
    elif os.path.isdir(found):
        problem = "Is a directory"
    elif not os.access(found, os.X_OK):
        problem = "Permission denied"
    if problem:
        raise SmokeError(f"cannot start {program!r}: {problem}", remedy="check --command or the recipe")


def docker_client() -> Any:
    """A live Docker SDK client, or DockerError (exit 2) naming why not."""
    return connect(timeout=60)


def _device_requests(gpus: str) -> list[Any]:
    from docker.types import DeviceRequest

    if gpus == "none":
        return []
    if gpus == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [DeviceRequest(device_ids=[g.strip() for g in gpus.split(",") if g.strip()], capabilities=[["gpu"]])]


class ContainerServer:
    kind = "container"

    def __init__(self, container: Any, spec: LaunchSpec, pump: StreamPump, lifeline: Lifeline) -> None:
        self.lifeline = lifeline
        self.container = container
        self.spec = spec
        self.log_path = spec.log_path
        self.pump = pump
        self._host_pid = int(container.attrs.get("State", {}).get("Pid") or 0)
        self.tree = ProcessTree(lambda: [self._host_pid] if self._host_pid else [])
        self.tree.refresh()

    @classmethod
    def start(
        cls,
        spec: LaunchSpec,
        client: Any,
        *,
        interruptible: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> ContainerServer:
        """Create and start the container. `interruptible` wraps the creation (it may pull the image for
        minutes): inside smoke's deferred launch, a signal may cut that stretch, not the rest."""

        assert spec.image is not None
        _truncate(spec.log_path)
        options: dict[str, Any] = {
            "detach": True,
            "name": spec.name,
            "network_mode": "host",
            "init": True,  # docker-init as PID 1 forwards SIGTERM: a server as PID 1 would ignore it
            "environment": {"PYTHONUNBUFFERED": "1", **spec.env},
            "labels": {SMOKE_LABEL: "1"},  # and the run's reaper labels, below
            "device_requests": _device_requests(spec.gpus),
        }
        if spec.argv:
            options["command"] = list(spec.argv)
        if spec.shm_size:
            options["shm_size"] = spec.shm_size
        else:
            options["ipc_mode"] = "host"
        if spec.model_dir is not None:
            options["volumes"] = {str(spec.model_dir): {"bind": str(spec.model_dir), "mode": "ro"}}
        # A watcher outlives smoke: if smoke is killed outright, it removes the containers with this run's label.
        lifeline = Lifeline().__enter__()
        options["labels"] = lifeline.labels(SMOKE_LABEL)
        lifeline.watch_containers()
        try:
            return cls._create_and_start(spec, client, options, interruptible, lifeline)
        except BaseException:
            lifeline.close()
            raise

    @classmethod
    def _create_and_start(
        cls,
        spec: LaunchSpec,
        client: Any,
        options: dict[str, Any],
        interruptible: Callable[[], AbstractContextManager[object]],
        lifeline: Lifeline,
    ) -> ContainerServer:
        import docker.errors

        assert spec.image is not None
        # create, then start, as `docker run` does, but in two steps: a start that fails (no NVIDIA runtime for
        # --gpus, a bad mount) leaves a container in state Created, and it must be removed like any other
        try:
            with interruptible():
                container = _create(client, spec.image, options)
        except docker.errors.ImageNotFound:
            raise DockerError(
                f"image {spec.image} is not here and could not be pulled", remedy="build it (invoke build) or pull it"
            ) from None
        except docker.errors.APIError as error:
            raise DockerError(f"cannot create a container from {spec.image}: {error.explanation or error}") from None
        except docker.errors.DockerException as error:  # refused by the SDK itself: a bad option or reference
            raise DockerError(f"cannot create a container from {spec.image}: {error}") from None
        except BaseException:
            _remove_named(client, spec.name)  # interrupted while the engine was creating it
            raise
        try:
            container.start()
            pump = StreamPump(container.logs(stream=True, follow=True), spec.log_path.open("ab")).start()
            container.reload()
            return cls(container, spec, pump, lifeline)
        except docker.errors.APIError as error:
            _remove(container)  # never leave a container behind a failed start
            raise DockerError(f"cannot start a container from {spec.image}: {error.explanation or error}") from None
        except docker.errors.DockerException as error:
            _remove(container)
            raise DockerError(f"cannot start a container from {spec.image}: {error}") from None
        except BaseException:
            _remove(container)
            raise

    def describe(self) -> str:
        return (
            f"container {self.container.short_id} ({self.spec.name}) from {self.spec.image}, host pid {self._host_pid}"
        )

    def poll(self) -> ExitStatus | None:
        import docker.errors

        try:
            self.container.reload()
        except docker.errors.NotFound:
            return ExitStatus(code=None)
        state = self.container.attrs.get("State", {})
        if state.get("Status") in ("exited", "dead"):
            self.pump.join(2.0)  # the rest of the log
            return ExitStatus(code=state.get("ExitCode"), oom_killed=bool(state.get("OOMKilled")))
        return None

    def stop(self, grace_s: float) -> CleanupResult:
        try:
            result = stop_container(self.container, self.tree, grace_s)
            self.pump.join(2.0)
            return result
        finally:
            self.lifeline.close()


def _create(client: Any, image: str, options: dict[str, Any]) -> Any:
    """Create (not start) a container; pull the image first when it is not here, as `docker run` does."""
    import docker.errors

    try:
        return client.containers.create(image, **options)
    except docker.errors.ImageNotFound:
        client.images.pull(image)
        return client.containers.create(image, **options)


def _remove(container: Any) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.remove(force=True)


def _remove_named(client: Any, name: str) -> None:
    """Remove the container called `name` if the engine made it (the names are unique to one run)."""
    import docker.errors

    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        _remove(client.containers.get(name))


def unique_name(port: int) -> str:
    return f"bwstack-smoke-{port}-{os.getpid()}-{time.monotonic_ns() % 1_000_000:06d}"
