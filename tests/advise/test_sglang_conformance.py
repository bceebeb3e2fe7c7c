"""Every option, choice and environment variable the advisor can emit exists in the real released SGLang the
recipe pins (its wheel's option definitions parsed, never imported), with argparse's prefix rules: advice
must never stop a server with "unrecognized arguments" or "ambiguous option"."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bwstack.advise import AdviseError, NodeFacts, advise
from bwstack.advise.sglang_options import OptionTable, read_options
from bwstack.recipes import load_recipe
from bwstack.recipes.crash_signatures import KNOWN_CRASHES
from bwstack.recipes.serving_rules import OPTIONS, RULES, SUPPORTED_SGLANG, emittable, option_flag
from tests.advise import support
from tests.fakes import fake_pynvml as fakes
from tests.released import released_wheel, wheel_text

PINNED = load_recipe("sglang").sglang.version  # type: ignore[union-attr]
# The pin and the releases around the 0.5.20 removal of --cuda-graph-max-bs the rules also support.
SUPPORTED_RELEASES = sorted({PINNED, "0.5.19"})


def options(version: str) -> OptionTable:
    return read_options(released_wheel("sglang", version), version)


@pytest.fixture(scope="module")
def pinned() -> OptionTable:
    return options(PINNED)


def test_the_reader_finds_the_options_bwstack_relies_on(pinned: OptionTable) -> None:
    assert len({id(o) for o in pinned.by_name.values()}) > 400
    assert pinned.resolve("--disable-custom-all-reduce").kind == "switch"
    assert "trtllm_mla" in (pinned.resolve("--attention-backend").choices or ())
    assert pinned.resolve("--model").flag == "--model-path"  # an alias


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
def test_every_option_and_choice_the_rules_can_emit_exists(version: str) -> None:
    table = options(version)
    for flag, value in emittable(version):
        option = table.resolve(flag)
        assert flag in option.names, f"{flag} is only a prefix of {option.flag} in SGLang {version}"
        if value is not None:
            assert option.choices is not None, f"{flag}: choices unknown, so {value!r} is unchecked"
            assert value in option.choices, f"SGLang {version}: {flag} {value!r} is not a choice"


def test_the_advised_commands_of_both_worked_examples_parse(pinned: OptionTable, tmp_path: Path) -> None:
    recipe = load_recipe("sglang")
    spec = {"algorithm": "EAGLE3", "draft_model": "/d", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
    for name, nvml in (("rtx", fakes.rtx_pro_6000_pcie()), ("b200", support.b200_nvlink())):
        node = NodeFacts.from_preflight(support.preflight_report(nvml, tmp_path / name, iommu=True))
        advice = advise(recipe, support.facts(node, speculative=spec))
        argv = advice.command(recipe.serve_command("/models/k", host="127.0.0.1", port=30000))
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert pinned.problems(argv[3:]) == [], name
        assert len(advice.args) >= 4


def test_the_check_fails_on_an_unknown_an_ambiguous_or_a_bad_choice(pinned: OptionTable) -> None:
    assert "ambiguous option: --cuda-graph-max-bs" in pinned.problems(["--cuda-graph-max-bs", "64"])[0]
    assert "unrecognized arguments: --no-such-flag" in pinned.problems(["--no-such-flag"])[0]
    assert "not one of its choices" in pinned.problems(["--attention-backend", "trtllm_mla_v9"])[0]
    assert "expects a value" in pinned.problems(["--mem-fraction-static", "--disable-custom-all-reduce"])[0]
    assert pinned.problems(["--tp", "8", "--tp-size=8"]) == []  # a unique prefix, and --flag=value


def test_cuda_graph_max_bs_is_spelled_for_each_release() -> None:
    assert option_flag("cuda-graph-max-bs", PINNED) == "--cuda-graph-max-bs-decode"
    old = options("0.5.10")  # before the per-phase split: only the old name exists
    assert option_flag("cuda-graph-max-bs", "0.5.10") in old.resolve("--cuda-graph-max-bs").names
    with pytest.raises(AdviseError, match="unrecognized"):
        old.resolve(option_flag("cuda-graph-max-bs", PINNED))


def test_releases_the_rules_do_not_fit_are_refused(tmp_path: Path) -> None:
    assert "0.5.10" not in SUPPORTED_SGLANG and PINNED in SUPPORTED_SGLANG
    # 0.5.10 really lacks a choice the moe-runner rule emits: why the floor is where it is.
    assert "marlin" not in (options("0.5.10").resolve("--moe-runner-backend").choices or ())
    text = (load_recipe("sglang").path).read_text().replace(f'version = "{PINNED}"', 'version = "0.5.10"')
    old = tmp_path / "sglang.toml"
    old.write_text(text)
    with pytest.raises(AdviseError, match="older than the advisor"):
        advise(load_recipe(str(old)), support.facts(NodeFacts(cc=(12, 0))))


def _environ_names(version: str) -> set[str]:
    tree = ast.parse(wheel_text(released_wheel("sglang", version), "sglang/srt/environ.py"))
    return {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def test_every_sglang_environment_variable_the_rules_set_is_read_by_sglang() -> None:
    names = _environ_names(PINNED)
    node = NodeFacts(cc=(12, 0), gpu_count=8, gpu_memory=96 * 2**30, interconnect="pcie", iommu=True)
    every = {k for rule in RULES for k, _v in rule.emit(support.facts(node).named()).env}
    sglang = {k for k in every if k.startswith("SGLANG_")}
    assert sglang == {"SGLANG_ENABLE_JIT_DEEPGEMM"}
    assert sglang <= names


def test_the_cuda_graph_crash_signature_matches_sglangs_message() -> None:
    runner = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
    source = wheel_text(released_wheel("sglang", PINNED), runner)
    message = re.search(r'f"(Capture cuda graph failed: )\{e\}', source)
    assert message is not None
    (crash,) = [c for c in KNOWN_CRASHES if c.name == "cuda-graph-capture"]
    assert re.search(crash.pattern, message.group(1) + "CUDA out of memory")


def test_every_known_crash_names_a_rule() -> None:
    names = {rule.name for rule in RULES}
    assert all(crash.avoided_by in names for crash in KNOWN_CRASHES)
    assert set(OPTIONS) >= {"attention-backend", "moe-runner-backend", "cuda-graph-max-bs"}
