"""build: render, build through the Docker SDK (classic builder), verify the image, and only then tag it.

The image is built untagged. It gets its final tags (a content tag and a moving one) only after
verify finds that the binary the package's loader picks runs on the target arch; a failing image is
removed, so nothing half-built or unverified is ever left tagged. Intermediate containers are
removed whatever happens (forcerm).
"""

from __future__ import annotations

import io
import re
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests.exceptions
from rich.console import Console

from bwstack.docker_engine import connect as connect_engine
from bwstack.docker_engine import first_line
from bwstack.errors import DockerError, LoaderProbeError, SourceError
from bwstack.images.build_errors import classify_failure
from bwstack.images.build_log import StepLog
from bwstack.images.render import IMAGES_DIR, ImageTag, RenderedImage
from bwstack.images.sizing import decide_build_args
from bwstack.recipes.archs import Arch
from bwstack.report import Check, Report, Status
from bwstack.verify import sources
from bwstack.verify.verify import verify_tree

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # RUN output may carry colour codes; logs and findings do not


class Progress:
    """Live progress for people on a tty; plain lines for CI logs (no control codes when not a tty)."""

    def __init__(self, console: Console, *, verbose: bool = False) -> None:
        self.console = console
        self.verbose = verbose
        self.started = time.monotonic()
        self._status: Any = None

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            self._status = self.console.status("starting build")
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def _say(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        line = f"[{elapsed:6.1f}s] {text}"
        if self._status is not None:
            self._status.update(line)
        else:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def step(self, log: StepLog) -> None:
        self._say(f"step {log.current}/{log.total}: {log.instruction[:100]}")

    def cached(self, log: StepLog) -> None:
        if self._status is None:
            self._say(f"step {log.current}/{log.total}: cache hit")

    def output(self, line: str) -> None:
        if self.verbose:
            self.console.print(f"    {line}", markup=False, highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        if self._status is not None:
            self.console.print(text, markup=False, highlight=False)
        self._say(text)


def connect(client: Any | None = None) -> Any:
    """A live Docker client for a build (long timeout: big layers commit slowly)."""
    return connect_engine(client, timeout=600)


def build_context(rendered: RenderedImage) -> io.BytesIO:
    """A minimal, reproducible tar context: the Dockerfile plus the files the recipe names, nothing else.

    Fixed mtimes, owners and order, so the same inputs give the same context and the builder's cache
    keys for COPY stay stable across clones.
    """
    buffer = io.BytesIO()

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if "__pycache__" in Path(info.name).parts:
            return None
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = rendered.dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(data), 0o644
        tar.addfile(normalise(info), io.BytesIO(data))
        for name, source in sorted(rendered.context_files.items()):
            path = Path(source) if Path(source).is_absolute() else IMAGES_DIR / source
            _add_sorted(tar, path, name, normalise)
    buffer.seek(0)
    return buffer


def _add_sorted(tar: tarfile.TarFile, path: Path, arcname: str, normalise: Any) -> None:
    tar.add(path, arcname=arcname, recursive=False, filter=normalise)
    if path.is_dir():
        for child in sorted(path.iterdir()):
            _add_sorted(tar, child, f"{arcname}/{child.name}", normalise)


def stream_build(client: Any, rendered: RenderedImage, build_args: dict[str, str], progress: Progress) -> StepLog:
    """Run the build and follow its stream; raise BuildFailed with the step log on an error event."""
    log = StepLog()
    try:
        events: Iterator[dict[str, Any]] = client.api.build(
            fileobj=build_context(rendered),
            custom_context=True,
            buildargs=build_args,
            rm=True,
            forcerm=True,  # remove intermediate containers even when a step fails
            decode=True,
            pull=False,
        )
        for event in events:
            _follow(event, log, progress)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        if isinstance(error, BuildFailed):
            raise
        raise DockerError(f"Docker build request failed: {first_line(error)}") from None
    return log


class BuildFailed(docker.errors.DockerException):
    def __init__(self, message: str, code: int | None, log: StepLog) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.log = log


def _follow(event: dict[str, Any], log: StepLog, progress: Progress) -> None:
    if "error" in event:
        detail = event.get("errorDetail") or {}
        raise BuildFailed(str(detail.get("message") or event["error"]).strip(), detail.get("code"), log)
    if "aux" in event and isinstance(event["aux"], dict) and "ID" in event["aux"]:
        log.image_id = event["aux"]["ID"]
        return
    text = event.get("stream")
    if not isinstance(text, str):
        return
    for raw in _ANSI.sub("", text).replace("\r", "\n").splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("Step ") and " : " in stripped:
            numbers, instruction = stripped[5:].split(" : ", 1)
            current, _, total = numbers.partition("/")
            if current.isdigit() and total.isdigit():
                log.current, log.total, log.instruction = int(current), int(total), instruction
                log.tail.clear()
                progress.step(log)
                continue
        if stripped == "---> Using cache":
            log.cached += 1
            progress.cached(log)
        elif stripped.startswith("---> Running in"):
            log.run += 1
        elif not stripped.startswith(("--->", "Successfully ", "Removing intermediate container")):
            log.tail.append(line)
            progress.output(line)


def build_one(
    client: Any,
    rendered: RenderedImage,
    *,
    build_args: dict[str, str],
    gate: bool,
    push: bool,
    progress: Progress,
    report: Report,
) -> dict[str, Any]:
    """Build, gate and tag one recipe x arch; add its checks to `report` and return its record."""
    arch = rendered.arch.name
    started = time.monotonic()
    record: dict[str, Any] = {
        "arch": arch,
        "recipe": rendered.recipe.name,
        "image_id": None,
        "tags": [],
        "intended_tags": [rendered.tag, rendered.moving_tag],
        "build_args": build_args,
        "verify": None,
    }
    progress.note(f"building {rendered.recipe.name} for {arch} ({rendered.arch.build_target})")
    try:
        log = stream_build(client, rendered, build_args, progress)
    except BuildFailed as failure:
        record["build_seconds"] = round(time.monotonic() - started, 1)
        record.update(_steps(failure.log))
        report.add(classify_failure(arch, rendered, failure.message, failure.code, failure.log, build_args, client))
        return record
    record["build_seconds"] = round(time.monotonic() - started, 1)
    record.update(_steps(log))
    image = client.images.get(log.image_id)
    record["image_id"] = image.id
    record["size_bytes"] = image.attrs.get("Size")
    report.add(
        Check(
            f"{arch} build",
            Status.PASS,
            f"built {image.short_id} in {record['build_seconds']} s: {log.total} steps, {log.cached} cached, "
            f"{log.run} run",
            {"image_id": image.id, "size_bytes": record["size_bytes"]},
        )
    )
    if gate:
        import_name = rendered.recipe.sgl_kernel.import_name if rendered.recipe.sgl_kernel else "sgl_kernel"
        progress.note(f"verifying {image.short_id} for {arch}")
        try:
            with sources.open_image(image.id, import_name=import_name, client=client) as tree:
                verdict = verify_tree(
                    tree, [rendered.arch], import_name=import_name, cuda=str(rendered.recipe.cuda_version)
                )
        except (SourceError, LoaderProbeError) as error:
            # An image verify cannot judge is refused like one that fails: it must not be tagged.
            verdict = Report(kind="verify", subject=image.id)
            verdict.add(Check(f"{arch} verify", Status.FAIL, error.message, remedy=error.remedy))
        record["verify"] = verdict.to_dict()
        if not verdict.ok:
            failures = verdict.failures()
            removed = _remove_refused(client, image)
            report.add(
                Check(
                    f"{arch} verify gate",
                    Status.FAIL,
                    f"refused to tag {image.short_id}: {failures[0].finding}",
                    {"failures": [f.to_dict() for f in failures], "removed_image": image.id if removed else None},
                    remedy=failures[0].remedy,
                )
            )
            return record
        report.add(
            Check(f"{arch} verify gate", Status.PASS, f"the loader-selected binary runs on {arch}", {"verify": "ok"})
        )
    else:
        report.add(
            Check(
                f"{arch} verify gate",
                Status.WARN,
                f"SKIPPED (--no-verify): {image.short_id} is tagged WITHOUT checking it has code for {arch}",
                remedy=f"run `invoke verify --arch {arch} --image {rendered.tag}` before shipping it",
            )
        )
    tags = [rendered.content_image_tag, rendered.moving_image_tag]
    for name in tags:
        image.tag(name.repo, tag=name.tag)
        record["tags"].append(str(name))
    if push:
        _push(client, tags, arch, report, progress)
    return record


def _remove_refused(client: Any, image: Any) -> bool:
    """Remove a refused image unless something else still uses it.

    Not forced: cached builds give identical content the same id, so the id may already carry tags from an
    earlier gated build (or have child images); those stay, and only this build's result is untagged.
    """
    try:
        client.images.remove(image.id, noprune=False)
    except docker.errors.APIError:
        return False
    return True


def _steps(log: StepLog) -> dict[str, int]:
    return {"steps_total": log.total, "steps_cached": log.cached, "steps_run": log.run}


def _push(client: Any, tags: list[ImageTag], arch: str, report: Report, progress: Progress) -> None:
    for full in tags:
        progress.note(f"pushing {full}")
        error = None
        try:
            for event in client.api.push(full.repo, tag=full.tag, stream=True, decode=True):
                if "error" in event:
                    error = str(event["error"]).strip()
                    break
        except (docker.errors.DockerException, requests.exceptions.RequestException) as failure:
            error = first_line(failure)
        if error:
            report.add(
                Check(
                    f"{arch} push",
                    Status.FAIL,
                    f"cannot push {full}: {error}",
                    remedy="docker login to the registry, check --tag names a registry you can write to",
                    infrastructure=True,
                )
            )
            return
    report.add(Check(f"{arch} push", Status.PASS, f"pushed {', '.join(map(str, tags))}"))


def build_images(
    recipe_name: str,
    arch_texts: list[str] | list[Arch],
    *,
    repo: str,
    gate: bool = True,
    push: bool = False,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    verbose: bool = False,
    console: Console | None = None,
    client: Any | None = None,
) -> Report:
    """`invoke build`: render, build, verify-gate and tag the recipe for each arch; one report for all."""
    import psutil

    from bwstack.images.render import render
    from bwstack.recipes.recipe import load_recipe

    recipe = load_recipe(recipe_name)
    renders = [render(recipe, text, repo=repo) for text in arch_texts]  # bad input fails before any build
    client = connect(client)
    report = Report(kind="build", subject=f"{recipe.name} for {', '.join(r.arch.name for r in renders)}")
    host = None
    if recipe.sgl_kernel is not None:
        info = client.info()  # the Docker host's resources, which need not be this machine's
        host = (
            int(info.get("MemTotal") or psutil.virtual_memory().total),
            int(info.get("NCPU") or psutil.cpu_count() or 1),
        )
    args = decide_build_args(recipe, max_jobs=max_jobs, nvcc_threads=nvcc_threads, host=host)
    images = []
    with Progress(console or Console(stderr=True), verbose=verbose) as progress:
        for rendered in renders:
            images.append(
                build_one(client, rendered, build_args=args, gate=gate, push=push, progress=progress, report=report)
            )
    if not gate:
        report.add(
            Check(
                "verify gate",
                Status.WARN,
                "--no-verify: NO image in this build was checked for GPU code before tagging",
                remedy="drop --no-verify, or run `invoke verify --image <tag> --arch <arch>` on each",
            )
        )
    report.data = {"recipe": recipe.name, "repo": repo, "verified": gate, "images": images}
    return report
