"""A serving emulator per test: started in its own process group, ready when /health says 200, always stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

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
            deadline = time.monotonic() + 30
            while True:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            yield Emulated(f"http://127.0.0.1:{port}", log, port)
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    return start
