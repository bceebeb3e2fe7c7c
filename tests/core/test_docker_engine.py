"""The Docker path is live from day one: a real engine builds and runs a FROM-scratch image via the SDK."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker


def _context(busybox: Path) -> io.BytesIO:
    dockerfile = (
        "FROM scratch\n"
        "COPY busybox /bin/busybox\n"
        'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
        'LABEL io.bwstack.test="engine"\n'
        'CMD ["/bin/sh", "-c", "echo hello from $(uname -s)"]\n'
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
        tar.add(busybox, arcname="busybox")
    buffer.seek(0)
    return buffer


def test_sdk_builds_and_runs_a_scratch_image(docker_client, tracked_images, static_busybox: Path) -> None:
    repo = tracked_images.repo("engine")
    tag = f"{repo}:hello"
    image, _ = docker_client.images.build(fileobj=_context(static_busybox), custom_context=True, tag=tag, rm=True)
    assert image.labels["io.bwstack.test"] == "engine"
    output = docker_client.containers.run(tag, remove=True, network_mode="host")
    assert output.decode().strip() == "hello from Linux"
    tracked_images.clean()
    assert not docker_client.images.list(name=repo)
