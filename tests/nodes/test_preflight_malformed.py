"""Malformed model metadata: every broken config.json, index or shard header is a failed check naming the file.

Wrong types at every level the model check reads, JSON nested deeper than the parser allows, a non-object
top level, numbers too big to print, negative offsets: preflight returns a Report (JSON and JUnit copies
included) and never lets an exception out, and the checkpoint is left as it was.
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bwstack.nodes.preflight import PreflightRequest, run_preflight
from bwstack.report import Report, Status
from tests.fakes import fake_pynvml as fakes
from tests.nodes.test_preflight_model import KIMI_K25_CONFIG

SHARD = "model-00001-of-00001.safetensors"
INDEX = "model.safetensors.index.json"
# One F32[2] tensor in one shard: the smallest checkpoint with every file the model check reads.
HEADER: dict[str, Any] = {
    "__metadata__": {"format": "pt"},
    "w.weight_packed": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
}
WEIGHT_MAP = {"w.weight_packed": SHARD}

Path_ = tuple[str | int, ...]


def _raw(value: Any) -> str | bytes:
    """JSON text for a value, or the value itself when a case gives raw text (deep nesting, bad bytes)."""
    return value if isinstance(value, str | bytes) else json.dumps(value)


def write_checkpoint(root: Path, *, config: Any = None, index: Any = None, header: Any = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = KIMI_K25_CONFIG if config is None else config
    index = {"metadata": {"total_size": 8}, "weight_map": WEIGHT_MAP} if index is None else index
    header_raw = _raw(HEADER if header is None else header)
    # surrogatepass: a fuzzed lone surrogate becomes the invalid UTF-8 bytes a broken file would hold
    header_bytes = header_raw.encode("utf-8", "surrogatepass") if isinstance(header_raw, str) else header_raw
    for name, text in (("config.json", _raw(config)), (INDEX, _raw(index))):
        (root / name).write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    (root / SHARD).write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + b"\0" * 8)
    return root


def fingerprint(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def preflight(root: Path) -> Report:
    """The whole preflight with a model, on the fake 8x RTX PRO node; the report's copies must serialize."""
    before = fingerprint(root)
    report = run_preflight(PreflightRequest(tp=1, model=root, docker=False), nvml=fakes.rtx_pro_6000_pcie())
    assert isinstance(report, Report)
    json.loads(report.to_json())
    report.to_junit().encode("utf-8")
    assert fingerprint(root) == before, "the model check modified the checkpoint"
    return report


def check(report: Report, name: str):
    (found,) = [c for c in report.checks if c.name == name]
    return found


def replaced(document: Any, path: Path_, value: Any) -> Any:
    """A deep copy of document with the value at path replaced (path () replaces the whole document)."""
    if not path:
        return value
    document = copy.deepcopy(document)
    holder = document
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return document


QUANT = ("text_config", "quantization_config")
GROUP = (*QUANT, "config_groups", "group_0")
CONFIG_PATHS: list[Path_] = [
    (),
    ("architectures",),
    ("architectures", 0),
    ("model_type",),
    ("text_config",),
    QUANT,
    ("quantization_config",),
    (*QUANT, "quant_method"),
    (*QUANT, "format"),
    (*QUANT, "config_groups"),
    GROUP,
    (*GROUP, "weights"),
    (*GROUP, "weights", "num_bits"),
    (*GROUP, "weights", "type"),
    (*GROUP, "weights", "group_size"),
]
HEADER_PATHS: list[Path_] = [
    (),
    ("__metadata__",),
    ("__metadata__", "format"),
    ("w.weight_packed",),
    ("w.weight_packed", "dtype"),
    ("w.weight_packed", "shape"),
    ("w.weight_packed", "shape", 0),
    ("w.weight_packed", "data_offsets"),
    ("w.weight_packed", "data_offsets", 0),
    ("w.weight_packed", "data_offsets", 1),
]
INDEX_PATHS: list[Path_] = [
    (),
    ("metadata",),
    ("metadata", "total_size"),
    ("weight_map",),
    ("weight_map", "w.weight_packed"),
]

DEEP = ["[" * n + "]" * n for n in (300, 1000, 5000, 100_000)] + ['{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"]

# JSON values chosen to hurt: every JSON type, numbers too large to print (over 4300 digits), negative, NaN.
_HUGE = st.sampled_from([2**63, 2**64 - 1, 10**4000, -(2**63), -1, -8])
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | _HUGE
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
    | st.sampled_from(["\ud800", "[/b]", "../../etc/passwd", "/abs", "F32"])
)
JSON_VALUES = st.recursive(
    _LEAVES,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)

