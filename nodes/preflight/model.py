"""Model folder check: config, safetensors index and shard headers, and whether the weights fit the GPUs.

Headers only: no tensor is loaded and nothing is written. A Hugging Face checkpoint folder holds
config.json, model.safetensors.index.json ({"weight_map": {tensor: shard file}}) and the shards, or a
single model.safetensors. Multimodal configs (Kimi-K2.5: KimiK25ForConditionalGeneration) nest the
language model's config, and its quantization_config, under "text_config".
"""

from __future__ import annotations

import json
import stat
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bwstack.errors import PreflightError
from bwstack.inputs import check_model_folder
from bwstack.nodes.preflight.safetensors_header import (
    ShardError,
    ShardHeader,
    excerpt,
    is_text,
    json_kind,
    read_header,
)
from bwstack.report import Check, Status

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# The fit assumption: weights split evenly over the TP ranks may take at most this share of each GPU,
# leaving the rest for the KV cache, activations and CUDA graphs. (SGLang's --mem-fraction-static, ~0.8-0.9,
# covers weights plus the KV pool; a model that leaves under 20% has almost no room for context.)
DEFAULT_KV_HEADROOM = 0.20

_SHOWN = 5  # names listed in a finding before "and N more"


@dataclass
class ModelSummary:
    """What the model check learned; it becomes report.data["model"]."""

    path: Path
    architecture: str | None = None
    model_type: str | None = None
    quantization: dict[str, Any] | None = None
    shards: list[str] = field(default_factory=list)
    tensors: int = 0
    weight_bytes: int = 0
    tp: int = 1
    bytes_per_gpu: int = 0
    kv_headroom: float = DEFAULT_KV_HEADROOM
    gpu_memory_bytes: int | None = None
    fits: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "model_type": self.model_type,
            "quantization": self.quantization,
            "shards": len(self.shards),
            "tensors": self.tensors,
            "weight_bytes": self.weight_bytes,
            "tp": self.tp,
            "bytes_per_gpu": self.bytes_per_gpu,
            "kv_headroom": self.kv_headroom,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "fits": self.fits,
        }


def _more(items: list[str]) -> str:
    return f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""


def _names(items: list[str]) -> str:
    return ", ".join(items[:_SHOWN]) + _more(items)


def _shard_name_problem(name: Any) -> str | None:
    """Why an index's file name cannot be a shard of this folder, or None: it must stay inside the folder."""
    if not is_text(name):
        return f"names a shard by {json_kind(name)}, expected a file name"
    parts = name.replace("\\", "/").split("/")
    if not name or "\0" in name or name.startswith("/") or ".." in parts:
        return f"names the shard {excerpt(name)}, which is not a file inside the model folder"
    return None


def _gb(n: int) -> str:
    """Bytes in decimal units, as model cards and nvidia-smi's GB speak."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


_WEIGHT_KEYS = ("num_bits", "type", "strategy", "group_size", "symmetric")
_SCALARS = (str, int, float, bool, type(None))


def _field_problem(value: Any, where: str, expected: str) -> str | None:
    """A problem line when a config field holds something other than `expected` (null always allowed)."""
    ok = {
        "a string": is_text(value),
        "an object": isinstance(value, dict),
        "an array of strings": isinstance(value, list) and all(is_text(v) for v in value),
        "a string, number or boolean": (is_text(value) or isinstance(value, _SCALARS)),
    }[expected]
    return None if value is None or ok else f"{where} is {json_kind(value)}, expected {expected}"


def config_problems(config: dict[str, Any]) -> list[str]:
    """Every field bwstack reads from config.json that has the wrong type, by its path in the file."""
    problems = [
        _field_problem(config.get("architectures"), "architectures", "an array of strings"),
        _field_problem(config.get("model_type"), "model_type", "a string"),
        _field_problem(config.get("text_config"), "text_config", "an object"),
    ]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for where, raw in (
        ("quantization_config", config.get("quantization_config")),
        ("text_config.quantization_config", text.get("quantization_config")),
    ):
        problems.append(_field_problem(raw, where, "an object"))
        if not isinstance(raw, dict):
            continue
        problems += [_field_problem(raw.get(k), f"{where}.{k}", "a string") for k in ("quant_method", "format")]
        groups = raw.get("config_groups")
        problems.append(_field_problem(groups, f"{where}.config_groups", "an object"))
        for name, group in groups.items() if isinstance(groups, dict) else ():
            here = f"{where}.config_groups.{name if name.isprintable() and len(name) <= 60 else excerpt(name)}"
            problems.append(_field_problem(group, here, "an object"))
            weights = group.get("weights") if isinstance(group, dict) else None
            problems.append(_field_problem(weights, f"{here}.weights", "an object"))
            for key in _WEIGHT_KEYS if isinstance(weights, dict) else ():
                problems.append(
                    _field_problem(weights.get(key), f"{here}.weights.{key}", "a string, number or boolean")
                )
    return [p for p in problems if p]


def summarize_quantization(config: dict[str, Any]) -> dict[str, Any] | None:
    """quantization_config at the top level or under text_config, reduced to what the loader keys on."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    raw = config.get("quantization_config") or text.get("quantization_config")
    if not isinstance(raw, dict):
        return None
    weights = []
    groups = raw.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        w = group.get("weights") if isinstance(group, dict) else None
        if isinstance(w, dict):
            weights.append({k: w.get(k) for k in _WEIGHT_KEYS})
    return {
        "quant_method": raw.get("quant_method"),
        "format": raw.get("format"),
        "weights": weights,
        "where": "quantization_config" if config.get("quantization_config") else "text_config.quantization_config",
    }


