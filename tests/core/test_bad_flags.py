"""Flags that were accepted though wrong, or refused with a misleading message: one true line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from bwstack.errors import BwstackError
from bwstack.inputs import image_reference, number
from tests.helpers import invoke
from tests.paths import package


def assert_one_line(args: list[str], fragment: str) -> None:
    result = invoke(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["render", "--arch", "sm120", "--max-jobs", "99999999999999999999999"], "--max-jobs must be at most"),
        (["fleet", "--arch", "sm120", "--image", "BAD IMAGE"], "--image 'BAD IMAGE' is not an image reference"),
        (["verify", "--arch", "sm120", "--path", str(package("good")), "--require", ""], "--require needs a"),
        (["smoke", "--recipe", "nosuch", "--command", "sleep 30", "--port", "34997"], "nosuch"),
        (["smoke", "--command", "sleep 30", "--model", "/tmp"], "not both"),
        (["smoke", "--command", "sleep 30", "--port", "34997", "--stall-timeout", "0"], "--stall-timeout must be"),
        (["smoke", "--command", "sleep 30", "--port", "34997", "--grace", "-1"], "--grace must be positive"),
        (["smoke", "--model", "/etc/hostname"], "is a file, not a folder"),
    ],
    ids=["max-jobs", "fleet-image", "require-empty", "recipe-nosuch", "command-and-model", "stall", "grace", "model"],
)
def test_wrong_flags_exit_2_with_one_true_line(args: list[str], fragment: str) -> None:
    assert_one_line(args, fragment)


def test_json_in_a_missing_folder_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    target = tmp_path / "nonexistent" / "dir" / "v.json"
    assert_one_line(["verify", "--arch", "sm120", "--path", str(package("good")), "--json", str(target)], "does not")
    assert not (tmp_path / "nonexistent").exists()


def test_json_under_a_regular_file_names_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = ["verify", "--arch", "sm120", "--path", str(package("good")), "--json", str(blocker / "v.json")]
    assert_one_line(args, f"{blocker} is a file, not a folder")


@pytest.mark.parametrize(
    "ref", ["bwstack:demo-sm120", "localhost:5000/a/b:1.0", "nvcr.io/nvidia/pytorch:25.01-py3", "a@sha256:" + "0" * 64]
)
def test_good_image_references_pass(ref: str) -> None:
    assert image_reference("--image", ref) == ref


@pytest.mark.parametrize("ref", ["BAD IMAGE", "", "Upper:tag", "a:b:c", "a/", "-a", "a:" + "t" * 200])
def test_bad_image_references_fail(ref: str) -> None:
    with pytest.raises(BwstackError, match="is not an image reference"):
        image_reference("--image", ref)


def test_number_maximum() -> None:
    assert number("--n", "7", int, maximum=7) == 7
    with pytest.raises(BwstackError, match="--n must be at most 7, got 8"):
        number("--n", "8", int, maximum=7)
