"""Shared fixtures: a real Docker engine (or a skip that CI turns into a failure) and repo paths."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def _require_docker() -> bool:
    return os.environ.get("BWSTACK_REQUIRE_DOCKER") == "1"


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A live Docker SDK client. Without an engine the test is skipped, unless BWSTACK_REQUIRE_DOCKER=1
    (set by .ci/run), where a missing engine fails the test instead: CI must never skip Docker."""
    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as error:  # the SDK raises several unrelated types for "no daemon"
        message = f"no Docker engine: {error}"
        if _require_docker():
            pytest.fail(message + " (BWSTACK_REQUIRE_DOCKER=1)")
        pytest.skip(message)
    yield client
    client.close()


@pytest.fixture(scope="session")
def static_busybox() -> Path:
    """A statically linked busybox to COPY into FROM-scratch test images (Debian's busybox-static)."""
    # BWSTACK_TEST_BUSYBOX names the one place to look (empty: nowhere), to try the suite as a machine
    # without busybox-static would run it.
    override = os.environ.get("BWSTACK_TEST_BUSYBOX")
    candidates = [Path(override)] if override else [] if override is not None else [
        Path("/bin/busybox"), Path("/usr/bin/busybox"), *([Path(f)] if (f := shutil.which("busybox")) else [])
    ]  # fmt: skip
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if _require_docker():
        pytest.fail("busybox-static is not installed (apt-get install busybox-static)")
    pytest.skip("busybox-static is not installed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under BWSTACK_REQUIRE_DOCKER=1 a skipped Docker test is a failure, whatever skipped it."""
    outcome = yield
    report = outcome.get_result()
    if _require_docker() and report.skipped and item.get_closest_marker("docker") is not None:
        report.outcome = "failed"
        report.longrepr = f"Docker test skipped under BWSTACK_REQUIRE_DOCKER=1: {report.longrepr}"


# --- Things the tests create: one label per test run, and clean-up that removes only what carries it. ---

TEST_RUN_LABEL = "io.bwstack.test-run"


@pytest.fixture(scope="session")
def run_id() -> str:
    """This pytest run's id: in test repository names and in the label on everything the tests create."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="session", autouse=True)
def run_label(run_id: str) -> Iterator[dict[str, str]]:
    """{label: run id}. Exported as BWSTACK_LABELS so every container bwstack creates in this run, in this
    process or in an `invoke` child, carries it too."""
    label = {TEST_RUN_LABEL: run_id}
    previous = os.environ.get("BWSTACK_LABELS")
    os.environ["BWSTACK_LABELS"] = f"{TEST_RUN_LABEL}={run_id}"
    yield label
    if previous is None:
        os.environ.pop("BWSTACK_LABELS", None)
    else:
        os.environ["BWSTACK_LABELS"] = previous


def wait_until(predicate: Callable[[], object], timeout: float, *, interval: float = 0.05) -> bool:
    """Poll `predicate` until it is truthy or `timeout` seconds pass; whether it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def labelled_containers(client: Any, run_id: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{TEST_RUN_LABEL}={run_id}"})


@pytest.fixture
def tracked_containers(docker_client: Any, run_id: str) -> Iterator[dict[str, str]]:
    """Yields the labels to put on containers; afterwards removes every container carrying this run's label,
    and only those."""
    yield {TEST_RUN_LABEL: run_id}
    for container in labelled_containers(docker_client, run_id):
        with contextlib.suppress(Exception):
            container.remove(force=True)


class ImageTracker:
    """Test images live under per-run repository names; clean-up removes only the tags made here. An image
    that also carries someone else's tag (identical content builds to one id) keeps it and stays."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id, self.repos = client, run_id, []

    def repo(self, purpose: str = "image", *, registry: str = "") -> str:
        name = f"{registry}bwstack-test-{purpose}-{self.run_id}-{len(self.repos)}"
        self.repos.append(name)
        return name

    def clean(self) -> None:
        import docker.errors

        for repo in self.repos:
            for image in self.client.images.list(name=repo):
                for tag in [t for t in image.tags if t.startswith(f"{repo}:")]:
                    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                        self.client.images.remove(tag)  # untag; the engine deletes it only with no tag left
        for image in self.client.images.list(all=True, filters={"label": f"{TEST_RUN_LABEL}={self.run_id}"}):
            if not image.tags:  # ours by label and nobody's by name
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    self.client.images.remove(image.id)


@pytest.fixture
def tracked_images(docker_client: Any, run_id: str) -> Iterator[ImageTracker]:
    tracker = ImageTracker(docker_client, run_id)
    yield tracker
    tracker.clean()


@pytest.fixture(scope="module")
def module_images(docker_client: Any, run_id: str) -> Iterator[ImageTracker]:
    tracker = ImageTracker(docker_client, run_id)
    yield tracker
    tracker.clean()


# No test may write the user's phase history: every smoke or bench run a test starts (in this process or
# as a subprocess, which inherits the environment) records into a throw-away file instead.
os.environ["BWSTACK_HISTORY"] = os.path.join(tempfile.mkdtemp(prefix="bwstack-test-history-"), "history.sqlite")
