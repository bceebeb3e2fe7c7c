"""provision: bring a node from bare to "serves this model": preflight -> verify -> advise -> smoke, one report.

Each stage is the same library call its own task makes. The verify stage checks the image against the
compute capabilities NVML reports on this node (not just the recipe's arch), because the node is
where the binary will run. The advise stage derives the launch's flags and environment from this node's
preflight, the model and the image's files (read in the verify stage), and smoke launches with them.
Provision stops at the first failed stage; the stages it did not run are in the report as skipped, with
the reason.

`--demo` runs the same flow on the demo stack with nothing but Docker: the demo image (built and
verify-gated first if it is not there), the tiny Kimi-shaped checkpoint in images/demo/model, GPU checks
skipped (there is no GPU to ask), and verify against the demo recipe's arch instead of the node's GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bwstack.advise import ImageFacts, NodeFacts, load_advice
from bwstack.advise.image import IMAGE_FILES, image_facts
from bwstack.errors import BwstackError
from bwstack.images.render import IMAGES_DIR
from bwstack.inputs import check_model_folder, check_port, check_seconds
from bwstack.nodes.advice import advice_from
from bwstack.nodes.preflight import PreflightRequest, node_ccs, request_for_recipe, run_preflight
from bwstack.recipes.archs import Arch, arch_for_cc, cc_text, parse_arch
from bwstack.recipes.recipe import Recipe, load_recipe
from bwstack.report import Check, Report, Status
from bwstack.smoke import SmokeRequest, run_smoke
from bwstack.verify import sources
from bwstack.verify.verify import verify_tree

DEMO_RECIPE = "demo"
DEMO_ARCH = "sm120"
DEMO_MODEL = IMAGES_DIR / "demo" / "model"  # package data of the images stage
STAGES = ("build", "preflight", "verify", "advise", "smoke")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ProvisionRequest:
    image: str | None
    model: Path | None
    recipe: str = "sglang"
    demo: bool = False
    port: int | None = None
    startup_timeout_s: float = 1800.0
    stall_timeout_s: float = 120.0
    repo: str = "bwstack"
    smoke_log: Path | None = None  # the smoke stage's server log; None: a new bwstack-smoke-* folder, kept
    advice: Path | None = None  # an `invoke advise --json` file to launch with instead of advising here

    def __post_init__(self) -> None:
        # Checked before the first stage, not when smoke finally needs them after a build and a verify.
        check_port("--port", self.port)
        check_seconds("--startup-timeout", self.startup_timeout_s)
        check_seconds("--stall-timeout", self.stall_timeout_s)
        if self.model is not None and not self.demo:
            check_model_folder(self.model)

    @classmethod
    def for_demo(cls, *, port: int | None = None, repo: str = "bwstack") -> ProvisionRequest:
        return cls(None, DEMO_MODEL, DEMO_RECIPE, True, port, startup_timeout_s=60.0, stall_timeout_s=20.0, repo=repo)


@dataclass
class _Run:
    report: Report
    progress: Progress
    stopped_at: str | None = None

    def stage(self, name: str, result: Report | None, *, error: BwstackError | None = None, note: str = "") -> bool:
        """Fold one stage's report into the provision report; False if provisioning must stop here."""
        stages = self.report.data.setdefault("stages", {})
        if error is not None:
            stages[name] = {"ok": False, "error": error.one_line()}
            self.report.add(Check(name, Status.FAIL, f"{name} could not run: {error.message}", {}, error.remedy, True))
        else:
            assert result is not None
            stages[name] = result.to_dict()
            for check in result.checks:
                self.report.add(
                    Check(
                        f"{name}: {check.name}",
                        check.status,
                        check.finding,
                        check.evidence,
                        check.remedy,
                        check.infrastructure,
                    )
                )
            failures = result.failures()
            summary = f"{name} passed" + (f" ({note})" if note else "")
            if failures:
                summary = f"{name} failed: {failures[0].finding}"
            self.report.add(
                Check(
                    name,
                    Status.FAIL if failures else Status.PASS,
                    summary,
                    {},
                    failures[0].remedy if failures else None,
                    any(f.infrastructure for f in failures),
                )
            )
        ok = error is None and result is not None and result.ok
        self.progress(f"provision: {name} {'passed' if ok else 'FAILED'}")
        if not ok:
            self.stopped_at = name
        return ok

    def attempt(self, name: str, action: Callable[[], Report], *, note: str = "") -> Report | None:
        """Run one stage and fold it in; its report if it passed, None if provisioning stops here."""
        try:
            result = action()
        except BwstackError as error:
            self.stage(name, None, error=error)
            return None
        return result if self.stage(name, result, note=note) else None

    def skip_rest(self, after: str) -> None:
        for name in STAGES[STAGES.index(after) + 1 :]:
            if name in self.report.data.get("stages", {}) or (name == "build" and not self.report.data["demo"]):
                continue
            self.report.data["stages"][name] = {"ok": None, "skipped": f"not run: {after} failed"}
            self.report.add(Check(name, Status.SKIP, f"not run: {after} failed"))


