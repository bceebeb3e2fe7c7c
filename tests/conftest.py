"""Shared fixtures: a real Docker engine (or a skip that CI turns into a failure) and repo paths."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

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
    for candidate in (Path("/bin/busybox"), Path("/usr/bin/busybox")):
        if candidate.exists():
            return candidate
    found = shutil.which("busybox")
    if found:
        return Path(found)
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


# No test may write the user's phase history: every smoke or bench run a test starts (in this process or
# as a subprocess, which inherits the environment) records into a throw-away file instead.
os.environ["BWSTACK_HISTORY"] = os.path.join(tempfile.mkdtemp(prefix="bwstack-test-history-"), "history.sqlite")
