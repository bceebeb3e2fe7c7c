"""A serving emulator per test: started in its own process group, ready when /health says 200, always stopped."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.conftest import wait_until
from tests.emulator.support import emulator_command, free_port


@dataclass(frozen=True)
class Emulated:
    url: str
    log: Path
    port: int


Serve = Callable[..., AbstractContextManager[Emulated]]


@pytest.fixture
def serve(tmp_path: Path) -> Serve:
    @contextmanager
    def start(*extra: str) -> Iterator[Emulated]:
        port = free_port()
        log = tmp_path / f"emulator-{port}.log"
        argv = emulator_command(port, "healthy", "--tp", "1", "--warmup-s", "0", *extra)
        with log.open("wb") as sink:
            process = subprocess.Popen(argv, stdout=sink, stderr=sink, start_new_session=True)
        try:

            def healthy() -> bool:
                try:
                    return requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
                except requests.RequestException:
                    return False

            # Stop waiting at once when the emulator exits: its log says why.
            assert wait_until(lambda: process.poll() is not None or healthy(), 30), log.read_text()
            assert process.poll() is None, log.read_text()
            yield Emulated(f"http://127.0.0.1:{port}", log, port)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    return start
