"""`invoke advise` as a user runs it: a recorded preflight report and a model folder in, the command, the
environment and the rule table out; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from tests.advise import support
from tests.core.test_cli import assert_one_line_error
from tests.fakes import fake_pynvml as fakes
from tests.helpers import invoke
from tests.paths import REPO

DEMO_MODEL = REPO / "images" / "demo" / "model"


def recorded(tmp_path: Path, nvml: fakes.FakeNvml, *, iommu: bool, model: dict | None = None) -> Path:
    report = support.preflight_report(nvml, tmp_path / "sys", iommu=iommu)
    if model is not None:
        report["model"] = model
    path = tmp_path / "preflight.json"
    path.write_text(json.dumps(report))
    return path


def test_advise_from_a_recorded_preflight_prints_command_env_and_table(tmp_path: Path) -> None:
    preflight = recorded(tmp_path, fakes.rtx_pro_6000_pcie(), iommu=True, model=support.kimi_summary())
    out = tmp_path / "advice.json"
    result = invoke("advise", "--preflight", str(preflight), "--json", str(out))
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith("SGLANG_ENABLE_JIT_DEEPGEMM=0 NCCL_P2P_DISABLE=1 python3 -m sglang.launch_server")
    assert "--attention-backend triton" in first and "--disable-custom-all-reduce" in first
    assert "nccl-pcie" in result.stdout and "sglang#24633" in result.stdout  # the table names rule and source
    data = json.loads(out.read_text())
    assert data["kind"] == "advise" and data["advice"]["env"]["NCCL_P2P_DISABLE"] == "1"
    rows = {d["rule"]: d["decision"] for d in data["advice"]["decisions"]}
    assert rows["triton-ptxas"] == "not evaluated"  # no --image: never guessed
    assert rows["moe-runner"] == "applied"


def test_a_model_that_cannot_fit_is_refused_with_exit_1(tmp_path: Path) -> None:
    huge = {**support.kimi_summary(), "weight_bytes": 2_000_000_000_000}
    preflight = recorded(tmp_path, fakes.rtx_pro_6000_pcie(), iommu=False, model=huge)
    result = invoke("advise", "--preflight", str(preflight))
    assert result.returncode == 1
    assert "does not fit" in result.stdout


def test_advise_with_arch_and_a_model_folder(tmp_path: Path) -> None:
    result = invoke("advise", "--arch", "sm120", "--model", str(DEMO_MODEL), "--path", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "--moe-runner-backend triton" in result.stdout.splitlines()[0]  # from config.json: group 32, no actorder


def test_explain_names_the_rule_its_facts_and_source() -> None:
    result = invoke("advise", "--explain", "triton-ptxas")
    assert result.returncode == 0
    assert "TRITON_PTXAS_PATH" in result.stdout and "triton#8539" in result.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    assert_one_line_error(invoke("advise", "--explain", "nope"), "no rule 'nope'")
    assert_one_line_error(invoke("advise", "--preflight", str(tmp_path / "missing.json")), "file not found")
    (tmp_path / "bad.json").write_text("[1]")
    assert_one_line_error(invoke("advise", "--preflight", str(tmp_path / "bad.json")), "not a JSON object")
    (tmp_path / "odd.json").write_text('{"gpus": [{"cc": "x"}], "host": {}}')
    assert_one_line_error(invoke("advise", "--preflight", str(tmp_path / "odd.json")), "lacks cc")
    assert_one_line_error(invoke("advise", "--arch", "sm77"), "unknown arch")
    assert_one_line_error(invoke("advise", "--arch", "sm120", "--preflight", str(tmp_path / "bad.json")), "one of")
