"""bwstack.inputs: flags and request fields checked once, bad input as one typed error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bwstack import inputs
from bwstack.errors import BwstackError, PreflightError, RenderError, SmokeError
from bwstack.inputs import check_model_folder, check_port, check_seconds, number, optional_number, writing


def test_numbers_parse_and_respect_the_minimum() -> None:
    assert number("--tp", " 8 ", int) == 8
    assert number("--stall-timeout", "1.5", float, minimum=0.1) == 1.5
    with pytest.raises(BwstackError, match=r"^--tp 'eight' is not a whole number$"):
        number("--tp", "eight", int)
    with pytest.raises(BwstackError, match=r"^--tp must be at least 1, got 0$"):
        number("--tp", "0", int, minimum=1)
    assert optional_number("--port", "", int) is None and optional_number("--port", None, int) is None


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_nan_and_infinity_are_not_numbers_a_flag_accepts(text: str) -> None:
    # nan < minimum is False: without the finiteness check nan passed every minimum
    with pytest.raises(SmokeError, match=rf"^--x '{text}' is not a finite number$"):
        number("--x", text, float, minimum=1, error=SmokeError)
    with pytest.raises(BwstackError, match="is not a finite number"):
        optional_number("--stall-timeout", text, float, minimum=1)


@pytest.mark.parametrize("port", [0, -1, 65536, 70000])
def test_ports_outside_1_to_65535_are_refused(port: int) -> None:
    with pytest.raises(SmokeError, match=rf"^--port {port} is not a TCP port \(1\.\.65535\)$"):
        check_port("--port", port, error=SmokeError)


def test_ports_inside_the_range_and_no_port_pass() -> None:
    assert [check_port("--port", p) for p in (1, 8000, 65535, None)] == [1, 8000, 65535, None]


@pytest.mark.parametrize("value", [0.0, -5.0, math.nan, math.inf])
def test_seconds_are_finite_and_positive(value: float) -> None:
    with pytest.raises(BwstackError, match=r"^--stall-timeout must be a positive number of seconds, got "):
        check_seconds("--stall-timeout", value)
    assert check_seconds("--stall-timeout", 0.5) == 0.5


def test_model_folder_must_exist_be_a_folder_and_be_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_model_folder(tmp_path) == tmp_path
    with pytest.raises(PreflightError, match=r"^model folder .*/missing does not exist \(remedy: pass --model DIR\)$"):
        check_model_folder(tmp_path / "missing", error=PreflightError)
    (tmp_path / "file").write_text("")
    with pytest.raises(BwstackError, match=r"model folder .*/file is not a folder"):
        check_model_folder(tmp_path / "file")

    def refuse(path: object) -> None:  # root lists any folder, so the kernel's refusal is simulated
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(inputs.os, "scandir", refuse)
    with pytest.raises(BwstackError, match=r"model folder .* cannot be read: Permission denied"):
        check_model_folder(tmp_path)


def test_write_failures_become_one_typed_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    expected = r"^cannot write .*/file/x: Not a directory \(remedy: pass --out elsewhere\)$"
    with (
        pytest.raises(RenderError, match=expected),
        writing(blocker / "x", error=RenderError, remedy="pass --out elsewhere"),
    ):
        (blocker / "x").mkdir(parents=True)
