"""verify on real released wheels beyond the sgl_kernel fixtures (tests/released.toml; cached, never skipped).

Each wheel is verified once (module-scoped), for several archs in one call, and the members are
streamed: the five wheels together take well under a minute. Oracles come from the wheels themselves
(xformers' build record, flashinfer-cubin's file names, Triton's ptxas --version).
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from bwstack.verify import sources
from bwstack.verify.verify import parse_archs, verify_tree
from tests.released import released_wheel

SGL_ARCHS = ["sm80", "sm90", "sm100", "sm103", "sm120", "sm121"]


def run(wheel: Path, package: str, archs: list[str], **options: object) -> dict:
    with sources.open_wheel(wheel) as tree:
        return verify_tree(tree, parse_archs(archs), import_name=package, **options).to_dict()  # type: ignore[arg-type]


def check(data: dict, name: str) -> dict:
    return next(c for c in data["checks"] if c["name"] == name)


@pytest.fixture(scope="module")
def xformers() -> tuple[Path, dict]:
    wheel = released_wheel("xformers", "0.0.33.post2")
    return wheel, run(wheel, "xformers", ["sm90", "sm120"])


def test_xformers_on_sm120_is_not_a_failure(xformers: tuple[Path, dict]) -> None:
    """Its loader calls torch.ops.load_library(xformers/_C.so); _C.so runs on 12.0 through PTX JIT."""
    wheel, data = xformers
    with zipfile.ZipFile(wheel) as archive:
        arch_list = json.loads(archive.read("xformers/cpp_lib.json"))["env"]["TORCH_CUDA_ARCH_LIST"]
    ptx = sorted(f"compute_{a.removesuffix('+PTX').replace('.', '')}" for a in arch_list.split() if "+PTX" in a)
    assert data["ok"] is True
    assert data["distributions"] == [{"name": "xformers", "version": "0.0.33.post2"}]
    for target in data["targets"]:
        assert target["probed"] is True
        assert target["loader"]["selected"] == "xformers/_C.so"
        assert target["loader"]["attempts"][0]["how"] == "load_library"
    sm120 = next(t for t in data["targets"] if t["arch"] == "sm120")
    (row,) = [b for b in sm120["binaries"] if b["selected"]]
    assert row["runs"] == "ptx-jit" and [row["via"]] == ptx
    assert check(data, "sm120 loader")["status"] == "warn"
    assert check(data, "sm90 loader")["status"] == "pass"
    # The FA3 library is another binary: it warns, named by its path, not only its basename.
    assert check(data, "sm120 xformers/flash_attn_3/_C.so")["status"] == "warn"


@pytest.fixture(scope="module")
def flashinfer() -> tuple[Path, dict]:
    wheel = released_wheel("flashinfer-cubin", "0.5.3")
    return wheel, run(wheel, "flashinfer_cubin", ["sm100", "sm120"], kernels=True)


def test_flashinfer_cubins_are_listed_and_judged(flashinfer: tuple[Path, dict]) -> None:
    wheel, data = flashinfer
    with zipfile.ZipFile(wheel) as archive:
        cubins = [n for n in archive.namelist() if n.endswith(".cubin")]
    rows = data["binaries"]
    assert sum(r["files"] for r in rows) == len(cubins)
    assert all(r["path"].startswith("flashinfer_cubin/cubins/") and r["path"].endswith("/*.cubin") for r in rows)
    assert data["distributions"] == [{"name": "flashinfer-cubin", "version": "0.5.3"}]
    # Nothing in it loads at import: the conservative rule. No cubin targets 12.x, so 12.0 fails.
    assert all(t["probed"] is False for t in data["targets"])
    sm120 = next(t for t in data["targets"] if t["arch"] == "sm120")
    assert sm120["ok"] is False and all(b["runs"] == "none" for b in sm120["binaries"])
    failure = next(c for c in data["checks"] if c["name"].startswith("sm120 flashinfer_cubin/") and "fmha" in c["name"])
    assert failure["remedy"].startswith("rebuild flashinfer-cubin with")


def test_flashinfer_sm103a_cubins_are_the_files_without_code_on_sm100(flashinfer: tuple[Path, dict]) -> None:
    """The oracle: upstream's file names carry the target (fmhaSm103aKernel_..., ..._sm100f.cubin)."""
    wheel, data = flashinfer
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".cubin") and "/fmha/" in n]
    sm103a = [n for n in names if re.search(r"sm103a", n, re.IGNORECASE)]
    sm100 = next(t for t in data["targets"] if t["arch"] == "sm100")
    fmha = next(b for b in sm100["binaries"] if "/fmha/" in b["path"])
    assert fmha["coverage"]["containers"] == len(names)
    assert fmha["coverage"]["missing"] == len(sm103a) > 0
    assert all(k.startswith("fmhaSm103a") for k in fmha["coverage"]["missing_kernels"])