def _describe_quant(quant: dict[str, Any] | None) -> str:
    if quant is None:
        return "not quantized (no quantization_config)"
    text = " ".join(str(quant[k]) for k in ("quant_method", "format") if quant.get(k))
    for w in quant["weights"][:1]:
        kind = "INT" if w.get("type") == "int" else str(w.get("type") or "").upper()
        text += f" {kind}{w.get('num_bits')}" + (f" (group {w['group_size']})" if w.get("group_size") else "")
    return text


_METADATA_LIMIT = 64 << 20  # config.json and the index are kilobytes; a larger file is not one of them


def _read_metadata(path: Path) -> str:
    """A small JSON file's text. A FIFO or device would block a plain read forever, so only a regular file
    is opened; FileNotFoundError passes through for the caller's "missing" finding."""
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{path.name} is not a regular file")
    if info.st_size > _METADATA_LIMIT:
        raise ValueError(f"{path.name} is {info.st_size} bytes, more than any checkpoint metadata")
    return path.read_text(encoding="utf-8")


def check_config(model_dir: Path, summary: ModelSummary) -> Check:
    path = model_dir / "config.json"
    try:
        config = json.loads(_read_metadata(path))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return Check(
            "model.config", Status.FAIL, f"{path} is missing", {"path": str(path)}, "copy the model's config.json"
        )
    except (OSError, ValueError) as error:
        return Check(
            "model.config", Status.FAIL, f"{path} does not parse: {' '.join(str(error).split())}", {"path": str(path)}
        )
    except RecursionError:
        return Check(
            "model.config",
            Status.FAIL,
            f"{path} does not parse: nested deeper than the JSON parser allows",
            {"path": str(path)},
        )
    problems = config_problems(config)
    if problems:
        return Check(
            "model.config",
            Status.FAIL,
            f"{path} is malformed: " + "; ".join(problems[:_SHOWN]) + _more(problems),
            {"path": str(path), "problems": problems},
            remedy="re-download config.json from the model's repository; loaders read these fields too",
        )
    architectures = config.get("architectures") or []
    summary.architecture = architectures[0] if architectures else None
    summary.model_type = config.get("model_type")
    summary.quantization = summarize_quantization(config)
    evidence = {
        "architectures": architectures,
        "model_type": summary.model_type,
        "text_config": isinstance(config.get("text_config"), dict),
        "quantization": summary.quantization,
    }
    if not summary.architecture:
        return Check("model.config", Status.WARN, "config.json names no architecture", evidence)
    finding = f"{summary.architecture} ({summary.model_type}), {_describe_quant(summary.quantization)}"
    return Check("model.config", Status.PASS, finding, evidence)