def run_provision(
    request: ProvisionRequest,
    *,
    nvml: Any | None = None,
    progress: Progress | None = None,
    docker_client: Any | None = None,
    preflight_options: dict[str, Any] | None = None,
) -> Report:
    """Run the stages in order and stop at the first that fails. `nvml` and `preflight_options`
    (host_paths, docker_info, thresholds) are the hardware seams run_preflight takes."""
    say = progress or (lambda _line: None)
    recipe = load_recipe(request.recipe)
    image = request.image
    report = Report(kind="provision", subject=f"{recipe.name} on this node" + (" (demo)" if request.demo else ""))
    report.data = {"recipe": recipe.name, "demo": request.demo, "image": image, "stages": {}}
    run = _Run(report, say)

    if request.demo:
        say("provision: build (the demo image, verify-gated)")
        built = run.attempt("build", lambda: _build_demo(request, docker_client))
        if built is None:
            return _finish(run)
        image = built.data["images"][0]["tags"][0]
        report.data["image"] = image
    if image is None:
        raise BwstackError("provision needs --image REF (or --demo)")
    model = request.model.resolve() if request.model else None

    say("provision: preflight (node, host, model)")
    preflight = run.attempt(
        "preflight",
        lambda: run_preflight(_preflight_request(request, recipe.name, model), nvml=nvml, **(preflight_options or {})),
    )
    if preflight is None:
        return _finish(run)

    archs, unknown = _node_archs(preflight, request.demo)
    names = ", ".join(a.name for a in archs)
    report.data["verified_for"] = [a.name for a in archs]
    say(f"provision: verify {image} for {names or 'no GPU'}")
    import_name = recipe.sgl_kernel.import_name if recipe.sgl_kernel else "sgl_kernel"
    read: dict[str, ImageFacts] = {}  # the image's facts for advise, read from verify's tree

    def verify_stage() -> Report:
        if not archs:
            raise BwstackError(
                f"no GPU compute capability to verify for ({', '.join(unknown) or 'NVML found no GPUs'})"
            )
        with sources.open_image(image, import_name=import_name, client=docker_client, also=IMAGE_FILES) as tree:
            verdict = verify_tree(tree, archs, import_name=import_name)
            read["image"] = image_facts(tree, archs[0].cc if len(archs) == 1 else None)
        for cc in unknown:
            verdict.add(
                Check(
                    f"gpu {cc}",
                    Status.FAIL,
                    f"GPU of CC {cc} is not in bwstack's arch table",
                    remedy="add it to recipes/archs.py",
                )
            )
        return verdict

    note = f"{names}: the demo's arch, no GPU asked" if request.demo else f"{names}: the GPUs on this node"
    if run.attempt("verify", verify_stage, note=note) is None:
        return _finish(run)

    say("provision: advise (flags and environment for this node, model and image)")
    advised = run.attempt("advise", lambda: _advise(request, recipe, preflight, model, read.get("image")))
    if advised is None:
        return _finish(run)
    launch = advised.data["advice"]

    say("provision: smoke (start the server with the model, probe it)")

    def smoke_stage() -> Report:
        smoke_request = SmokeRequest(  # built inside the stage: its own checks are this stage's errors
            image=image,
            model=model,
            recipe=recipe.name,
            port=request.port,
            startup_timeout_s=request.startup_timeout_s,
            stall_timeout_s=request.stall_timeout_s,
            gpus="none" if request.demo else "auto",
            log_path=request.smoke_log,
            advice_args=tuple(launch["args"]),
            advised=True,
            env=dict(launch["env"]),
        )
        return run_smoke(smoke_request, progress=say)

    run.attempt("smoke", smoke_stage)
    return _finish(run)


def _advise(
    request: ProvisionRequest, recipe: Recipe, preflight: Report, model: Path | None, image: ImageFacts | None
) -> Report:
    """The advice for this node from its own preflight (the demo: its arch, no GPU asked), or --advice FILE."""
    if request.advice is not None:
        given = load_advice(request.advice)
        report = Report(kind="advise", subject=str(request.advice), data={"advice": given})
        sets = " ".join([f"{k}={v}" for k, v in given["env"].items()] + given["args"])
        report.add(Check("advice", Status.PASS, f"from {request.advice}: {sets or 'nothing to set'}"))
        return report
    if request.demo:
        node, facts = NodeFacts(cc=parse_arch(DEMO_ARCH).cc, source="the demo's arch (no GPU asked)"), {}
    else:
        facts = preflight.to_dict()
        node = NodeFacts.from_preflight(facts, source="this node's preflight")
    _advice, report, _base = advice_from(recipe, node, facts, model, image or ImageFacts(), port=request.port)
    return report


def _preflight_request(request: ProvisionRequest, recipe: str, model: Path | None) -> PreflightRequest:
    if request.demo:
        return dataclasses.replace(request_for_recipe(recipe, archs=[DEMO_ARCH], model=model, tp=1), gpus=False)
    return request_for_recipe(recipe, model=model)


def _node_archs(preflight: Report, demo: bool) -> tuple[list[Arch], list[str]]:
    """The distinct archs of the GPUs NVML reported (the demo: its arch), and the CCs the table lacks."""
    if demo:
        return [parse_arch(DEMO_ARCH)], []
    archs: dict[str, Arch] = {}
    unknown: list[str] = []
    for cc in sorted(set(node_ccs(preflight))):
        arch = arch_for_cc(cc)
        if arch is None:
            unknown.append(cc_text(cc))
        else:
            archs[arch.name] = arch
    return list(archs.values()), unknown


def _build_demo(request: ProvisionRequest, client: Any | None) -> Report:
    from bwstack.images.build import build_images

    return build_images(DEMO_RECIPE, [DEMO_ARCH], repo=request.repo, client=client)


def _finish(run: _Run) -> Report:
    if run.stopped_at:
        run.skip_rest(run.stopped_at)
    run.report.data["stopped_at"] = run.stopped_at
    return run.report
