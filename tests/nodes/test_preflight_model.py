"""Model folder checks on tiny real safetensors checkpoints shaped like Kimi-K2.5 INT4 (compressed-tensors)."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from bwstack.errors import PreflightError
from bwstack.nodes.preflight import PreflightRequest, check_model, run_preflight
from bwstack.nodes.preflight.safetensors_header import ShardError, read_header
from bwstack.report import Status
from tests.fakes import fake_pynvml as fakes

# Kimi-K2.5 nests the DeepSeek-V3-shaped language model's config, quantization_config included, in text_config.
KIMI_K25_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "n_routed_experts": 4,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "input_activations": None,
                    "output_activations": None,
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": 32,
                        "dynamic": False,
                    },
                }
            },
        },
    },
    "vision_config": {"hidden_size": 32},
}


def _expert(layer: int, expert: int) -> dict[str, np.ndarray]:
    """One routed expert's down_proj as compressed-tensors packs it: 8 INT4 values per int32, a scale per 32."""
    base = f"language_model.model.layers.{layer}.mlp.experts.{expert}.down_proj"
    return {
        f"{base}.weight_packed": np.full((64, 8), layer * 16 + expert, dtype=np.int32),
        f"{base}.weight_scale": np.ones((64, 2), dtype=np.float16),
        f"{base}.weight_shape": np.array([64, 64], dtype=np.int32),
    }


def shards_for(layers: int = 2, experts: int = 4) -> dict[str, dict[str, np.ndarray]]:
    """Four shards: embeddings first, one per layer's experts, the head last (as Hugging Face shards them)."""
    total = 2 + layers
    name = "model-{:05d}-of-{:05d}.safetensors".format
    shards = {name(1, total): {"language_model.model.embed_tokens.weight": np.zeros((128, 64), dtype=np.float16)}}
    for layer in range(layers):
        tensors: dict[str, np.ndarray] = {
            f"language_model.model.layers.{layer}.input_layernorm.weight": np.ones(64, dtype=np.float16)
        }
        for expert in range(experts):
            tensors |= _expert(layer, expert)
        shards[name(layer + 2, total)] = tensors
    shards[name(total, total)] = {
        "language_model.model.norm.weight": np.ones(64, dtype=np.float16),
        "language_model.lm_head.weight": np.zeros((128, 64), dtype=np.float16),
    }
    return shards


def write_checkpoint(root: Path, shards: dict[str, dict[str, np.ndarray]] | None = None, *, extra_index=None) -> Path:
    shards = shards or shards_for()
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(KIMI_K25_CONFIG, indent=2))
    weight_map, total = {}, 0
    for file, tensors in shards.items():
        save_file(tensors, str(root / file), metadata={"format": "pt"})
        for tensor_name, array in tensors.items():
            weight_map.setdefault(tensor_name, file)
            total += array.nbytes
    weight_map |= extra_index or {}
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return root


def fingerprint(root: Path) -> dict[str, tuple[int, int, str]]:
    return {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.iterdir())
    }


def by_name(checks):
    return {c.name: c for c in checks}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "Kimi-K2.5")