def test_flashinfer_allow_missing_by_kernel_name() -> None:
    data = run(
        released_wheel("flashinfer-cubin", "0.5.3"), "flashinfer_cubin", ["sm100"], allow_missing=["fmhaSm103a*"]
    )
    assert data["ok"] is True
    fmha = next(c for c in data["checks"] if "fmha" in c["name"])
    assert fmha["status"] == "warn" and "(allowed)" in fmha["finding"]


def sgl_expectations(data: dict) -> None:
    """The loader picks sm90/ on 9.0, sm100/ everywhere else (load_utils.py); containers agree, so the
    per-container rule changes nothing: a target passes exactly when the picked file runs."""
    for target in data["targets"]:
        (row,) = [b for b in target["binaries"] if b["selected"]]
        wanted = "sm90" if target["arch"] == "sm90" else "sm100"
        assert row["path"] == f"sgl_kernel/{wanted}/common_ops.abi3.so"
        cover = row["coverage"]
        # Every container has code, or none has: the file-level verdict is the whole truth.
        assert cover["missing"] == (cover["containers"] if row["runs"] == "none" else 0), target["arch"]
        assert target["ok"] is (row["runs"] != "none"), target["arch"]


def test_sglang_kernel_0_4_10_verdicts() -> None:
    data = run(released_wheel("sglang-kernel", "0.4.10"), "sgl_kernel", SGL_ARCHS)
    sgl_expectations(data)
    assert {t["arch"]: t["ok"] for t in data["targets"]} == {a: a != "sm121" for a in SGL_ARCHS}
    assert data["distributions"] == [{"name": "sglang-kernel", "version": "0.4.10"}]
    assert check(data, "sm121 loader")["remedy"].startswith("rebuild sglang-kernel with")


def test_sgl_kernel_0_3_21_verdicts_and_folded_copies() -> None:
    data = run(released_wheel("sgl-kernel", "0.3.21"), "sgl_kernel", SGL_ARCHS)
    sgl_expectations(data)
    assert {t["arch"]: t["ok"] for t in data["targets"]} == {a: a not in ("sm103", "sm121") for a in SGL_ARCHS}
    assert data["distributions"] == [{"name": "sgl-kernel", "version": "0.3.21"}]
    assert check(data, "sm103 loader")["remedy"].startswith("rebuild sgl-kernel with")
    rows = {b["path"]: b["copies"] for b in data["binaries"]}
    assert rows["lib/mscclpp.so"] == ["lib/mscclpp.so.0", "lib/mscclpp.so.0.6.0"]
    assert rows["lib/mscclpp_nccl.so"] == ["lib/mscclpp_nccl.so.0", "lib/mscclpp_nccl.so.0.6.0"]
    assert not any(p.startswith("lib/mscclpp.so.") for p in rows)


def bundled_ptxas_release(wheel: Path, member: str, tmp_path: Path) -> str:
    """What Triton itself does to learn the version: run `ptxas --version` (only here, in a test)."""
    with zipfile.ZipFile(wheel) as archive:
        target = Path(archive.extract(member, tmp_path))
    target.chmod(target.stat().st_mode | stat.S_IXUSR)
    out = subprocess.run([str(target), "--version"], capture_output=True, text=True, timeout=60).stdout
    match = re.search(r"release (\d+\.\d+), (V[\d.]+)", out)
    assert match, out
    return f"CUDA {match.group(1)}, {match.group(2)}"


def test_triton_bundled_ptxas_is_judged_per_arch(tmp_path: Path) -> None:
    wheel = released_wheel("triton", "3.6.0")
    data = run(wheel, "triton", ["sm90", "sm110", "sm120"])
    blackwell = bundled_ptxas_release(wheel, "triton/backends/nvidia/bin/ptxas-blackwell", tmp_path)
    hopper = bundled_ptxas_release(wheel, "triton/backends/nvidia/bin/ptxas", tmp_path)
    sm120 = check(data, "sm120 triton ptxas")
    assert sm120["status"] == "pass"
    assert f"Triton compiles sm_120a with triton/backends/nvidia/bin/ptxas-blackwell ({blackwell};" in sm120["finding"]
    assert f"(CUDA {check(data, 'sm90 triton ptxas')['evidence']['release']}, " in f"({hopper}"
    # Jetson Thor's sm_110a arrived in CUDA 13.0 (12.9 called it sm_101): the bundled 12.9 ptxas cannot build it.
    sm110 = check(data, "sm110 triton ptxas")
    assert sm110["status"] == "fail" and "needs CUDA >= 13.0" in sm110["finding"]
    assert sm110["remedy"].startswith("export TRITON_PTXAS_BLACKWELL_PATH=/usr/local/cuda/bin/ptxas")
    assert {t["arch"]: t["ok"] for t in data["targets"]} == {"sm90": True, "sm110": False, "sm120": True}
    # Triton ships no device code of its own; its loader picks a host library: not a failure.
    assert "ships no CUDA device code" in check(data, "sm120 loader")["finding"]
