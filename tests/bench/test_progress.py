"""Progress: a bar redrawn in place on a terminal, a line per quarter of a level elsewhere."""

from __future__ import annotations

import io

from bwstack.bench.progress import progress_printer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_ci_logs_get_a_line_per_quarter() -> None:
    stream = io.StringIO()
    show = progress_printer(stream)
    for done in range(1, 11):
        show("concurrency 8", done, 10)
    assert stream.getvalue().splitlines() == [f"bench: concurrency 8: {n}/10 requests" for n in (3, 5, 8, 10)]


def test_a_terminal_gets_one_redrawn_bar() -> None:
    stream = Terminal()
    show = progress_printer(stream, prefix="base")
    for done in range(1, 5):
        show("concurrency 1", done, 4)
    text = stream.getvalue()
    assert text.count("\r") == 4 and text.endswith("] 4/4\n") and text.count("\n") == 1
    assert "\rbase: concurrency 1 [" + "#" * 30 + "] 4/4" in text
