"""The suite's own clean-up never removes a user's image, and tests that need busybox say why they skip."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bwstack.images.build import build_images
from tests.conftest import ImageTracker, wait_until
from tests.paths import REPO


@pytest.mark.docker
def test_clean_up_keeps_an_image_that_carries_a_tag_the_test_did_not_make(
    docker_client, static_busybox, run_id
) -> None:
    """`invoke build --recipe demo` by the user, then the tests build the same content under their own repo:
    one image id, two tags. The tests' clean-up must untag theirs and leave the user's image."""
    user = ImageTracker(docker_client, run_id)  # stands for the user: not cleaned by the tracker under test
    user_repo = user.repo("user")
    try:
        mine = build_images("demo-incident", ["sm120"], repo=user_repo, gate=False, client=docker_client)
        user_tag = mine.data["images"][0]["tags"][0]
        tests = ImageTracker(docker_client, run_id)
        test_repo = tests.repo("suite")
        theirs = build_images("demo-incident", ["sm120"], repo=test_repo, gate=False, client=docker_client)
        assert theirs.data["images"][0]["image_id"] == mine.data["images"][0]["image_id"]  # the trap: one id
        tests.clean()
        assert docker_client.images.get(user_tag).id == mine.data["images"][0]["image_id"]
        assert not docker_client.images.list(name=test_repo)
    finally:
        user.clean()


def test_wait_until_returns_as_soon_as_true_and_false_at_the_deadline() -> None:
    calls = iter(range(100))
    assert wait_until(lambda: next(calls) >= 3, timeout=5, interval=0.001)
    assert not wait_until(lambda: False, timeout=0.05, interval=0.01)


@pytest.mark.parametrize(("require", "outcome"), [("", "2 skipped"), ("1", "2 error")])
def test_busybox_tests_skip_with_a_reason_or_fail_in_ci(require: str, outcome: str) -> None:
    """A machine without busybox-static: a skip that says why, or under BWSTACK_REQUIRE_DOCKER=1 a failure."""
    selected = "context_is_minimal or daemon_down"
    env = {"BWSTACK_TEST_BUSYBOX": "", "BWSTACK_REQUIRE_DOCKER": require, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/images/test_build.py",
            "-k",
            selected,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert outcome in result.stdout, result.stdout[-2000:]
    if not require:
        assert result.stdout.count("busybox-static is not installed") >= 2, result.stdout[-2000:]
