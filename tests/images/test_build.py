"""build against the real engine: the demo stack is built, verified and tagged; the incident twin is
refused; the real recipe fails fast at the pull; broken steps become findings with remedies."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest

from bwstack.images.build import Progress, build_context, build_one, connect
from bwstack.images.render import ImageTag, render
from bwstack.images.sizing import decide_build_args, size_build_jobs
from bwstack.recipes.recipe import load_recipe
from bwstack.report import Report
from tests.helpers import invoke

GB = 1 << 30


def unique_repo() -> str:
    return f"bwstack-test-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize(
    ("ram_gb", "cpus", "threads", "jobs"),
    [(24, 2, 2, 2), (24, 16, 2, 3), (64, 32, 2, 8), (8, 4, 2, 1), (449, 64, 2, 56), (2, 8, 4, 1)],
)
def test_max_jobs_fits_ram_at_4_gb_per_nvcc_thread(ram_gb: int, cpus: int, threads: int, jobs: int) -> None:
    assert size_build_jobs(ram_gb * GB, cpus, threads) == jobs


def test_max_jobs_is_the_flag_else_sized_to_the_build_host_else_the_recipes() -> None:
    recipe = load_recipe("sglang")
    assert recipe.sgl_kernel is not None
    threads = recipe.sgl_kernel.nvcc_threads
    rendered = decide_build_args(recipe)
    assert rendered == {"MAX_JOBS": str(recipe.sgl_kernel.max_jobs), "NVCC_THREADS": str(threads)}
    assert render(recipe, "sm120").build_args == rendered  # the Dockerfile's defaults are the same decision
    sized = decide_build_args(recipe, host=(64 * GB, 32))
    assert sized["MAX_JOBS"] == str(size_build_jobs(64 * GB, 32, threads))
    assert decide_build_args(recipe, max_jobs=5, nvcc_threads=1, host=(64 * GB, 32)) == {
        "MAX_JOBS": "5",
        "NVCC_THREADS": "1",
    }
    assert decide_build_args(load_recipe("demo"), max_jobs=5) == {}  # no sgl-kernel compile, no build args


def test_tags_are_repo_and_tag_until_printed() -> None:
    rendered = render(load_recipe("demo"), "sm120", repo="registry.example:5000/ml/bwstack")
    assert rendered.moving_image_tag == ImageTag("registry.example:5000/ml/bwstack", "demo-sm120")
    assert rendered.moving_tag == "registry.example:5000/ml/bwstack:demo-sm120"
    assert str(rendered.content_image_tag) == rendered.tag and rendered.content_image_tag.repo == rendered.repo


def test_build_context_is_minimal_and_reproducible(static_busybox) -> None:
    rendered = render(load_recipe("demo"), "sm120")
    first, second = build_context(rendered).getvalue(), build_context(rendered).getvalue()
    assert first == second
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        names = tar.getnames()
    assert names[0] == "Dockerfile"
    assert "busybox" in names and "package/sgl_kernel/sm100/common_ops.abi3.so" in names
    assert not any("__pycache__" in n for n in names)
    assert {n.split("/")[0] for n in names} == {"Dockerfile", "busybox", "package", "server"}


@pytest.fixture
def cleanup_images(tracked_images):
    """Per-run repositories whose tags, and only those, are removed afterwards (never a user's image that
    shares the id: identical content builds to one id)."""
    return tracked_images


def tags_of(docker_client, repo: str) -> set[str]:
    # The same image may carry other repos' tags (identical content builds to the same id): keep ours.
    return {t for image in docker_client.images.list(name=repo) for t in image.tags if t.startswith(f"{repo}:")}


@pytest.mark.docker
def test_demo_builds_passes_the_gate_and_is_tagged(docker_client, static_busybox, cleanup_images, tmp_path) -> None:
    repo = cleanup_images.repo("build")
    result = invoke("build", "--arch", "sm120", "--recipe", "demo", "--tag", repo, "--json", str(tmp_path / "b.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    (image,) = data["images"]
    rendered = render(load_recipe("demo"), "sm120", repo=repo)
    assert image["tags"] == [rendered.tag, rendered.moving_tag]
    assert tags_of(docker_client, repo) == {rendered.tag, rendered.moving_tag}
    assert image["verify"]["ok"] is True
    assert image["verify"]["targets"][0]["loader"]["selected"] == "sgl_kernel/sm100/common_ops.abi3.so"
    labels = docker_client.images.get(rendered.tag).labels
    assert labels["io.bwstack.recipe"] == "demo" and labels["io.bwstack.arch"] == "sm120"
    assert labels["io.bwstack.recipe.digest"] == f"sha256:{load_recipe('demo').digest}"
    assert image["steps_total"] >= 5 and image["size_bytes"] > 0
    # Progress in CI logs: plain step lines, no terminal control codes.
    assert "step 1/" in result.stderr and "\x1b[" not in result.stderr
    again = invoke("build", "--arch", "sm120", "--recipe", "demo", "--tag", repo, "--json", str(tmp_path / "c.json"))
    assert again.returncode == 0
    second = json.loads((tmp_path / "c.json").read_text())["images"][0]
    assert second["steps_run"] == 0 and second["steps_cached"] >= 2
    assert second["image_id"] == image["image_id"]


@pytest.mark.docker
def test_incident_twin_is_refused_and_keeps_no_tag(docker_client, static_busybox, cleanup_images, tmp_path) -> None:
    repo = cleanup_images.repo("build")
    result = invoke(
        "build", "--arch", "sm120", "--recipe", "demo-incident", "--tag", repo, "--json", str(tmp_path / "b.json")
    )
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    gate = next(c for c in data["checks"] if c["name"] == "sm120 verify gate")
    assert gate["status"] == "fail"
    assert "sgl_kernel/sm100/common_ops.abi3.so, which has no code that runs here" in gate["finding"]
    assert "compute_120a,code=sm_120a" in gate["remedy"]
    assert data["images"][0]["tags"] == []
    assert tags_of(docker_client, repo) == set()
    removed = gate["evidence"]["removed_image"]
    assert not [i for i in docker_client.images.list(all=True) if i.id == removed]


@pytest.mark.docker
def test_no_verify_tags_anyway_and_says_so(docker_client, static_busybox, cleanup_images, tmp_path) -> None:
    repo = cleanup_images.repo("build")
    result = invoke(
        *("build", "--arch", "sm120", "--recipe", "demo-incident", "--tag", repo, "--no-verify"),
        *("--json", str(tmp_path / "b.json")),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["verified"] is False
    warnings = [c["finding"] for c in data["checks"] if c["status"] == "warn"]
    assert any("SKIPPED (--no-verify)" in w for w in warnings)
    assert len(tags_of(docker_client, repo)) == 2


@pytest.mark.docker
def test_real_recipe_fails_fast_at_the_pull(docker_client, tmp_path) -> None:
    result = invoke("build", "--arch", "sm120", "--tag", unique_repo(), "--json", str(tmp_path / "b.json"))
    assert result.returncode == 2, result.stdout + result.stderr
    (check,) = json.loads((tmp_path / "b.json").read_text())["checks"]
    assert check["finding"].startswith("cannot pull base image nvidia/cuda:13.1.0-devel-ubuntu24.04")
    assert check["infrastructure"] is True and "docker pull" in check["remedy"]


def test_daemon_down_exits_2_with_one_line(static_busybox) -> None:
    result = invoke("build", "--arch", "sm120", "--recipe", "demo", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "Docker engine unreachable" in result.stderr and "Traceback" not in result.stderr


def test_bad_arch_fails_before_any_build() -> None:
    result = invoke("build", "--arch", "sm999", "--recipe", "demo", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert result.returncode == 2 and "unknown arch 'sm999'" in result.stderr


def _broken(step: str):
    rendered = render(load_recipe("demo"), "sm120", repo=unique_repo())
    dockerfile = (
        'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
        f'RUN ["/bin/sh", "-c", "{step}"]\n'
    )
    return dataclasses.replace(rendered, dockerfile=dockerfile, context_files={"busybox": "/bin/busybox"})


@pytest.mark.docker
@pytest.mark.parametrize(
    ("step", "finding", "remedy"),
    [
        ("echo compiling; echo boom >&2; exit 3", "step 4/4 failed with exit code 3", "last_lines"),
        (
            "echo nvcc started; sh -c 'kill -9 $$'; exit $?",  # not the last command: ash would exec it as PID 1
            "step 4/4 was killed (exit 137, out of memory)",
            "MAX_JOBS=4 x NVCC_THREADS=2",
        ),
    ],
)
def test_failed_steps_are_findings_and_leave_nothing_behind(
    docker_client, static_busybox, step: str, finding: str, remedy: str
) -> None:
    rendered = _broken(step)
    before = {c.id for c in docker_client.containers.list(all=True)}
    report = Report(kind="build", subject="test")
    with Progress(__import__("rich.console").console.Console(stderr=True, force_terminal=False)) as progress:
        record = build_one(
            connect(docker_client),
            rendered,
            build_args={"MAX_JOBS": "4", "NVCC_THREADS": "2"},
            gate=True,
            push=False,
            progress=progress,
            report=report,
        )
    (check,) = report.checks
    assert check.status.value == "fail" and check.finding.startswith(finding)
    assert remedy in check.remedy or remedy in json.dumps(check.evidence)
    assert record["tags"] == []
    if "boom" in step:
        # stdout and stderr reach the stream in either order
        assert sorted(check.evidence["last_lines"][-2:]) == ["boom", "compiling"]
    # forcerm removed the failed step's container (matched by its command, so other builds do not interfere)
    after = [c for c in docker_client.containers.list(all=True) if c.id not in before]
    assert not [c for c in after if step in " ".join(c.attrs["Config"].get("Cmd") or [])]


@pytest.mark.docker
def test_push_to_unreachable_registry_is_an_infrastructure_failure(
    docker_client, static_busybox, cleanup_images, tmp_path
) -> None:
    repo = cleanup_images.repo("push", registry="127.0.0.1:9/")
    result = invoke(
        "build", "--arch", "sm120", "--recipe", "demo", "--tag", repo, "--push", "--json", str(tmp_path / "b.json")
    )
    assert result.returncode == 2, result.stdout + result.stderr
    push = next(c for c in json.loads((tmp_path / "b.json").read_text())["checks"] if c["name"] == "sm120 push")
    assert push["finding"].startswith(f"cannot push {repo}:demo-sm120-cuda13.0-")


@pytest.mark.docker
def test_a_refused_build_never_untags_an_image_someone_else_tagged(
    docker_client, static_busybox, cleanup_images, tmp_path
) -> None:
    """Cached builds give identical content one id: refusing it again must not force-remove earlier tags."""
    kept, refused = cleanup_images.repo("kept"), cleanup_images.repo("refused")
    first = invoke("build", "--arch", "sm120", "--recipe", "demo-incident", "--tag", kept, "--no-verify")
    assert first.returncode == 0, first.stderr
    second = invoke(
        *("build", "--arch", "sm120", "--recipe", "demo-incident", "--tag", refused),
        *("--json", str(tmp_path / "b.json")),
    )
    assert second.returncode == 1
    gate = next(c for c in json.loads((tmp_path / "b.json").read_text())["checks"] if c["name"] == "sm120 verify gate")
    assert gate["evidence"]["removed_image"] is None  # still in use: kept
    assert len(tags_of(docker_client, kept)) == 2 and tags_of(docker_client, refused) == set()
