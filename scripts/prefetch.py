#!/usr/bin/env python3
"""Download every release that tests/released.toml lists into the wheel cache, once.

    python3 scripts/prefetch.py            # what .ci/run and `invoke test` run first

Honours the user's pip configuration (index URL, mirrors). Exit 1 when a release cannot be fetched: the
tests need them all, so CI must fail here rather than skip later. Standard library only, so it runs before
any virtual environment exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "tests" / "released.toml"
DEFAULT_PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64"]


def cache_dir() -> Path:
    return Path(os.environ.get("BWSTACK_CACHE", Path.home() / ".cache" / "bwstack" / "wheels"))


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def cached(name: str, version: str, folder: Path | None = None) -> Path | None:
    """The cached wheel of name==version, if any (wheel file names use the normalised name)."""
    folder = folder or cache_dir()
    prefix = f"{normalised(name)}-{version}-"
    matches = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix)) if folder.is_dir() else []
    return matches[0] if matches else None


def rows() -> list[dict[str, object]]:
    return tomllib.loads(TABLE.read_text())["wheel"]


def fetch(row: dict[str, object], folder: Path) -> tuple[Path, float]:
    name, version = str(row["name"]), str(row["version"])
    found = cached(name, version, folder)
    if found:
        return found, 0.0
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(folder)]
    command += ["--python-version", str(row.get("python", "3.12"))]
    for platform in row.get("platforms", DEFAULT_PLATFORMS):  # type: ignore[union-attr]
        command += ["--platform", str(platform)]
    command.append(f"{name}=={version}")
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    found = cached(name, version, folder)
    if result.returncode != 0 or not found:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"cannot download {name}=={version}: {tail}")
    return found, time.monotonic() - started


def main() -> int:
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    total = 0
    failed = []
    for row in rows():
        try:
            path, seconds = fetch(row, folder)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            failed.append(str(error))
            print(f"prefetch: {error}", file=sys.stderr)
            continue
        total += path.stat().st_size
        if seconds:
            print(f"prefetch: {path.name} ({path.stat().st_size / 1e6:.0f} MB, {seconds:.1f} s)")
    print(
        f"prefetch: {len(rows()) - len(failed)} of {len(rows())} releases in {folder} "
        f"({total / 1e6:.0f} MB, {time.monotonic() - started:.1f} s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
