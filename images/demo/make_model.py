"""Write the demo model: a tiny checkpoint shaped like Kimi-K2.5 INT4 (compressed-tensors, pack-quantized).

    python images/demo/make_model.py [OUT]   # default: images/demo/model (committed; ~3 KB)

`provision --demo` runs preflight's model check on it and mounts it into the demo server, so a newcomer
sees the model stage pass without downloading a terabyte. The safetensors files are written by hand
(8-byte little-endian header length, JSON header, raw bytes) so the script needs nothing installed.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUANTIZATION = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32},
        }
    },
}
CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "n_routed_experts": 2,
        "quantization_config": QUANTIZATION,
    },
}
# tensor name -> (dtype, shape, bytes per element)
SHARDS = {
    "model-00001-of-00002.safetensors": {
        "language_model.model.embed_tokens.weight": ("F16", [32, 16], 2),
        "language_model.model.layers.0.mlp.experts.0.down_proj.weight_packed": ("I32", [16, 2], 4),
        "language_model.model.layers.0.mlp.experts.0.down_proj.weight_scale": ("F16", [16, 1], 2),
    },
    "model-00002-of-00002.safetensors": {
        "language_model.model.layers.0.mlp.experts.1.down_proj.weight_packed": ("I32", [16, 2], 4),
        "language_model.model.layers.0.mlp.experts.1.down_proj.weight_scale": ("F16", [16, 1], 2),
        "language_model.lm_head.weight": ("F16", [32, 16], 2),
    },
}


def write_shard(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> int:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, width) in tensors.items():
        size = width
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(offset))
    return offset


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    weight_map, total = {}, 0
    for file, tensors in SHARDS.items():
        total += write_shard(out / file, tensors)
        weight_map |= {name: file for name in tensors}
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "model")
