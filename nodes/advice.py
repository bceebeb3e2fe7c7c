"""Gather the advisor's facts on a node and compute its advice: the node from a preflight report (recorded,
or run here through NVML), the model from its headers and config.json, the image from its files.

The `advise`, `smoke --advise` and `provision` tasks all come through `compute_advice`, so a fleet's
pods each derive their own advice from their own node.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bwstack.advise import Advice, AdviseError, Facts, ImageFacts, ModelFacts, NodeFacts, advice_report, advise
from bwstack.advise.image import IMAGE_FILES, image_facts
from bwstack.inputs import check_model_folder
from bwstack.nodes.preflight import check_model, request_for_recipe, run_preflight
from bwstack.recipes.archs import parse_arch
from bwstack.recipes.recipe import Recipe, load_recipe
from bwstack.report import Report
from bwstack.verify import sources


@dataclass(frozen=True)
class AdviceRequest:
    recipe: str = "sglang"
    image: str | None = None
    path: Path | None = None
    arch: str | None = None
    preflight: dict[str, Any] | None = None  # a recorded `invoke preflight --json` report
    model: Path | None = None
    host: str = "127.0.0.1"
    port: int | None = None

    def __post_init__(self) -> None:
        if self.image and self.path:
            raise AdviseError("give one of --image REF or --path DIR, not both")
        if self.arch and self.preflight is not None:
            raise AdviseError("give one of --arch or --preflight FILE: the report names the node's GPUs")
        if self.model is not None:
            check_model_folder(self.model, error=AdviseError)


def node_facts(request: AdviceRequest, recipe: Recipe, *, nvml: Any = None) -> tuple[NodeFacts, dict[str, Any]]:
    """From the recorded report, from --arch alone, or from a preflight run here (NVML)."""
    if request.preflight is not None:
        return NodeFacts.from_preflight(request.preflight, source="--preflight"), request.preflight
    if request.arch:
        return NodeFacts(cc=parse_arch(request.arch).cc, source="--arch"), {}
    report = run_preflight(request_for_recipe(recipe.name, docker=False), nvml=nvml).to_dict()
    facts = NodeFacts.from_preflight(report, source="this node (NVML)")
    if facts.cc is None:
        raise AdviseError(
            "no GPU compute capability on this node (NVML unavailable or a mixed node)",
            remedy="pass --arch sm120 or --preflight FILE from the serving node",
        )
    return facts, report


def model_facts(model: Path | None, tp: int, preflight: dict[str, Any]) -> ModelFacts:
    """From the model folder's headers and config.json, else the preflight report's model summary."""
    if model is None:
        summary = preflight.get("model")
        return ModelFacts.from_summary(summary) if isinstance(summary, dict) else ModelFacts()
    _checks, summary = check_model(model, tp=tp)
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        config = None  # the model check already names what is wrong with it
    return ModelFacts.from_summary(summary.to_dict(), config if isinstance(config, dict) else None)


def read_image_facts(request: AdviceRequest, recipe: Recipe, node: NodeFacts, *, client: Any = None) -> ImageFacts:
    if not request.image and not request.path:
        return ImageFacts(evidence={"note": "no --image or --path: image facts unknown"})
    import_name = recipe.sgl_kernel.import_name if recipe.sgl_kernel else "sgl_kernel"
    if request.image:
        opened = sources.open_image(request.image, import_name=import_name, client=client, also=IMAGE_FILES)
    else:
        assert request.path is not None
        opened = sources.open_path(request.path)
    with opened as tree:
        return image_facts(tree, node.cc)


def speculative_table(recipe: Recipe) -> dict[str, Any] | None:
    """The recipe's [speculative] table as a mapping, {} when it has none, None when recipes cannot say."""
    if not hasattr(recipe, "speculative"):
        return None
    spec = recipe.speculative
    if spec is None:
        return {}
    return dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else dict(spec)


def compute_advice(request: AdviceRequest, *, nvml: Any = None, client: Any = None) -> tuple[Advice, Report, list[str]]:
    """The advice, its report, and the recipe's base command it extends."""
    recipe = load_recipe(request.recipe)
    node, preflight = node_facts(request, recipe, nvml=nvml)
    image = read_image_facts(request, recipe, node, client=client)
    return advice_from(recipe, node, preflight, request.model, image, host=request.host, port=request.port)


def advice_from(
    recipe: Recipe,
    node: NodeFacts,
    preflight: dict[str, Any],
    model_dir: Path | None,
    image: ImageFacts,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> tuple[Advice, Report, list[str]]:
    """Advice from facts already gathered (provision has its preflight report and verify's image tree)."""
    model = model_facts(model_dir, recipe.serve.tp, preflight)
    facts = Facts(node, model, image, tp=recipe.serve.tp, speculative=speculative_table(recipe))
    advice = advise(recipe, facts)
    model_path = str(model_dir) if model_dir else (model.path or f"/models/{recipe.serve.model}")
    base = recipe.serve_command(model_path, host=host, port=port or recipe.serve.port)
    subject = f"recipe {recipe.name} (SGLang {advice.sglang_version}) on {node.source}"
    report = advice_report(advice, base, subject)
    report.data["image_evidence"] = image.evidence
    return advice, report, base
