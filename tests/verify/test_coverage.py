"""Per-container coverage, device files outside host libraries, and reports a person can act on.

The binaries are the nvcc-built fixtures (tests/fixtures/cuda/build_fixtures.sh): `partial` links two
translation units with different gencode lists into sgl_kernel/sm100/common_ops.abi3.so, and
cuda/device/ holds bare cubins, a .fatbin and a .ptx file.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from bwstack.recipes.archs import parse_arch
from bwstack.verify import elf, sources, stream_capture
from bwstack.verify.device_files import cubin_target, read_device_file
from bwstack.verify.fatbin import read_entries
from bwstack.verify.verify import verify_tree
from tests.helpers import invoke
from tests.paths import FIXTURES, package

MANIFEST = json.loads((FIXTURES / "cuda" / "manifest.json").read_text())
PARTIAL = "sgl_kernel/sm100/common_ops.abi3.so"


def verdict(root: Path, arch: str, **options: object) -> dict:
    with sources.open_path(root) as tree:
        return verify_tree(tree, [parse_arch(arch)], **options).to_dict()  # type: ignore[arg-type]


def loader_check(data: dict) -> dict:
    return next(c for c in data["checks"] if c["name"].endswith(" loader"))


def test_two_units_hold_three_containers_one_of_them_kernel_free() -> None:
    """The library holds sm_120a, but only in norm_kernel's container; the link's own container has no kernels."""
    entries = read_entries(package("partial") / PARTIAL, kernels=True)
    by_container: dict[int, set[str]] = {}
    for entry in entries:
        by_container.setdefault(entry.container, set()).add(entry.arch)
    kernels = {e.container: set(e.kernels) for e in entries if e.kernels}
    assert sorted(kernels.values(), key=sorted) == [{"attention_sm90_kernel"}, {"norm_kernel"}]
    attention = next(c for c, names in kernels.items() if names == {"attention_sm90_kernel"})
    assert by_container[attention] == {"sm_80", "sm_90a"}
    free = {e.container for e in entries if e.kernel_free}
    assert len(free) == 1 and not kernels.keys() & free
    # The header-only read (no kernel names asked) finds the same kernel-free container.
    assert {e.container for e in read_entries(package("partial") / PARTIAL) if e.kernel_free} == free


def test_one_container_without_sm120_fails_the_loader_selected_binary() -> None:
    data = verdict(package("partial"), "sm120")
    check = loader_check(data)
    assert check["status"] == "fail"
    assert f"the loader picks {PARTIAL}, which runs via sm_120a (exact SASS)" in check["finding"]
    assert "but 1 of 2 containers have no code for CC 12.0" in check["finding"]
    assert "--allow-missing" in check["remedy"]
    (target,) = data["targets"]
    assert target["ok"] is False
    assert target["binaries"][0]["coverage"]["missing"] == 1


def test_kernels_name_the_kernels_without_code() -> None:
    data = verdict(package("partial"), "sm120", kernels=True)
    check = loader_check(data)
    assert "kernels without code: attention_sm90_kernel" in check["finding"]
    assert data["targets"][0]["binaries"][0]["coverage"]["missing_kernels"] == ["attention_sm90_kernel"]


@pytest.mark.parametrize(
    ("options", "status"),
    [
        ({"allow_partial": True}, "warn"),
        ({"allow_missing": ["attention_sm90_*"]}, "warn"),
        ({"allow_missing": ["*_sm100_*"]}, "fail"),  # a glob that does not match keeps the failure
    ],
)
def test_allowing_the_gap(options: dict, status: str) -> None:
    data = verdict(package("partial"), "sm120", **options)
    assert loader_check(data)["status"] == status
    assert data["ok"] is (status == "warn")


def test_the_same_library_runs_fully_where_both_units_have_code() -> None:
    """On 9.0 both units hold sm_90a: full coverage. (For 9.0 this loader looks in sm90/, which the
    fixture does not ship, so only the library's row is asserted.)"""
    with sources.open_path(package("partial")) as tree:
        data = verify_tree(tree, [parse_arch("sm90")], require=["common_ops"]).to_dict()
    row = next(b for t in data["targets"] for b in t["binaries"] if b["path"] == PARTIAL)
    assert row["coverage"]["missing"] == 0 and row["runs"] == "sass"


def test_cli_allow_missing_turns_the_failure_into_a_warning(tmp_path: Path) -> None:
    failed = invoke("verify", "--path", str(package("partial")), "--arch", "sm120")
    assert failed.returncode == 1
    allowed = invoke(
        "verify", "--path", str(package("partial")), "--arch", "sm120", "--allow-missing", "attention_sm90_*"
    )
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "(allowed)" in allowed.stdout


@pytest.mark.parametrize("row", MANIFEST["device_files"], ids=lambda row: row["path"])
def test_device_files_are_read_by_kind(row: dict) -> None:
    entries = read_device_file(FIXTURES / row["path"], kernels=True)
    assert [e.arch for e in entries] == row["targets"]
    for entry in entries:
        assert set(entry.kernels) == set(MANIFEST["device_files_kernels"])


@pytest.mark.parametrize("name", ["kernels.sm_120a.cubin", "kernels.sm_100f.cubin", "kernels.sm_90.cubin"])
def test_a_cubins_flags_give_its_number_even_without_the_tkinfo_note(name: str) -> None:
    """e_flags (ABI 8: bits 8-15) agree with the note's `-arch` on the number; the suffix needs the note."""
    path = FIXTURES / "cuda" / "device" / name
    with elf.open_file(path) as source:
        header = elf.read_header(source)
        number, _suffix = cubin_target(source, header)
        assert header.abi_version == 8
        assert (header.flags >> 8) & 0xFF == number
    assert f"sm_{number}" in name


def test_a_folder_of_device_files_is_one_row_of_files(tmp_path: Path) -> None:
    root = tmp_path / "site"
    cubins = root / "kpkg" / "cubins"
    cubins.mkdir(parents=True)
    (root / "kpkg" / "__init__.py").write_text("")
    for name in ("kernels.sm_120a.cubin", "kernels.sm_100f.cubin", "kernels.sm_90.cubin"):
        shutil.copy(FIXTURES / "cuda" / "device" / name, cubins / name)
    data = verdict(root, "sm120", import_name="kpkg")
    (row,) = data["binaries"]
    assert row["path"] == "kpkg/cubins/*.cubin" and row["files"] == 3
    check = next(c for c in data["checks"] if c["name"] == "sm120 kpkg/cubins/*.cubin")
    # Importing kpkg loads nothing: not probed, so every binary decides; two of three cubins miss 12.0.
    assert "loader: not probed" in loader_check(data)["finding"]
    assert check["status"] == "fail"
    assert "2 of 3 files have no code for CC 12.0" in check["finding"]


def test_identical_files_fold_into_one_row_and_any_elf_is_read(tmp_path: Path) -> None:
    root = tmp_path / "site"
    shutil.copytree(package("good"), root, ignore=shutil.ignore_patterns("__pycache__"))
    lib = root / "sgl_kernel" / "lib"
    lib.mkdir()
    for name in ("libx.so", "libx.so.1", "libx.so.1.2"):  # what a wheel makes of libx.so's symlinks
        shutil.copy(FIXTURES / "cuda" / "bin" / "multi.so", lib / name)
    shutil.copy(FIXTURES / "cuda" / "bin" / "sm120a.so", root / "sgl_kernel" / "tool")  # an ELF with no suffix
    data = verdict(root, "sm120")
    paths = {b["path"]: b for b in data["binaries"]}
    assert paths["sgl_kernel/lib/libx.so"]["copies"] == ["sgl_kernel/lib/libx.so.1", "sgl_kernel/lib/libx.so.1.2"]
    assert "sgl_kernel/lib/libx.so.1" not in paths
    assert [e["arch"] for e in paths["sgl_kernel/tool"]["entries"] if not e["kernel_free"]] == ["sm_120a"]


def test_distribution_is_named_in_subject_json_and_junit_and_in_the_remedy(tmp_path: Path) -> None:
    root = tmp_path / "site"
    shutil.copytree(package("incident"), root, ignore=shutil.ignore_patterns("__pycache__"))
    info = root / "sglang_kernel-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 9.9.9\n")
    (info / "RECORD").write_text("sgl_kernel/__init__.py,,\n")
    junit = tmp_path / "report.xml"
    out = tmp_path / "report.json"
    result = invoke("verify", "--path", str(root), "--arch", "sm120", "--json", str(out), "--junit", str(junit))
    assert result.returncode == 1
    data = json.loads(out.read_text())
    assert data["distributions"] == [{"name": "sglang-kernel", "version": "9.9.9"}]
    assert data["subject"].endswith("(sglang-kernel 9.9.9)")
    assert "sgl_kernel is installed by sglang-kernel 9.9.9" in junit.read_text()
    assert loader_check(data)["remedy"].startswith("rebuild sglang-kernel with")


