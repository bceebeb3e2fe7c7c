"""Released upstream wheels as test oracles: found in the prefetch cache, or the test FAILS (never skips)."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

from tests.paths import REPO

_spec = importlib.util.spec_from_file_location("bwstack_prefetch", REPO / "scripts" / "prefetch.py")
assert _spec and _spec.loader
prefetch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prefetch)


def released_wheel(name: str, version: str) -> Path:
    """The cached wheel of name==version; it must be listed in tests/released.toml."""
    listed = {(r["name"], r["version"]) for r in prefetch.rows()}
    assert (name, version) in listed, f"add {name}=={version} to tests/released.toml"
    found = prefetch.cached(name, version)
    if found is None:
        pytest.fail(f"{name}=={version} is not in {prefetch.cache_dir()}: run `python3 scripts/prefetch.py`")
    return found


def wheel_text(wheel: Path, member: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member).decode("utf-8")
