"""Every rule both ways (fires / does not fire), plus not evaluated when a fact is unknown, from recorded
preflight reports (the real preflight over the fake NVML) and recorded model/image facts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bwstack.advise import Decision, ImageFacts, NodeFacts, advise
from bwstack.recipes import load_recipe
from tests.advise import support
from tests.fakes import fake_pynvml as fakes

RECIPE = load_recipe("sglang")


def decisions(facts):
    advice = advise(RECIPE, facts)
    return advice, {d.rule: d for d in advice.decisions}


@pytest.fixture
def rtx_pcie_iommu(tmp_path: Path) -> NodeFacts:
    return NodeFacts.from_preflight(support.preflight_report(fakes.rtx_pro_6000_pcie(), tmp_path / "rtx", iommu=True))


@pytest.fixture
def b200(tmp_path: Path) -> NodeFacts:
    return NodeFacts.from_preflight(support.preflight_report(support.b200_nvlink(), tmp_path / "b200", iommu=True))


def test_recorded_preflight_reads_as_node_facts(rtx_pcie_iommu: NodeFacts, b200: NodeFacts) -> None:
    assert (rtx_pcie_iommu.cc, rtx_pcie_iommu.gpu_count, rtx_pcie_iommu.interconnect) == ((12, 0), 8, "pcie")
    assert rtx_pcie_iommu.iommu is True and rtx_pcie_iommu.gpu_memory == 97887 * 2**20
    assert (b200.cc, b200.interconnect) == ((10, 0), "nvlink")


def test_kimi_on_rtx_pro_pcie_gets_the_incident_fixes(rtx_pcie_iommu: NodeFacts) -> None:
    advice, by = decisions(support.facts(rtx_pcie_iommu))
    assert by["attention-backend"].args == ("--attention-backend", "triton")
    assert advice.env["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    assert by["moe-runner"].args == ("--moe-runner-backend", "triton")
    assert by["nccl-pcie"].decision is Decision.APPLIED
    assert by["nccl-pcie"].args == ("--disable-custom-all-reduce",) and advice.env["NCCL_P2P_DISABLE"] == "1"
    assert "iommu=pt" in by["nccl-pcie"].better
    assert by["memory"].decision is Decision.APPLIED
    assert by["memory"].args[0::2] == ("--mem-fraction-static", "--cuda-graph-max-bs-decode")
    assert by["triton-ptxas"].decision is Decision.NOT_NEEDED


def test_kimi_on_b200_nvlink_gets_none_of_the_sm120_fixes(b200: NodeFacts) -> None:
    advice, by = decisions(support.facts(b200))
    for rule in ("attention-backend", "deepgemm-off", "moe-runner", "nccl-pcie"):
        assert by[rule].decision is Decision.NOT_NEEDED, rule
    assert "NVLink" in by["nccl-pcie"].why
    assert "NCCL_P2P_DISABLE" not in advice.env and "--disable-custom-all-reduce" not in advice.args
    assert by["memory"].args[-1] == "256"  # 74 GB of 192 GB per GPU leaves room for the largest graphs


def test_attention_uses_flashinfer_only_where_the_image_proves_its_kernels(rtx_pcie_iommu: NodeFacts) -> None:
    _a, by = decisions(support.facts(rtx_pcie_iommu, img=support.image(flashinfer_runs=True)))
    assert by["attention-backend"].args == ("--attention-backend", "flashinfer")
    _a, by = decisions(support.facts(rtx_pcie_iommu, img=support.image(flashinfer_runs=False)))
    assert by["attention-backend"].args == ("--attention-backend", "triton")


def test_attention_not_needed_for_a_model_without_mla(rtx_pcie_iommu: NodeFacts) -> None:
    _a, by = decisions(support.facts(rtx_pcie_iommu, model=support.dense_bf16()))
    assert by["attention-backend"].decision is Decision.NOT_NEEDED
    assert by["moe-runner"].decision is Decision.NOT_NEEDED


def test_moe_runner_is_marlin_when_the_int4_layout_is_outside_triton(rtx_pcie_iommu: NodeFacts) -> None:
    model = dataclasses.replace(support.kimi(), int4_triton_ok=False)
    _a, by = decisions(support.facts(rtx_pcie_iommu, model=model))
    assert by["moe-runner"].args == ("--moe-runner-backend", "marlin")


def test_model_facts_from_summary_alone_leave_actorder_unknown_so_marlin() -> None:
    model = support.ModelFacts.from_summary(support.kimi_summary())
    assert (model.mla, model.int4_moe, model.int4_triton_ok) == (True, True, None)


def test_triton_ptxas_fires_when_its_ptxas_lacks_the_arch(rtx_pcie_iommu: NodeFacts) -> None:
    img = support.image(triton_ptxas_knows=False, triton_ptxas_env="TRITON_PTXAS_PATH")
    advice, by = decisions(support.facts(rtx_pcie_iommu, img=img))
    assert by["triton-ptxas"].decision is Decision.APPLIED
    assert advice.env["TRITON_PTXAS_PATH"] == "/usr/local/cuda/bin/ptxas"


def test_triton_ptxas_refuses_when_no_ptxas_knows_the_arch(rtx_pcie_iommu: NodeFacts) -> None:
    img = support.image(triton_ptxas_knows=False, cuda_ptxas_knows=False)
    advice, by = decisions(support.facts(rtx_pcie_iommu, img=img))
    assert by["triton-ptxas"].decision is Decision.REFUSED and advice.refused


def test_pcie_without_iommu_and_unknown_acs_is_not_evaluated(tmp_path: Path) -> None:
    node = NodeFacts.from_preflight(support.preflight_report(fakes.rtx_pro_6000_pcie(), tmp_path, iommu=False))
    _a, by = decisions(support.facts(node))
    assert by["nccl-pcie"].decision is Decision.NOT_EVALUATED and "acs" in by["nccl-pcie"].why
    _a, by = decisions(support.facts(dataclasses.replace(node, acs=False)))
    assert by["nccl-pcie"].decision is Decision.NOT_NEEDED
    _a, by = decisions(support.facts(dataclasses.replace(node, acs=True)))
    assert by["nccl-pcie"].decision is Decision.APPLIED


def test_memory_refuses_when_the_weights_do_not_fit(rtx_pcie_iommu: NodeFacts) -> None:
    advice, by = decisions(support.facts(rtx_pcie_iommu, tp=4))  # 148 GB per 96 GB GPU
    assert by["memory"].decision is Decision.REFUSED and "does not fit" in by["memory"].why
    assert [d.rule for d in advice.refused] == ["memory"]


def test_memory_sizes_the_graph_to_the_kv_room(rtx_pcie_iommu: NodeFacts) -> None:
    _a, by = decisions(support.facts(rtx_pcie_iommu))
    fraction, bs = float(by["memory"].args[1]), int(by["memory"].args[3])
    assert 0.8 < fraction < 0.95 and bs == 128  # 74 GB of a 103 GB GPU: a middle-sized KV pool


def test_unknown_facts_are_not_evaluated_never_guessed() -> None:
    _advice, by = decisions(support.facts(NodeFacts(cc=(12, 0)), img=ImageFacts()))
    for rule in ("nccl-pcie", "memory", "shm", "triton-ptxas"):
        assert by[rule].decision is Decision.NOT_EVALUATED, rule
    assert by["deepgemm-off"].decision is Decision.APPLIED


def test_shm_fires_for_docker_default_and_not_for_a_large_one(rtx_pcie_iommu: NodeFacts) -> None:
    _a, by = decisions(support.facts(dataclasses.replace(rtx_pcie_iommu, shm_bytes=64 * 2**20)))
    assert by["shm"].decision is Decision.APPLIED and "--shm-size" in by["shm"].better
    _a, by = decisions(support.facts(dataclasses.replace(rtx_pcie_iommu, shm_bytes=32 * 2**30)))
    assert by["shm"].decision is Decision.NOT_NEEDED


def test_speculative_from_the_recipe_table(rtx_pcie_iommu: NodeFacts, b200: NodeFacts) -> None:
    spec = {"algorithm": "EAGLE3", "draft_model": "/models/eagle3", "num_steps": 3, "eagle_topk": 1,
            "num_draft_tokens": 4}  # fmt: skip
    _a, by = decisions(support.facts(rtx_pcie_iommu, speculative=spec))
    args = by["speculative"].args
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert args[args.index("--speculative-draft-attention-backend") + 1] == "triton"
    _a, by = decisions(support.facts(b200, speculative=spec))
    assert "--speculative-draft-attention-backend" not in by["speculative"].args
    _a, by = decisions(support.facts(b200, speculative={}))
    assert by["speculative"].decision is Decision.NOT_NEEDED
    _a, by = decisions(support.facts(b200, speculative=None))
    assert by["speculative"].decision is Decision.NOT_EVALUATED


def test_the_docs_table_lists_every_rule_with_its_source() -> None:
    from bwstack.recipes.serving_rules import RULES
    from tests.paths import REPO

    text = (REPO / "docs" / "advise.md").read_text()
    for rule in RULES:
        assert f"| `{rule.name}` |" in text, rule.name
        first_issue = rule.source.split()[0].rstrip(",;")
        assert first_issue in text, (rule.name, first_issue)