def test_dotted_namespace_package(tmp_path: Path) -> None:
    """`--package nvidia.cu13`: a namespace package (no __init__.py) inside another one."""
    root = tmp_path / "site"
    lib = root / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    shutil.copy(FIXTURES / "cuda" / "bin" / "sm90a.so", lib / "libkern.so.13")
    result = invoke("verify", "--path", str(root), "--package", "nvidia.cu13", "--arch", "sm90", "--arch", "sm120")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nvidia/cu13/lib/libkern.so.13" in result.stdout
    assert "not probed" in result.stdout


def test_wheel_with_device_files_streams_them(tmp_path: Path) -> None:
    wheel = tmp_path / "kpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("kpkg/__init__.py", "")
        for row in MANIFEST["device_files"]:
            archive.write(FIXTURES / row["path"], "kpkg/device/" + Path(row["path"]).name)
    with sources.open_wheel(wheel) as tree:
        data = verify_tree(tree, [parse_arch("sm120")], import_name="kpkg").to_dict()
    (row,) = data["binaries"]
    assert row["files"] == 5
    assert data["distributions"] == [{"name": "kpkg", "version": "1.0"}]


def test_conservative_rule_covers_only_the_packages_own_binaries(tmp_path: Path) -> None:
    """Not probed: kpkg's binaries must run; another package's library in the same site-packages only warns."""
    root = tmp_path / "site"
    (root / "kpkg").mkdir(parents=True)
    (root / "kpkg" / "__init__.py").write_text("")
    shutil.copy(FIXTURES / "cuda" / "bin" / "sm90a.so", root / "kpkg" / "_ops.so")
    (root / "other").mkdir()
    shutil.copy(FIXTURES / "cuda" / "bin" / "sm80.so", root / "other" / "libother.so")
    data = verdict(root, "sm120", import_name="kpkg")
    assert check_status(data, "sm120 kpkg/_ops.so") == "fail"
    assert check_status(data, "sm120 other/libother.so") == "warn"