FUZZ = settings(
    max_examples=60,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(path=st.sampled_from(CONFIG_PATHS), value=JSON_VALUES)
def test_any_config_value_at_any_level_gives_a_report(path: Path_, value: Any) -> None:
    with tempfile.TemporaryDirectory() as folder:
        report = preflight(write_checkpoint(Path(folder), config=replaced(KIMI_K25_CONFIG, path, value)))
        config = check(report, "model.config")
        if config.status is Status.FAIL:
            assert "config.json" in config.finding


@FUZZ
@given(path=st.sampled_from(HEADER_PATHS), value=JSON_VALUES)
def test_any_header_value_at_any_level_gives_a_report(path: Path_, value: Any) -> None:
    with tempfile.TemporaryDirectory() as folder:
        report = preflight(write_checkpoint(Path(folder), header=replaced(HEADER, path, value)))
        shards = check(report, "model.shards")
        if shards.status is Status.FAIL:
            assert SHARD in shards.finding


@FUZZ
@given(path=st.sampled_from(INDEX_PATHS), value=JSON_VALUES)
def test_any_index_value_at_any_level_gives_a_report(path: Path_, value: Any) -> None:
    index = {"metadata": {"total_size": 8}, "weight_map": WEIGHT_MAP}
    with tempfile.TemporaryDirectory() as folder:
        report = preflight(write_checkpoint(Path(folder), index=replaced(index, path, value)))
        assert {"model.config", "model.index"} <= {c.name for c in report.checks}


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ({"architectures": 5}, "architectures is a number (5), expected an array of strings"),
        ({"architectures": [5]}, "architectures is an array ([5]), expected an array of strings"),
        ({"architectures": {"0": "X"}}, "architectures is an object"),
        ({"model_type": ["kimi"]}, "model_type is an array (['kimi']), expected a string"),
        ({"text_config": "x"}, "text_config is a string ('x'), expected an object"),
        ({"quantization_config": 4}, "quantization_config is a number (4), expected an object"),
        (
            {"quantization_config": {"config_groups": 5}},
            "quantization_config.config_groups is a number (5), expected an object",
        ),
        (
            {"quantization_config": {"config_groups": [{"weights": {}}]}},
            "quantization_config.config_groups is an array",
        ),
        (
            {"quantization_config": {"config_groups": {"group_0": 5}}},
            "quantization_config.config_groups.group_0 is a number (5), expected an object",
        ),
        (
            {"text_config": {"quantization_config": {"config_groups": {"g": {"weights": [4]}}}}},
            "text_config.quantization_config.config_groups.g.weights is an array ([4]), expected an object",
        ),
        (
            {"quantization_config": {"config_groups": {"g": {"weights": {"num_bits": {"x": 4}}}}}},
            "quantization_config.config_groups.g.weights.num_bits is an object ({'x': 4})",
        ),
        ({"quantization_config": {"format": 1e999}}, "quantization_config.format is a number (inf), expected a string"),
        ({"architectures": ["\ud800"]}, "architectures is an array (['\\ud800']), expected an array of strings"),
        ([1, 2], "does not parse: not a JSON object"),
        ("7", "does not parse: not a JSON object"),
        ('{"n": 1' + "0" * 5000 + "}", "does not parse: Exceeds the limit (4300 digits)"),
        *[(deep, "does not parse: nested deeper than the JSON parser allows") for deep in DEEP[1:]],
    ],
)
def test_malformed_config_is_a_failed_check_naming_the_file(tmp_path: Path, config: Any, problem: str) -> None:
    report = preflight(write_checkpoint(tmp_path / "m", config=config))
    found = check(report, "model.config")
    assert found.status is Status.FAIL
    assert found.finding.startswith(f"{tmp_path / 'm' / 'config.json'} ")
    assert problem in found.finding
    assert check(report, "model.shards").status is Status.PASS  # the rest of the checkpoint is still checked


