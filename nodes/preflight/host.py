"""Host checks: /dev/shm, free disk at the model path, RAM, IOMMU, and Docker with a GPU runtime.

Facts are read from the paths in `HostPaths` (tests point them at temporary folders laid out like
/sys) and from the Docker engine through a `docker_info` callable; the checks are pure functions.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bwstack.report import Check, Status

GiB = 1024**3
MiB = 1024**2

DockerInfo = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class HostPaths:
    shm: Path = Path("/dev/shm")
    iommu_class: Path = Path("/sys/class/iommu")
    iommu_groups: Path = Path("/sys/kernel/iommu_groups")
    cmdline: Path = Path("/proc/cmdline")
    cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
    docker_socket: Path = Path("/var/run/docker.sock")  # where the engine listens when DOCKER_HOST is not set


@dataclass(frozen=True)
class HostThresholds:
    """Named limits the host checks apply."""

    shm_fail: int = 1 * GiB  # Docker's 64 MB default breaks NCCL between ranks (docs/facts.md 6)
    shm_warn: int = 16 * GiB  # SGLang's examples give containers --shm-size 32g
    disk_warn: int = 50 * GiB  # room for caches (torch compile, flashinfer/triton JIT) and logs
    ram_warn: int = 64 * GiB


@dataclass(frozen=True)
class HostFacts:
    shm_bytes: int | None
    disk_path: Path
    disk_free: int | None
    ram_total: int
    ram_available: int
    iommu_enabled: bool | None
    iommu_units: tuple[str, ...]
    iommu_groups: int
    iommu_cmdline: tuple[str, ...]
    docker: dict[str, Any] | None  # `docker info`, None when unreachable
    docker_error: str | None
    docker_checked: bool = True
    cdi_specs: tuple[Path, ...] = field(default=())
    docker_socket: Path | None = None  # the engine's unix socket (None: DOCKER_HOST names a TCP/SSH engine)
    docker_socket_state: str | None = None  # "socket", "missing" or "not a socket"

    def to_dict(self) -> dict[str, Any]:
        return {
            "shm_bytes": self.shm_bytes,
            "disk_path": str(self.disk_path),
            "disk_free_bytes": self.disk_free,
            "ram_total_bytes": self.ram_total,
            "ram_available_bytes": self.ram_available,
            "iommu_enabled": self.iommu_enabled,
            "iommu_units": list(self.iommu_units),
            "iommu_groups": self.iommu_groups,
            "iommu_cmdline": list(self.iommu_cmdline),
            "docker_runtimes": sorted((self.docker or {}).get("Runtimes") or {}),
            "docker_error": self.docker_error,
            "cdi_specs": [str(p) for p in self.cdi_specs],
            "docker_socket": str(self.docker_socket) if self.docker_socket else None,
            "docker_socket_state": self.docker_socket_state,
        }


def docker_engine_info() -> dict[str, Any]:
    """`docker info` from the engine DOCKER_HOST names (or the local socket)."""
    import docker

    client = docker.from_env(timeout=10)
    try:
        return client.info()
    finally:
        client.close()


def _docker_socket(paths: HostPaths) -> tuple[Path | None, str | None]:
    """The unix socket the Docker SDK will dial (DOCKER_HOST's, else the default) and what is there."""
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return None, None
    socket = Path(host.removeprefix("unix://")) if host else paths.docker_socket
    try:
        mode = socket.stat().st_mode
    except FileNotFoundError:
        return socket, "missing"
    except OSError:
        return socket, None
    return socket, "socket" if stat.S_ISSOCK(mode) else "not a socket"


def _listing(path: Path) -> list[str]:
    try:
        return sorted(p.name for p in path.iterdir())
    except OSError:
        return []


def _cdi_specs(dirs: tuple[Path, ...]) -> tuple[Path, ...]:
    """CDI spec files that declare NVIDIA GPUs (kind nvidia.com/gpu), as nvidia-ctk cdi generate writes."""
    found = []
    for folder in dirs:
        for spec in sorted(folder.glob("*")) if folder.is_dir() else []:
            if spec.suffix in {".yaml", ".yml", ".json"}:
                try:
                    text = spec.read_text(errors="replace")
                except OSError:
                    continue
                if "nvidia.com/gpu" in text:
                    found.append(spec)
    return tuple(found)


def _free(path: Path) -> tuple[Path, int | None]:
    """Free bytes on the file system holding `path` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return probe, shutil.disk_usage(probe).free
    except OSError:
        return probe, None


def read_host(paths: HostPaths, *, disk_path: Path, docker_info: DockerInfo | None = docker_engine_info) -> HostFacts:
    try:
        stat = os.statvfs(paths.shm)
        shm: int | None = stat.f_blocks * stat.f_frsize
    except OSError:
        shm = None
    probe, free = _free(disk_path)
    memory = psutil.virtual_memory()
    units = tuple(_listing(paths.iommu_class))
    groups = len(_listing(paths.iommu_groups))
    try:
        cmdline = tuple(w for w in paths.cmdline.read_text().split() if "iommu" in w.lower())
    except OSError:
        cmdline = ()
    sysfs_seen = paths.iommu_class.is_dir() or paths.iommu_groups.is_dir()
    iommu = bool(units or groups) if sysfs_seen else None
    info, error = None, None
    if docker_info is not None:
        try:
            info = docker_info()
        except Exception as exc:  # the Docker SDK raises several unrelated types for "no engine"
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
    socket, socket_state = _docker_socket(paths) if docker_info is not None else (None, None)
    cdi_dirs = tuple(dict.fromkeys([*paths.cdi_dirs, *(Path(d) for d in (info or {}).get("CDISpecDirs") or [])]))
    return HostFacts(
        shm_bytes=shm,
        disk_path=probe,
        disk_free=free,
        ram_total=memory.total,
        ram_available=memory.available,
        iommu_enabled=iommu,
        iommu_units=units,
        iommu_groups=groups,
        iommu_cmdline=cmdline,
        docker=info,
        docker_error=error,
        docker_checked=docker_info is not None,
        cdi_specs=_cdi_specs(cdi_dirs),
        docker_socket=socket,
        docker_socket_state=socket_state,
    )


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


@dataclass(frozen=True)
class Grade:
    """One outcome of a size check: below the HostThresholds field `below` (None: the size could not be
    read) the check gets `status`. `finding` is a format string over the names `_size_words` gives."""

    below: str | None
    status: Status
    finding: str
    remedy: str | None = None


@dataclass(frozen=True)
class SizeRule:
    """A host resource graded against limits: the first grade that applies wins, else the check passes."""

    name: str
    size: str  # the HostFacts field measured
    grades: tuple[Grade, ...]  # strictest first
    passing: str
    evidence: Callable[[HostFacts], dict[str, Any]]


_SHM_REMEDY = "give containers --ipc=host or --shm-size 32g; on the host, remount /dev/shm larger"

SIZE_RULES = {
    "shm": SizeRule(
        "host.shm",
        "shm_bytes",
        (
            Grade(None, Status.FAIL, "/dev/shm is missing", _SHM_REMEDY),
            Grade("shm_fail", Status.FAIL, "/dev/shm is {size_mib}: NCCL between TP ranks breaks", _SHM_REMEDY),
            Grade("shm_warn", Status.WARN, "/dev/shm is {size} (< {limit})", _SHM_REMEDY),
        ),
        "/dev/shm is {size}",
        lambda facts: {"path": "/dev/shm", "bytes": facts.shm_bytes},
    ),
    "disk": SizeRule(
        "host.disk",
        "disk_free",
        (
            Grade(None, Status.WARN, "cannot read free space at {path}"),
            Grade(
                "disk_warn",
                Status.WARN,
                "{size} free at {path} (< {limit} for JIT caches and logs)",
                "free space on that file system or point the model and caches elsewhere",
            ),
        ),
        "{size} free at {path}",
        lambda facts: {"path": str(facts.disk_path), "free_bytes": facts.disk_free},
    ),
    "ram": SizeRule(
        "host.ram",
        "ram_total",
        (
            Grade(
                "ram_warn",
                Status.WARN,
                "{size} RAM, {available} available (< {limit}: loading shards through the page cache will be slow)",
            ),
        ),
        "{size} RAM, {available} available",
        lambda facts: {"total_bytes": facts.ram_total, "available_bytes": facts.ram_available},
    ),
}


def _size_words(facts: HostFacts, size: int | None, limit: int | None) -> dict[str, str]:
    return {
        "size": _gib(size) if size is not None else "?",
        "size_mib": f"{size / MiB:.0f} MiB" if size is not None else "?",
        "limit": _gib(limit) if limit is not None else "?",
        "path": str(facts.disk_path),
        "available": _gib(facts.ram_available),
    }


def check_size(rule: SizeRule, facts: HostFacts, limits: HostThresholds) -> Check:
    size: int | None = getattr(facts, rule.size)
    for grade in rule.grades:
        limit: int | None = getattr(limits, grade.below) if grade.below else None
        applies = size is None if grade.below is None else size is not None and size < (limit or 0)
        if applies:
            words = _size_words(facts, size, limit)
            return Check(rule.name, grade.status, grade.finding.format(**words), rule.evidence(facts), grade.remedy)
    return Check(rule.name, Status.PASS, rule.passing.format(**_size_words(facts, size, None)), rule.evidence(facts))


def check_shm(facts: HostFacts, limits: HostThresholds) -> Check:
    return check_size(SIZE_RULES["shm"], facts, limits)


def check_disk(facts: HostFacts, limits: HostThresholds) -> Check:
    return check_size(SIZE_RULES["disk"], facts, limits)


def check_ram(facts: HostFacts, limits: HostThresholds) -> Check:
    return check_size(SIZE_RULES["ram"], facts, limits)


def check_iommu(facts: HostFacts) -> Check:
    evidence = {
        "units": list(facts.iommu_units),
        "groups": facts.iommu_groups,
        "cmdline": list(facts.iommu_cmdline),
    }
    if facts.iommu_enabled is None:
        return Check("host.iommu", Status.SKIP, "no /sys/class/iommu or /sys/kernel/iommu_groups to read", evidence)
    if facts.iommu_enabled:
        units = ", ".join(facts.iommu_units) or "units not listed"
        return Check("host.iommu", Status.PASS, f"IOMMU enabled ({units}; {facts.iommu_groups} groups)", evidence)
    return Check("host.iommu", Status.PASS, "IOMMU disabled (no IOMMU units or groups)", evidence)


# Why no engine answered, by what is at the socket path the Docker SDK dials: (finding, remedy).
_NO_ENGINE = {
    "missing": (
        "no Docker engine: {socket} does not exist (a node with containerd alone has none); "
        "provision verifies and smoke-tests the image through Docker",
        "install Docker Engine and the NVIDIA Container Toolkit on the node; to keep `invoke fleet`'s "
        "DaemonSet off a node without Docker: kubectl label node <node> bwstack/no-docker=true",
    ),
    "not a socket": (
        "no Docker engine: {socket} is not a socket (a directory a container mount left behind?)",
        "remove {socket} once nothing mounts it, then start dockerd (systemctl start docker)",
    ),
}
_UNREACHABLE = ("Docker engine not reachable ({error})", "start dockerd (systemctl start docker) or set DOCKER_HOST")


def check_docker(facts: HostFacts, *, need_gpus: bool = True) -> Check:
    runtimes = sorted((facts.docker or {}).get("Runtimes") or {})
    specs = [str(p) for p in facts.cdi_specs]
    evidence: dict[str, Any] = {"runtimes": runtimes, "cdi_specs": specs, "error": facts.docker_error}
    if facts.docker is None:
        finding, remedy = _NO_ENGINE.get(facts.docker_socket_state or "", _UNREACHABLE)
        socket = {"socket": str(facts.docker_socket)} if facts.docker_socket_state in _NO_ENGINE else {}
        words = {"socket": facts.docker_socket, "error": facts.docker_error}
        return Check("host.docker", Status.FAIL, finding.format(**words), evidence | socket, remedy.format(**words))
    evidence |= {
        "server_version": facts.docker.get("ServerVersion"),
        "default_runtime": facts.docker.get("DefaultRuntime"),
    }
    gpu_runtimes = [r for r in runtimes if "nvidia" in r]
    if not need_gpus:
        return Check(
            "host.docker",
            Status.PASS,
            f"Docker {facts.docker.get('ServerVersion', '?')} is reachable (no GPU access needed)",
            evidence,
        )
    if gpu_runtimes or specs:
        how = ", ".join([f"runtime {r}" for r in gpu_runtimes] + [f"CDI spec {s}" for s in specs])
        return Check(
            "host.docker", Status.PASS, f"Docker {facts.docker.get('ServerVersion', '?')} with {how}", evidence
        )
    return Check(
        "host.docker",
        Status.FAIL,
        f"Docker {facts.docker.get('ServerVersion', '?')} is reachable but has no NVIDIA runtime "
        f"(runtimes: {', '.join(runtimes) or 'none'}) and no NVIDIA CDI spec: containers cannot see the GPUs",
        evidence,
        remedy="install the NVIDIA Container Toolkit, then `nvidia-ctk runtime configure --runtime=docker` "
        "or `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`",
    )


def host_checks(facts: HostFacts, limits: HostThresholds, *, need_gpus: bool = True) -> list[Check]:
    checks = [check_shm(facts, limits), check_disk(facts, limits), check_ram(facts, limits), check_iommu(facts)]
    if facts.docker_checked:
        checks.append(check_docker(facts, need_gpus=need_gpus))
    return checks
