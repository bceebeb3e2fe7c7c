"""The advice is used, not only printed: smoke and provision launch the recipe's command with it, refuse it
beside --command, and smoke's crash diagnosis names the rule that would have avoided a known sm_12x crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bwstack.advise import AdviseError, load_advice
from bwstack.errors import SmokeError
from bwstack.nodes.provision import DEMO_MODEL, ProvisionRequest, _advise
from bwstack.recipes import load_recipe
from bwstack.smoke.diagnose import match_signatures
from bwstack.smoke.request import SmokeRequest, resolve_command
from tests.core.test_cli import assert_one_line_error
from tests.helpers import invoke


def advice_file(tmp_path: Path, **overrides: object) -> Path:
    """What `invoke advise --json` writes (it is run for real once, on the demo recipe's arch)."""
    path = tmp_path / "advice.json"
    result = invoke("advise", "--recipe", "demo", "--arch", "sm120", "--model", str(DEMO_MODEL), "--json", str(path))
    assert result.returncode == 0, result.stderr
    if overrides:
        data = json.loads(path.read_text())
        data["advice"].update(overrides)
        path.write_text(json.dumps(data))
    return path


def test_the_recipe_command_is_extended_by_the_advice() -> None:
    args = ("--attention-backend", "triton")
    command = resolve_command(SmokeRequest(model=DEMO_MODEL, recipe="demo", advice_args=args, advised=True))
    base = load_recipe("demo").serve_command(str(DEMO_MODEL), host="127.0.0.1", port=30000)
    assert list(command.argv) == base + list(args)
    assert command.source == "recipe demo with advice"


def test_advice_with_a_command_of_ones_own_is_refused() -> None:
    with pytest.raises(SmokeError, match="not --command"):
        SmokeRequest(command=("server",), port=8000, advised=True)


def test_smoke_task_refuses_advice_beside_command_and_bad_files(tmp_path: Path) -> None:
    advice = advice_file(tmp_path)
    assert load_advice(advice)["env"]["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    result = invoke("smoke", "--command", "true", "--port", "9", "--advice", str(advice))
    assert_one_line_error(result, "not --command")
    (tmp_path / "other.json").write_text('{"kind": "smoke"}')
    result = invoke("smoke", "--model", str(DEMO_MODEL), "--advice", str(tmp_path / "other.json"))
    assert_one_line_error(result, "not an `invoke advise --json` report")
    result = invoke("smoke", "--model", str(DEMO_MODEL), "--advice", str(advice), "--advise")
    assert_one_line_error(result, "not both")


def test_refused_advice_cannot_be_launched(tmp_path: Path) -> None:
    refused = advice_file(tmp_path, refused=["memory"])
    with pytest.raises(AdviseError, match="refused by rule memory"):
        load_advice(refused)


def test_provision_launches_with_a_given_advice_file(tmp_path: Path) -> None:
    advice = advice_file(tmp_path)
    request = ProvisionRequest("stack:tag", DEMO_MODEL, "demo", advice=advice)
    report = _advise(request, load_recipe("demo"), None, DEMO_MODEL, None)  # type: ignore[arg-type]
    assert report.data["advice"]["args"] == load_advice(advice)["args"]
    assert report.checks[0].finding.startswith(f"from {advice}: SGLANG_ENABLE_JIT_DEEPGEMM=0")


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("ptxas fatal   : Value 'sm_120' is not defined for option 'gpu-name'", "triton-ptxas"),
        ("RuntimeError: TllmGenFmhaRunner: Unsupported architecture", "attention-backend"),
        ("RuntimeError: No valid tactics available for fused moe op", "moe-runner"),
        ("Exception: Capture cuda graph failed: CUDA error: out of memory", "memory"),
        ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE)", "nccl-pcie"),
    ],
)
def test_known_sm12x_crashes_name_the_rule_that_avoids_them(line: str, rule: str) -> None:
    named = {m.signature.avoided_by for m in match_signatures([line])}
    assert rule in named
    (match,) = [m for m in match_signatures([line]) if m.signature.avoided_by == rule]
    assert f"rule {rule}" in match.to_dict()["remedy"] and match.to_dict()["avoided_by"] == rule


def test_an_ordinary_line_names_no_rule() -> None:
    assert not [m for m in match_signatures(["Load weight end. elapsed=3.1 s"]) if m.signature.avoided_by]
