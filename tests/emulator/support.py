"""Helpers for smoke's tests: the emulator's command line, free ports, and leftover hunting."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import psutil

EMULATOR = Path(__file__).resolve().parent / "sglang_emulator.py"
DEMO_SERVER = Path(__file__).resolve().parents[2] / "images" / "demo" / "server"


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def emulator_command(port: int, scenario: str, *extra: str) -> tuple[str, ...]:
    return (sys.executable, str(EMULATOR), "--port", str(port), "--scenario", scenario, *extra)


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line contains `text`, other than this test process."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            if process.pid == psutil.Process().pid or process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if text in " ".join(process.info["cmdline"] or []):
                found.append(process)
        except psutil.Error:
            continue
    return found