def check_status(data: dict, name: str) -> str:
    return next(c["status"] for c in data["checks"] if c["name"] == name)


def test_ptx_kernel_names_survive_chunked_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PTX file is scanned in line-aligned pieces (bounded memory); tiny pieces find the same names."""
    from bwstack.verify import device_files

    path = FIXTURES / "cuda" / "device" / "kernels.compute_120.ptx"
    whole = read_device_file(path, kernels=True)[0].kernels
    monkeypatch.setattr(device_files, "_PTX_CHUNK", 37)
    assert read_device_file(path, kernels=True)[0].kernels == whole
    assert set(whole) == set(MANIFEST["device_files_kernels"])


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("broken.cubin", lambda data: data[:100]),  # a CUDA ELF cut inside its header tables
        ("junk.cubin", lambda data: b"\x7fELF" + b"\xff" * 200),  # ELF magic, garbage after
        ("junk.fatbin", lambda data: (0xBA55ED50).to_bytes(4, "little") + b"\xff" * 60),  # fatbin magic, garbage
    ],
)
def test_damaged_device_file_is_a_reported_error(tmp_path: Path, name: str, damage: Callable[[bytes], bytes]) -> None:
    root = tmp_path / "site"
    (root / "kpkg").mkdir(parents=True)
    (root / "kpkg" / "__init__.py").write_text("")
    good = (FIXTURES / "cuda" / "device" / "kernels.sm_120a.cubin").read_bytes()
    (root / "kpkg" / name).write_bytes(damage(good))
    data = verdict(root, "sm120", import_name="kpkg")
    (row,) = data["binaries"]
    assert row["error"], row
    assert check_status(data, f"sm120 kpkg/{name}") == "fail"  # the package's own binary, not probed


def test_streamed_wheel_member_keeps_what_the_kernel_free_test_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the single-pass capture (no full copy), the two-unit library gets the folder's verdict."""
    wheel = tmp_path / "sglang_kernel-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package("partial").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(package("partial")).as_posix())
    folder = verdict(package("partial"), "sm120")
    monkeypatch.setattr(sources, "_SMALL_MEMBER", 0)  # every member takes the streamed path
    monkeypatch.setattr(stream_capture, "TAIL", 4096)  # only the section table: cubins come from the windows

    def no_copy(*args: object, **kwargs: object) -> object:
        raise AssertionError("fell back to a full copy")

    monkeypatch.setattr(sources, "read_device_file", no_copy)
    with sources.open_wheel(wheel) as tree:
        streamed = verify_tree(tree, [parse_arch("sm120")]).to_dict()
    assert streamed["targets"][0]["binaries"] == folder["targets"][0]["binaries"]
    assert loader_check(streamed)["status"] == "fail"