def test_complete_checkpoint_passes_and_is_left_untouched(checkpoint: Path) -> None:
    before = fingerprint(checkpoint)
    checks, summary = check_model(checkpoint, tp=8, gpu_memory_bytes=96 * 10**9)
    found = by_name(checks)
    assert [c.name for c in checks] == ["model.config", "model.index", "model.shards", "model.tensors", "model.fit"]
    assert all(c.status is Status.PASS for c in checks), [c.to_dict() for c in checks]
    assert found["model.config"].finding == (
        "KimiK25ForConditionalGeneration (kimi_k25), compressed-tensors pack-quantized INT4 (group 32)"
    )
    assert summary.quantization["where"] == "text_config.quantization_config"
    assert summary.quantization["weights"][0]["num_bits"] == 4
    arrays = [a for tensors in shards_for().values() for a in tensors.values()]
    assert summary.tensors == len(arrays)
    assert summary.weight_bytes == sum(a.nbytes for a in arrays)
    assert summary.bytes_per_gpu == -(-summary.weight_bytes // 8)
    assert summary.fits is True
    assert "20% of each GPU kept for KV cache" in found["model.fit"].finding
    assert fingerprint(checkpoint) == before


def test_missing_shard_fails_naming_the_file(checkpoint: Path) -> None:
    (checkpoint / "model-00003-of-00004.safetensors").unlink()
    found = by_name(check_model(checkpoint, tp=8)[0])
    index = found["model.index"]
    assert index.status is Status.FAIL
    assert "1 of 4 shards the index names are missing: model-00003-of-00004.safetensors" in index.finding
    assert index.evidence["missing"] == ["model-00003-of-00004.safetensors"]
    assert found["model.shards"].status is Status.PASS  # the three present shards are fine
    assert found["model.tensors"].status is Status.PASS  # the index's total_size is not compared when incomplete
    assert found["model.fit"].status is Status.SKIP  # no GPU memory given


def test_truncated_shard_fails_naming_the_file(checkpoint: Path) -> None:
    shard = checkpoint / "model-00002-of-00004.safetensors"
    size = shard.stat().st_size
    with shard.open("r+b") as handle:
        handle.truncate(size - 100)
    before = fingerprint(checkpoint)
    found = by_name(check_model(checkpoint, tp=8, gpu_memory_bytes=10**12)[0])
    shards = found["model.shards"]
    assert shards.status is Status.FAIL
    assert "model-00002-of-00004.safetensors: truncated" in shards.finding
    assert f"{size - 100} bytes, the header describes {size} (100 missing)" in shards.finding
    assert found["model.fit"].status is Status.WARN  # counted over the readable shards only
    assert fingerprint(checkpoint) == before


def test_header_cut_short_is_a_truncated_shard(checkpoint: Path) -> None:
    shard = checkpoint / "model-00004-of-00004.safetensors"
    shard.write_bytes(shard.read_bytes()[:40])
    bad = by_name(check_model(checkpoint)[0])["model.shards"].evidence["bad"]
    assert bad == {"model-00004-of-00004.safetensors": bad["model-00004-of-00004.safetensors"]}
    assert "truncated: header length" in bad["model-00004-of-00004.safetensors"]


def test_tensor_in_two_shards(tmp_path: Path) -> None:
    shards = shards_for()
    first, second = list(shards)[1:3]
    shards[second]["language_model.model.layers.0.input_layernorm.weight"] = np.ones(64, dtype=np.float16)
    root = write_checkpoint(tmp_path / "m", shards)
    tensors = by_name(check_model(root)[0])["model.tensors"]
    assert tensors.status is Status.FAIL
    assert "1 tensor(s) in more than one shard" in tensors.finding
    assert tensors.evidence["in_several_shards"] == {
        "language_model.model.layers.0.input_layernorm.weight": [first, second]
    }


def test_index_naming_a_tensor_no_shard_has(tmp_path: Path) -> None:
    ghost = {"language_model.model.layers.9.mlp.gate.weight": "model-00001-of-00004.safetensors"}
    root = write_checkpoint(tmp_path / "m", extra_index=ghost)
    tensors = by_name(check_model(root)[0])["model.tensors"]
    assert tensors.status is Status.FAIL
    assert "1 tensor(s) the index places in a shard that lacks them" in tensors.finding
    assert tensors.evidence["missing_from_shard"] == ghost


def test_tensor_missing_from_the_index(checkpoint: Path) -> None:
    index_path = checkpoint / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"]["language_model.lm_head.weight"]
    index_path.write_text(json.dumps(index))
    tensors = by_name(check_model(checkpoint)[0])["model.tensors"]
    assert tensors.status is Status.FAIL
    assert tensors.evidence["missing_from_index"] == ["language_model.lm_head.weight"]


def test_weights_that_do_not_fit_fail_with_the_assumption_named(checkpoint: Path) -> None:
    checks, summary = check_model(checkpoint, tp=2, gpu_memory_bytes=20_000)
    fit = by_name(checks)["model.fit"]
    assert fit.status is Status.FAIL and summary.fits is False
    assert fit.evidence["weight_budget_bytes"] == 16_000
    assert "assumes weights split evenly over tp 2 and 20% of each GPU kept" in fit.finding


def test_preflight_with_fake_gpus_checks_the_model_against_the_smallest_gpu(checkpoint: Path, tmp_path: Path) -> None:
    request = PreflightRequest(tp=8, model=checkpoint, docker=False)
    report = run_preflight(request, nvml=fakes.mixed_node())
    fit = by_name(report.checks)["model.fit"]
    assert fit.evidence["gpu_memory_bytes"] == 81559 * fakes.MiB  # the H100s, not the RTX PROs
    assert report.data["model"]["fits"] is True and report.data["model"]["shards"] == 4


def test_not_a_checkpoint_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(KIMI_K25_CONFIG))
    index = by_name(check_model(tmp_path)[0])["model.index"]
    assert index.status is Status.FAIL and "no model.safetensors.index.json and no model.safetensors" in index.finding
    with pytest.raises(PreflightError, match="does not exist"):
        check_model(tmp_path / "nowhere")


def test_single_file_checkpoint(tmp_path: Path) -> None:
    save_file({"w": np.zeros((4, 4), dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    checks, summary = check_model(tmp_path)
    assert all(c.status in (Status.PASS, Status.SKIP) for c in checks), [c.to_dict() for c in checks]
    assert summary.weight_bytes == 64 and by_name(checks)["model.config"].finding.endswith(
        "not quantized (no quantization_config)"
    )


def _raw_shard(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "problem"),
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 12, "4 bytes after the last tensor"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "F32[3] needs 12 bytes"),
        ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}, b"\0" * 8, "leaves a 4-byte hole"),
        (
            {
                "a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]},
            },
            b"\0" * 6,
            "overlaps the previous tensor",
        ),
        ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [4, 0]}}, b"", "are not [begin, end]"),
        ([1, 2], b"", "not a JSON object"),
    ],
)
def test_hostile_headers(tmp_path: Path, header, data: bytes, problem: str) -> None:
    with pytest.raises(ShardError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        read_header(_raw_shard(tmp_path / "x.safetensors", header, data))


def test_absurd_header_length_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(ShardError, match="exceeds the 100000000-byte cap"):
        read_header(path)
    path.write_bytes(struct.pack("<Q", 5000) + b"{}")
    with pytest.raises(ShardError, match="runs past the end"):
        read_header(path)


def test_index_total_size_that_disagrees_with_the_headers_warns(checkpoint: Path) -> None:
    index_path = checkpoint / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["metadata"]["total_size"] += 1
    index_path.write_text(json.dumps(index))
    tensors = by_name(check_model(checkpoint)[0])["model.tensors"]
    assert (
        tensors.status is Status.WARN and tensors.evidence["index_total_size"] == tensors.evidence["weight_bytes"] + 1
    )