def _read_index(model_dir: Path) -> tuple[dict[str, str] | None, dict[str, Any], Check | None]:
    """The index's weight_map (None for a single-file checkpoint) and metadata, or a failed check."""
    index_path = model_dir / INDEX_FILE
    if not index_path.exists():
        if (model_dir / SINGLE_FILE).exists():
            return None, {}, None
        return (
            None,
            {},
            Check(
                "model.index",
                Status.FAIL,
                f"no {INDEX_FILE} and no {SINGLE_FILE} in {model_dir}",
                {"path": str(model_dir)},
                remedy="point --model at the checkpoint folder (the one with config.json and the shards)",
            ),
        )
    try:
        index = json.loads(_read_metadata(index_path))
    except (OSError, ValueError) as error:
        problem = f"does not parse: {' '.join(str(error).split())}"
    except RecursionError:
        problem = "does not parse: nested deeper than the JSON parser allows"
    else:
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(index, dict):
            problem = f"is {json_kind(index)}, not a JSON object"
        elif not isinstance(weight_map, dict):
            problem = f"has weight_map {json_kind(weight_map)}, expected an object of tensor -> file"
        else:
            bad_names = [t for t in weight_map if not is_text(t)]
            shard_problems = [p for p in map(_shard_name_problem, weight_map.values()) if p]
            if bad_names:
                problem = f"names a tensor {excerpt(bad_names[0])} that is not valid UTF-8 text"
            elif shard_problems:
                problem = f"{shard_problems[0]} ({len(shard_problems)} such entries)"
            else:
                metadata = index.get("metadata") if isinstance(index.get("metadata"), dict) else {}
                return weight_map, metadata, None
    return (
        None,
        {},
        Check(
            "model.index",
            Status.FAIL,
            f"{index_path} {problem}",
            {"path": str(index_path)},
            remedy="re-download the index (model.safetensors.index.json) from the model's repository",
        ),
    )


def check_model(
    model_dir: Path, *, tp: int = 1, gpu_memory_bytes: int | None = None, kv_headroom: float = DEFAULT_KV_HEADROOM
) -> tuple[list[Check], ModelSummary]:
    """Check a checkpoint folder by its headers. `gpu_memory_bytes` is the smallest GPU's memory (None: unknown)."""
    check_model_folder(model_dir, error=PreflightError)
    if not 0 <= kv_headroom < 1:
        raise PreflightError(f"KV-cache headroom {kv_headroom} must be a fraction in [0, 1)")
    summary = ModelSummary(path=model_dir, tp=tp, kv_headroom=kv_headroom, gpu_memory_bytes=gpu_memory_bytes)
    checks = [check_config(model_dir, summary)]
    weight_map, index_meta, failed = _read_index(model_dir)
    if failed:
        return [*checks, failed], summary

    shard_names = sorted(set(weight_map.values())) if weight_map is not None else [SINGLE_FILE]
    summary.shards = shard_names
    missing = [name for name in shard_names if not (model_dir / name).is_file()]
    checks.append(_check_shard_files(model_dir, shard_names, missing, indexed=weight_map is not None))
    headers, bad = _read_headers(model_dir, [name for name in shard_names if name not in missing])
    if bad or headers:
        checks.append(_check_headers(headers, bad))
    complete = not (missing or bad)
    checks.append(_check_tensors(weight_map, headers, index_meta, summary, complete=complete))
    checks.append(_check_fit(summary, complete=complete))
    return checks, summary


def _check_shard_files(model_dir: Path, shard_names: list[str], missing: list[str], *, indexed: bool) -> Check:
    """Every shard the index names is there; a .safetensors file it does not name is only a warning."""
    stray = sorted({p.name for p in model_dir.glob("*.safetensors")} - set(shard_names))
    evidence = {"index": INDEX_FILE if indexed else None, "shards": len(shard_names)}
    if missing:
        return Check(
            "model.index",
            Status.FAIL,
            f"{len(missing)} of {len(shard_names)} shards the index names are missing: {_names(missing)}",
            evidence | {"missing": missing},
            remedy="re-download the missing files (huggingface-cli download resumes)",
        )
    if stray:
        return Check(
            "model.index",
            Status.WARN,
            f"{len(stray)} .safetensors file(s) the index does not name (loaders ignore them): {_names(stray)}",
            evidence | {"unindexed_files": stray},
        )
    return Check("model.index", Status.PASS, f"all {len(shard_names)} shard(s) present", evidence)


def _read_headers(model_dir: Path, names: list[str]) -> tuple[dict[str, ShardHeader], dict[str, str]]:
    """Each shard's header, and why each unreadable one could not be read."""
    headers: dict[str, ShardHeader] = {}
    bad: dict[str, str] = {}
    for name in names:
        try:
            headers[name] = read_header(model_dir / name)
        except ShardError as error:
            bad[name] = error.problem
    return headers, bad


def _check_headers(headers: dict[str, ShardHeader], bad: dict[str, str]) -> Check:
    if not bad:
        return Check(
            "model.shards",
            Status.PASS,
            f"{len(headers)} shard header(s) read, sizes match their headers",
            {"read": len(headers)},
        )
    detail = "; ".join(f"{name}: {problem}" for name, problem in list(bad.items())[:_SHOWN])
    return Check(
        "model.shards",
        Status.FAIL,
        f"{len(bad)} shard(s) unreadable or wrong size: {detail}",
        {"bad": bad, "read": len(headers)},
        remedy="re-download the named files; a size mismatch is usually an interrupted copy",
    )


