"""verify end to end: the package's own loader picks a binary per CC, and the verdict follows its contents.

Sources are the nvcc-built fixture packages (tests/fixtures/packages), as a folder, as a wheel built
here, and as a FROM-scratch image built through the real Docker engine.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import psutil
import pytest

from bwstack.errors import LoaderProbeError
from bwstack.recipes.archs import parse_arch
from bwstack.verify import sources
from bwstack.verify.loader_probe import probe_loader
from bwstack.verify.verify import parse_archs, verify_tree
from tests.helpers import invoke
from tests.paths import REPO, package

# (variant, arch) -> (ok, selected binary, how it runs, via)
EXPECTED = {
    ("good", "sm120"): (True, "sgl_kernel/sm100/common_ops.abi3.so", "sass", "sm_120a"),
    ("good", "sm121"): (False, "sgl_kernel/sm100/common_ops.abi3.so", "none", None),
    ("good", "sm90"): (True, "sgl_kernel/sm90/common_ops.abi3.so", "sass", "sm_90a"),
    ("good", "sm103"): (True, "sgl_kernel/sm100/common_ops.abi3.so", "sass-family", "sm_100f"),
    ("incident", "sm120"): (False, "sgl_kernel/sm100/common_ops.abi3.so", "none", None),
    ("incident", "sm100"): (True, "sgl_kernel/sm100/common_ops.abi3.so", "sass", "sm_100a"),
    ("incident", "sm103"): (False, "sgl_kernel/sm100/common_ops.abi3.so", "none", None),
    ("own-sm120-dir", "sm120"): (True, "sgl_kernel/sm120/common_ops.abi3.so", "sass", "sm_120a"),
    ("own-sm120-dir", "sm121"): (False, "sgl_kernel/sm100/common_ops.abi3.so", "none", None),
    ("ptx-fallback", "sm120"): (True, "sgl_kernel/sm100/common_ops.abi3.so", "ptx-jit", "compute_100"),
}


def selected_row(target: dict) -> dict:
    (row,) = [b for b in target["binaries"] if b["selected"]]
    return row


def assert_expected(report_data: dict, variant: str) -> None:
    for target in report_data["targets"]:
        ok, selected, runs, via = EXPECTED[(variant, target["arch"])]
        assert target["loader"]["selected"] == selected, target
        row = selected_row(target)
        assert (target["ok"], row["path"], row["runs"], row["via"]) == (ok, selected, runs, via)
        assert row["required"] is True


def archs_for(variant: str) -> list[str]:
    return [arch for (v, arch) in EXPECTED if v == variant]


@pytest.mark.parametrize("variant", ["good", "incident", "own-sm120-dir", "ptx-fallback"])
def test_path_source_matches_expectations(variant: str) -> None:
    with sources.open_path(package(variant)) as tree:
        report = verify_tree(tree, [parse_arch(a) for a in archs_for(variant)])
    data = report.to_dict()
    assert_expected(data, variant)
    assert data["ok"] is all(EXPECTED[(variant, a)][0] for a in archs_for(variant))


def test_incident_failure_names_the_binary_and_the_remedy() -> None:
    with sources.open_path(package("incident")) as tree:
        report = verify_tree(tree, [parse_arch("sm120")])
    (failure,) = report.failures()
    assert failure.name == "sm120 loader"
    assert "sgl_kernel/sm100/common_ops.abi3.so, which has no code that runs here" in failure.finding
    assert "holds sm_80, sm_90, sm_100a" in failure.finding
    assert failure.remedy.startswith("rebuild sgl-kernel with -gencode arch=compute_120a,code=sm_120a")
    assert "compute_120f PTX" in failure.remedy


def test_other_cuda_binaries_warn_unless_required() -> None:
    with sources.open_path(package("good")) as tree:
        relaxed = verify_tree(tree, [parse_arch("sm120")])
        strict = verify_tree(tree, [parse_arch("sm120")], require=["flash_ops"])
    flash = [c for c in relaxed.checks if "flash_ops" in c.name]
    assert [c.status.value for c in flash] == ["warn"]
    assert relaxed.ok
    assert not strict.ok
    assert [c.name for c in strict.failures()] == ["sm120 sgl_kernel/flash_ops.abi3.so"]
    row = next(b for b in strict.to_dict()["targets"][0]["binaries"] if b["path"].endswith("flash_ops.abi3.so"))
    assert row["required"] is True and row["runs"] == "none"


def test_top_level_binaries_list_every_entry() -> None:
    with sources.open_path(package("incident")) as tree:
        data = verify_tree(tree, [parse_arch("sm120")]).to_dict()
    by_path = {b["path"]: b for b in data["binaries"]}
    sm100 = by_path["sgl_kernel/sm100/common_ops.abi3.so"]
    archs = {(e["kind"], e["arch"], e["codec"]) for e in sm100["entries"]}
    assert ("sass", "sm_100a", "zstd") in archs
    assert not any(e["arch"].startswith("sm_12") for e in sm100["entries"])


def build_wheel(package_dir: Path, wheel: Path, extra: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package_dir.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(package_dir).as_posix())
        archive.writestr("sglang_kernel-0.0.0.dist-info/METADATA", "Name: sglang-kernel\nVersion: 0.0.0\n")
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return wheel


@pytest.mark.parametrize("variant", ["good", "incident"])
def test_wheel_source_gives_the_same_verdicts_as_the_folder(tmp_path: Path, variant: str) -> None:
    wheel = build_wheel(package(variant), tmp_path / f"sglang_kernel-0.0.0-{variant}.whl")
    with sources.open_wheel(wheel) as tree:
        data = verify_tree(tree, [parse_arch(a) for a in archs_for(variant)]).to_dict()
    assert_expected(data, variant)


def test_wheel_with_escaping_member_is_refused_and_nothing_escapes(tmp_path: Path) -> None:
    wheel = build_wheel(package("good"), tmp_path / "evil.whl", {"../../escaped.py": b"print('x')"})
    with sources.open_wheel(wheel) as tree:
        report = verify_tree(tree, [parse_arch("sm120")])
        assert not (tree.root.parent / "escaped.py").exists()
    assert report.ok  # the refused member is a warning, the verdict still stands
    refused = next(c for c in report.checks if c.name == "source members")
    assert refused.status.value == "warn"
    assert "../../escaped.py" in refused.evidence["refused"][0]


def test_cli_exit_codes_json_and_junit(tmp_path: Path) -> None:
    good = invoke("verify", "--arch", "sm120", "--path", str(package("good")), "--json", str(tmp_path / "g.json"))
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads((tmp_path / "g.json").read_text())["ok"] is True
    bad = invoke(
        "verify",
        "--arch",
        "sm120",
        "--arch",
        "sm90",
        "--path",
        str(package("incident")),
        "--json",
        str(tmp_path / "i.json"),
        "--junit",
        str(tmp_path / "i.xml"),
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "compute_120a,code=sm_120a" in bad.stdout
    data = json.loads((tmp_path / "i.json").read_text())
    assert [(t["arch"], t["ok"]) for t in data["targets"]] == [("sm90", True), ("sm120", False)]
    suite = ET.parse(tmp_path / "i.xml").getroot()
    failed = [case.get("name") for case in suite.iter("testcase") if case.find("failure") is not None]
    assert failed == ["sm120 loader"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--arch", "sm999", "--path", "."], "unknown arch 'sm999'"),
        (["--arch", "sm120", "--path", "/nonexistent/bwstack"], "does not exist"),
        (["--arch", "sm120", "--wheel", "/nonexistent.whl"], "wheel not found"),
        (["--arch", "sm120"], "give exactly one of --wheel FILE, --path DIR or --image REF"),
        (["--arch", "sm120", "--path", str(REPO / "recipes")], "no sgl_kernel package inside"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args: list[str], fragment: str) -> None:
    result = invoke("verify", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr


def test_not_a_zip_wheel_exits_2(tmp_path: Path) -> None:
    fake = tmp_path / "fake.whl"
    fake.write_bytes(b"not a zip")
    result = invoke("verify", "--arch", "sm120", "--wheel", str(fake))
    assert result.returncode == 2 and "not a readable wheel" in result.stderr


def test_arch_all_covers_the_table() -> None:
    assert [a.name for a in parse_archs(["all"])][:2] == ["sm80", "sm86"]
    assert [a.name for a in parse_archs(["12.0", "sm_120", "sm121"])] == ["sm120", "sm121"]


def copy_package(tmp_path: Path, variant: str = "good") -> Path:
    target = tmp_path / variant
    shutil.copytree(package(variant), target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_truncated_selected_binary_is_a_per_file_failure_not_a_crash(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    victim = root / "sgl_kernel" / "sm100" / "common_ops.abi3.so"
    victim.write_bytes(victim.read_bytes()[:3000])
    result = invoke("verify", "--arch", "sm120", "--path", str(root), "--json", str(tmp_path / "r.json"))
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    broken = next(b for b in data["binaries"] if b["path"] == "sgl_kernel/sm100/common_ops.abi3.so")
    assert broken["error"] and broken["entries"] == []
    assert selected_row(data["targets"][0])["runs"] == "none"


def test_hanging_loader_is_a_clear_error(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    (root / "sgl_kernel" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(LoaderProbeError, match=r"did not finish in 2 s \(--timeout\); its loader hangs"):
        probe_loader(root, "sgl_kernel", (12, 0), timeout=2)


def test_loader_that_raises_before_choosing_is_not_probed_and_the_conservative_rule_decides(tmp_path: Path) -> None:
    """An import that dies before it looks for a binary says nothing about the GPU: every binary must run."""
    root = copy_package(tmp_path)
    (root / "sgl_kernel" / "__init__.py").write_text("raise RuntimeError('cannot find libcudart')\n")
    with sources.open_path(root) as tree:
        report = verify_tree(tree, [parse_arch("sm120")])
    loader = next(c for c in report.checks if c.name == "sm120 loader")
    assert loader.status.value == "warn"
    assert "loader: not probed (the import stopped before loading a binary: RuntimeError: cannot find libcudart)" in (
        loader.finding
    )
    assert "conservative rule: every CUDA binary sgl_kernel ships must run here" in loader.finding
    # good's sm100 build runs on 12.0 (sm_120a) but flash_ops does not: under the conservative rule it fails.
    assert [c.name for c in report.failures()] == ["sm120 sgl_kernel/flash_ops.abi3.so"]
    assert report.to_dict()["targets"][0]["probed"] is False


def test_loader_that_looked_and_found_nothing_is_a_failure_not_unprobed(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    shutil.rmtree(root / "sgl_kernel" / "sm100")
    (root / "sgl_kernel" / "sm90" / "common_ops.abi3.so").unlink()
    with sources.open_path(root) as tree:
        report = verify_tree(tree, [parse_arch("sm120")])
    loader = next(c for c in report.checks if c.name == "sm120 loader")
    assert loader.status.value == "fail"
    assert "loader loads no binary" in loader.finding


def test_loader_fallbacks_are_recorded(tmp_path: Path) -> None:
    """Remove the sm100 build: the real loader falls back; the probe records where it went."""
    root = copy_package(tmp_path)
    shutil.rmtree(root / "sgl_kernel" / "sm100")
    result = probe_loader(root, "sgl_kernel", (12, 0))
    assert result.selected is None
    assert result.error and "common_ops" in result.error
    assert any(a.path == "import common_ops" or (a.path or "").endswith("common_ops") for a in result.attempts)


def test_probe_writes_nothing_into_the_package(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    probe_loader(root, "sgl_kernel", (12, 0))
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def _tar_stream(members: list[tuple[tarfile.TarInfo, bytes]]) -> list[bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    raw = buffer.getvalue()
    return [raw[i : i + 777] for i in range(0, len(raw), 777)]  # odd chunks, as a socket delivers them


def test_image_tar_members_that_escape_are_refused(tmp_path: Path) -> None:
    evil_abs = tarfile.TarInfo("/etc/sgl_kernel/x.py")
    evil_dots = tarfile.TarInfo("usr/lib/python3/site-packages/sgl_kernel/../../../../../escape.py")
    link = tarfile.TarInfo("usr/lib/python3/site-packages/sgl_kernel/libcuda.so")
    link.type, link.linkname = tarfile.SYMTYPE, "/usr/lib/libcuda.so"
    good = tarfile.TarInfo("usr/lib/python3/site-packages/sgl_kernel/__init__.py")
    root = tmp_path / "root"
    root.mkdir()
    refused = sources._extract_wanted(
        iter(_tar_stream([(evil_abs, b"x"), (evil_dots, b"x"), (link, b""), (good, b"ok = 1\n")])), root, "sgl_kernel"
    )
    assert len(refused) == 3
    assert (root / "usr/lib/python3/site-packages/sgl_kernel/__init__.py").read_text() == "ok = 1\n"
    assert not (tmp_path / "escape.py").exists() and not any(root.rglob("libcuda.so"))


@pytest.mark.docker
@pytest.mark.parametrize(("variant", "code"), [("good", 0), ("incident", 1)])
def test_image_source_end_to_end(
    docker_client, tracked_images, static_busybox: Path, tmp_path: Path, variant: str, code: int
) -> None:
    context = tmp_path / "context"
    site = "usr/lib/python3/site-packages"
    shutil.copytree(package(variant), context / "pkg", ignore=shutil.ignore_patterns("__pycache__"))
    (context / "Dockerfile").write_text(f"FROM scratch\nCOPY pkg/ /{site}/\n")
    tag = f"{tracked_images.repo('verify')}:{variant}"  # removed by the fixture: only this run's own tag
    docker_client.images.build(path=str(context), tag=tag, rm=True)
    result = invoke("verify", "--arch", "sm120", "--image", tag, "--json", str(tmp_path / "r.json"))
    assert result.returncode == code, result.stdout + result.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert_expected(data, variant)
    assert data["source"] == f"image {tag}"
    leftovers = docker_client.containers.list(all=True, filters={"ancestor": tag})
    assert not leftovers


def test_image_with_docker_down_exits_2() -> None:
    result = invoke("verify", "--arch", "sm120", "--image", "x:y", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Docker engine unreachable" in result.stderr and "Traceback" not in result.stderr


def test_stdlib_extensions_imported_on_the_way_are_not_the_loaders_pick(tmp_path: Path) -> None:
    root = copy_package(tmp_path)
    init = root / "sgl_kernel" / "__init__.py"
    init.write_text("import select, subprocess, _posixsubprocess, mmap\n" + init.read_text())
    result = probe_loader(root, "sgl_kernel", (12, 0))
    assert result.selected == "sgl_kernel/sm100/common_ops.abi3.so"


@pytest.mark.parametrize("escape", ["", "os.setsid()"], ids=["same-session", "own-session"])
def test_a_loader_that_forks_neither_stalls_the_probe_nor_leaves_a_process(tmp_path: Path, escape: str) -> None:
    root = copy_package(tmp_path)
    init = root / "sgl_kernel" / "__init__.py"
    marker = tmp_path / "forked.pid"
    init.write_text(
        "import os, time\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        f"    {escape or 'pass'}\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        f"open({str(marker)!r}, 'w').write(str(child))\n" + init.read_text()
    )
    started = time.monotonic()
    result = probe_loader(root, "sgl_kernel", (12, 0), timeout=20)
    assert time.monotonic() - started < 10  # did not wait for the child's pipes or its sleep
    assert result.selected == "sgl_kernel/sm100/common_ops.abi3.so"
    pid = int(marker.read_text())  # written by the parent: the child cannot have been killed before it
    deadline = time.monotonic() + 5
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid), f"forked probe child {pid} is still running"


def test_sigterm_to_verify_stops_a_hung_loader_and_cleans_up(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    root = copy_package(tmp_path)
    marker = tmp_path / "loader.pid"
    (root / "sgl_kernel" / "__init__.py").write_text(
        f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    command = [sys.executable, "-m", "invoke", "verify", "--arch", "sm120", "--path", str(root), "--timeout", "50"]
    task = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    loader = int(marker.read_text())
    task.send_signal(signal.SIGTERM)
    _out, err = task.communicate(timeout=20)
    assert task.returncode == 143, err
    assert "bwstack: interrupted by SIGTERM" in err
    deadline = time.monotonic() + 5
    while _running(loader) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(loader), "the hung loader outlived verify"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_wheel_members_that_clash_as_file_and_folder_are_refused(tmp_path: Path) -> None:
    wheel = build_wheel(package("good"), tmp_path / "clash.whl", {"sgl_kernel/sm100/common_ops.abi3.so/x.py": b""})
    with sources.open_wheel(wheel) as tree:
        report = verify_tree(tree, [parse_arch("sm120")])
    refused = next(c for c in report.checks if c.name == "source members")
    assert "clashes with another member" in refused.evidence["refused"][0]