def test_deep_but_parsable_nesting_in_a_field_is_named_briefly(tmp_path: Path) -> None:
    """300 levels parse (1000 need not, depending on the stack): the finding shows three, not 300."""
    report = preflight(write_checkpoint(tmp_path / "m", config='{"architectures": [' + DEEP[0] + "]}"))
    found = check(report, "model.config")
    assert found.status is Status.FAIL and "architectures is an array ([[[...]]])" in found.finding
    assert len(found.finding) < 300


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        ([1, 2], "header is an array ([1, 2]), not a JSON object"),
        ("5", "header is a number (5), not a JSON object"),
        ({"__metadata__": [1]}, "__metadata__ is an array ([1]), not an object"),
        ({"__metadata__": {"format": {"x": 1}}}, "__metadata__['format'] is an object ({'x': 1}), expected a string"),
        ({"w": 5}, "tensor 'w': header entry is a number (5), not an object"),
        ({"w": {"dtype": 7, "shape": [2], "data_offsets": [0, 8]}}, "tensor 'w': dtype is a number (7)"),
        ({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}}, "tensor 'w': shape 2 is not a list of sizes"),
        ({"w": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}}, "shape [True, 2] is not a list"),
        ({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, "shape [-2] is not a list of sizes"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, "data_offsets [-8, 0] are not [begin, end]"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 2**64]}}, "are not [begin, end]"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]}}, "data_offsets [0.0, 8.0] are not"),
        ({"w": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 8]}}, "holds 2**63 elements or more"),
        ({"w": {"dtype": "F32", "shape": [10**4000], "data_offsets": [0, 8]}}, "is not a list of sizes"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": "0-8"}}, "data_offsets '0-8' are not [begin, end]"),
        ({"\ud800": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, "is not valid UTF-8 text"),
        ('{"w": 1' + "0" * 5000 + "}", "header is not valid JSON (Exceeds the limit (4300 digits)"),
        (b"\xff\xfe{}", "header is not valid JSON ('utf-8' codec can't decode"),
        *[(deep, "header is not valid JSON (nested deeper than the JSON parser allows)") for deep in DEEP[1:]],
    ],
)
def test_malformed_header_is_a_failed_check_naming_the_shard(tmp_path: Path, header: Any, problem: str) -> None:
    report = preflight(write_checkpoint(tmp_path / "m", header=header))
    found = check(report, "model.shards")
    assert found.status is Status.FAIL
    assert f"{SHARD}: " in found.finding and problem in found.finding, found.finding
    assert len(found.finding) < 400


@pytest.mark.parametrize(
    ("index", "problem"),
    [
        ([1], "is an array ([1]), not a JSON object"),
        ({"weight_map": 5}, "has weight_map a number (5), expected an object of tensor -> file"),
        ({}, "has weight_map null, expected an object of tensor -> file"),
        ({"weight_map": {"w": 5}}, "names a shard by a number (5), expected a file name"),
        ({"weight_map": {"w": "../../etc/passwd"}}, "names the shard '../../etc/passwd', which is not a file inside"),
        ({"weight_map": {"w": "/etc/passwd"}}, "which is not a file inside the model folder"),
        ({"weight_map": {"w": "a\0b"}}, "which is not a file inside the model folder"),
        ({"weight_map": {"w": "\ud800"}}, "names a shard by a string ('\\ud800'), expected a file name"),
        ({"weight_map": {"\ud800": SHARD}}, "names a tensor '\\ud800' that is not valid UTF-8 text"),
        (DEEP[-1], "does not parse: nested deeper than the JSON parser allows"),
    ],
)
def test_malformed_index_is_a_failed_check_naming_the_file(tmp_path: Path, index: Any, problem: str) -> None:
    report = preflight(write_checkpoint(tmp_path / "m", index=index))
    found = check(report, "model.index")
    assert found.status is Status.FAIL
    assert found.finding.startswith(f"{tmp_path / 'm' / INDEX} ") and problem in found.finding, found.finding


@pytest.mark.parametrize("name", ["config.json", INDEX])
def test_metadata_that_is_a_fifo_is_a_finding_not_a_hang(tmp_path: Path, name: str) -> None:
    import os

    root = write_checkpoint(tmp_path / "model")
    (root / name).unlink()
    os.mkfifo(root / name)
    report = run_preflight(PreflightRequest(tp=1, model=root, docker=False), nvml=fakes.rtx_pro_6000_pcie())
    failed = [c for c in report.checks if c.status is Status.FAIL and c.name.startswith("model.")]
    assert failed and "is not a regular file" in failed[0].finding
