"""bwstack.inputs: numeric flags parsed by the tasks, bad input as one typed error."""

from __future__ import annotations

import pytest

from bwstack.errors import BwstackError, SmokeError
from bwstack.inputs import number, optional_number


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
