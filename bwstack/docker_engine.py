"""The one way bwstack reaches a Docker engine: a pinged SDK client, or DockerError (exit 2) saying why."""

from __future__ import annotations

from typing import Any

from bwstack.errors import DockerError


def first_line(error: BaseException) -> str:
    """An SDK error as one short line (its text can be empty or span a whole HTTP response)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def connect(client: Any | None = None, *, timeout: int = 120) -> Any:
    """`client` if given (tests pass their own), else one from the environment (DOCKER_HOST or the local
    socket); either way pinged, so an engine that is down fails here with one line, not mid-build."""
    import docker
    import docker.errors
    import requests.exceptions

    try:
        client = client or docker.from_env(timeout=timeout)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        raise DockerError(
            f"Docker engine unreachable: {first_line(error)}",
            remedy="start dockerd (systemctl start docker) or set DOCKER_HOST",
        ) from None
    return client