def _check_tensors(
    weight_map: dict[str, str] | None,
    headers: dict[str, ShardHeader],
    index_meta: dict[str, Any],
    summary: ModelSummary,
    *,
    complete: bool,
) -> Check:
    where: dict[str, list[str]] = defaultdict(list)
    for name, header in headers.items():
        for tensor in header.tensors:
            where[tensor].append(name)
    summary.tensors = len(where)
    summary.weight_bytes = sum(t.nbytes for h in headers.values() for t in h.tensors.values())
    twice = sorted(t for t, files in where.items() if len(files) > 1)
    problems: list[str] = []
    evidence: dict[str, Any] = {"tensors": len(where), "weight_bytes": summary.weight_bytes}
    if twice:
        problems.append(
            f"{len(twice)} tensor(s) in more than one shard: " + _names([f"{t} ({', '.join(where[t])})" for t in twice])
        )
        evidence["in_several_shards"] = {t: where[t] for t in twice}
    if weight_map is not None:
        absent = sorted(t for t, f in weight_map.items() if f in headers and f not in where.get(t, []))
        unindexed = sorted(t for t in where if t not in weight_map)
        if absent:
            problems.append(
                f"{len(absent)} tensor(s) the index places in a shard that lacks them: "
                + _names([f"{t} ({weight_map[t]})" for t in absent])
            )
            evidence["missing_from_shard"] = {t: weight_map[t] for t in absent}
        if unindexed:
            problems.append(f"{len(unindexed)} tensor(s) missing from the index: {_names(unindexed)}")
            evidence["missing_from_index"] = unindexed
    quant = summary.quantization or {}
    if quant.get("format") == "pack-quantized" and where and not any(t.endswith(".weight_packed") for t in where):
        problems.append("config says pack-quantized but no shard holds a *.weight_packed tensor")
    if problems:
        return Check(
            "model.tensors",
            Status.FAIL,
            "; ".join(problems),
            evidence,
            remedy="the checkpoint is inconsistent: re-download it, or regenerate the index from the shards",
        )
    finding = f"{len(where)} tensors, {_gb(summary.weight_bytes)} of weights, each named once"
    total = index_meta.get("total_size")
    if isinstance(total, int) and complete and total != summary.weight_bytes:
        evidence["index_total_size"] = total
        return Check("model.tensors", Status.WARN, finding + f"; the index's total_size says {total} bytes", evidence)
    return Check("model.tensors", Status.PASS, finding, evidence)


def _check_fit(summary: ModelSummary, *, complete: bool) -> Check:
    tp = max(summary.tp, 1)
    summary.bytes_per_gpu = -(-summary.weight_bytes // tp)
    assumption = (
        f"assumes weights split evenly over tp {tp} and {summary.kv_headroom:.0%} of each GPU kept for "
        "KV cache, activations and CUDA graphs"
    )
    evidence = {
        "weight_bytes": summary.weight_bytes,
        "tp": tp,
        "bytes_per_gpu": summary.bytes_per_gpu,
        "gpu_memory_bytes": summary.gpu_memory_bytes,
        "kv_headroom": summary.kv_headroom,
        "assumption": assumption,
        "complete": complete,
    }
    per_gpu = f"{_gb(summary.weight_bytes)} of weights, {_gb(summary.bytes_per_gpu)} per GPU at tp {tp}"
    if summary.gpu_memory_bytes is None:
        return Check("model.fit", Status.SKIP, per_gpu + "; GPU memory unknown (no NVML)", evidence)
    budget = int(summary.gpu_memory_bytes * (1 - summary.kv_headroom))
    evidence["weight_budget_bytes"] = budget
    summary.fits = summary.bytes_per_gpu <= budget
    share = summary.bytes_per_gpu / summary.gpu_memory_bytes
    finding = f"{per_gpu} = {share:.0%} of a {_gb(summary.gpu_memory_bytes)} GPU ({assumption})"
    if not summary.fits:
        return Check(
            "model.fit",
            Status.FAIL,
            finding,
            evidence,
            remedy=f"raise tp, use GPUs with more memory, or a smaller quantization; weights may use "
            f"{_gb(budget)} per GPU",
        )
    return Check(
        "model.fit",
        Status.PASS if complete else Status.WARN,
        finding + ("" if complete else "; counted over readable shards only"),
        evidence,
    )