def test_torch_without_code_for_the_gpu_fails_even_when_the_package_passes(tmp_path: Path) -> None:
    """A site-packages whose torch/lib/libtorch_cuda.so has no code for 12.0: every op would fail."""
    root = tmp_path / "site"
    shutil.copytree(package("good"), root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "torch" / "lib").mkdir(parents=True)
    shutil.copy(FIXTURES / "cuda" / "bin" / "sm90a.so", root / "torch" / "lib" / "libtorch_cuda.so")
    data = verdict(root, "sm120")
    assert loader_check(data)["status"] == "pass"  # sgl_kernel's own pick runs via sm_120a
    torch = next(c for c in data["checks"] if c["name"] == "sm120 torch/lib/libtorch_cuda.so")
    assert torch["status"] == "fail" and "has no code that runs here (holds sm_90a)" in torch["finding"]
    assert torch["remedy"].startswith("install a torch build whose CUDA arch list covers 12.0")
    assert data["ok"] is False


@pytest.mark.parametrize(
    ("runtime", "cuda", "status"),
    [
        ("usr/local/cuda-12.8/lib64/libcudart.so.12.8.90", "13.0", "fail"),
        ("usr/local/cuda-13.0/lib64/libcudart.so.13.0.96", "13.0", "pass"),
        ("usr/local/cuda-13.0/lib64/libcudart.so.13.0.96", "13.1", "warn"),
        ("site-packages/nvidia/cu13/lib/libcudart.so.13", "13.0", "pass"),
    ],
)
def test_cuda_runtime_against_the_builds_cuda(tmp_path: Path, runtime: str, cuda: str, status: str) -> None:
    root = tmp_path / "image"
    shutil.copytree(package("good"), root / "site-packages", ignore=shutil.ignore_patterns("__pycache__"))
    (root / runtime).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "cuda" / "bin" / "host_only.so", root / runtime)
    data = verdict(root, "sm120", cuda=cuda)
    assert check_status(data, "cuda runtime") == status
    assert sources._wanted(PurePosixPath(runtime), "sgl_kernel")  # an image export keeps it too
    assert not any(c["name"] == "cuda runtime" for c in verdict(root, "sm120")["checks"])  # no --cuda: no check


def test_cli_cuda_must_be_a_version() -> None:
    result = invoke("verify", "--path", str(package("good")), "--arch", "sm120", "--cuda", "thirteen")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--cuda" in result.stderr
