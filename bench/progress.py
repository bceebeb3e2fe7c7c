"""Progress while a level runs: a bar redrawn in place on a terminal, a few plain lines in CI logs."""

from __future__ import annotations

import contextlib
import threading
from typing import TextIO

from bwstack.bench.levels import Progress


def progress_printer(stream: TextIO, *, prefix: str = "bench") -> Progress:
    """A terminal gets one line redrawn with '\\r'; anything else a line at each quarter of a level."""
    tty = stream.isatty()
    lock = threading.Lock()

    def show(label: str, done: int, total: int) -> None:
        with lock, contextlib.suppress(OSError):  # a closed terminal must not fail the bench
            if tty:
                width = 30
                filled = width * done // max(total, 1)
                stream.write(f"\r{prefix}: {label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
                if done >= total:
                    stream.write("\n")
                stream.flush()
            elif done * 4 // max(total, 1) > (done - 1) * 4 // max(total, 1):  # at each quarter
                stream.write(f"{prefix}: {label}: {done}/{total} requests\n")
                stream.flush()

    return show
