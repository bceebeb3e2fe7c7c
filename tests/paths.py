"""The one place tests learn where things are: the checkout, the fixtures and the fixture packages."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
EMULATOR = REPO / "tests" / "emulator" / "sglang_emulator.py"
# The demo stack ships copies of two nvcc-built packages as package data (images/demo/packages);
# tests/images/test_package_data.py keeps them byte-identical to these.
PACKAGES = FIXTURES / "packages"


def package(variant: str) -> Path:
    """The folder of an nvcc-built sgl_kernel-shaped fixture package (good, incident, ptx-fallback, ...)."""
    return PACKAGES / variant
