"""A short slice of benchmarks/fuzz_readers.py: 2,000 hostile inputs through the wheel, folder and
ELF/fatbin readers, in forked workers under a memory cap and a per-case time cap. None may escape as
anything but a bwstack error, hang, or exhaust memory. The full 100,000-case run is a benchmark."""

from __future__ import annotations

import importlib.util

from tests.paths import REPO


def load_fuzzer():
    spec = importlib.util.spec_from_file_location("fuzz_readers", REPO / "benchmarks" / "fuzz_readers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_thousand_hostile_inputs_are_all_handled() -> None:
    summary = load_fuzzer().fuzz(2000, workers=2, seed=20261130, case_seconds=10.0, memory_mb=1024)
    assert summary["cases"] == 2000
    assert set(summary["by_reader"]) == {"fatbin", "wheel", "folder"}
    assert summary["findings"] == [], summary["findings"][:5]
    assert summary["crashes"] == summary["timeouts"] == summary["memory"] == 0
