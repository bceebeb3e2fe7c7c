"""verify's errors name what the user gave and say what went wrong: no empty reasons, no vanished paths."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from bwstack.errors import LoaderProbeError, SourceError
from bwstack.recipes.archs import parse_arch
from bwstack.verify import sources
from bwstack.verify.loader_probe import probe_loader
from bwstack.verify.verify import verify_tree
from tests.helpers import invoke
from tests.paths import package


def copy_good(tmp_path: Path) -> Path:
    target = tmp_path / "good"
    shutil.copytree(package("good"), target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def test_a_symlinked_loader_binary_is_still_the_packages_pick(tmp_path: Path) -> None:
    root = copy_good(tmp_path)
    elsewhere = tmp_path / "store" / "common_ops.abi3.so"
    elsewhere.parent.mkdir()
    victim = root / "sgl_kernel" / "sm100" / "common_ops.abi3.so"
    shutil.move(victim, elsewhere)
    victim.symlink_to(elsewhere)
    result = probe_loader(root, "sgl_kernel", (12, 0))
    assert result.error is None
    assert result.selected is not None and "common_ops" in result.selected


def test_a_bare_exception_from_the_loader_still_says_what_failed(tmp_path: Path) -> None:
    root = copy_good(tmp_path)
    (root / "sgl_kernel" / "__init__.py").write_text("raise ImportError(name='sgl_kernel.common_ops')\n")
    result = probe_loader(root, "sgl_kernel", (12, 0))
    assert result.error == "ImportError: module sgl_kernel.common_ops"


def test_a_hung_loader_in_a_wheel_names_the_wheel_not_a_deleted_scratch_folder(tmp_path: Path) -> None:
    root = copy_good(tmp_path)
    (root / "sgl_kernel" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    wheel = tmp_path / "hang.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(root).as_posix())
    with sources.open_wheel(wheel) as tree, pytest.raises(LoaderProbeError) as error:
        verify_tree(tree, [parse_arch("sm120")], probe_timeout=1)
    assert str(error.value).startswith(f"{wheel}: importing sgl_kernel")
    assert "bwstack-wheel-" not in str(error.value) and "--timeout" in str(error.value)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda t: t, "is a folder, not a wheel file"),
        (lambda t: Path("/dev/null"), "is not a regular file, not a wheel file"),
        (lambda t: t / "missing.whl", "wheel not found"),
    ],
    ids=["folder", "dev-null", "missing"],
)
def test_wheel_that_is_not_a_file_says_what_it_is(tmp_path: Path, make, fragment: str) -> None:
    with pytest.raises(SourceError, match=fragment), sources.open_wheel(make(tmp_path)):
        pass


def test_path_that_is_a_file_says_so(tmp_path: Path) -> None:
    file = tmp_path / "x.txt"
    file.write_text("")
    result = invoke("verify", "--arch", "sm120", "--path", str(file))
    assert result.returncode == 2
    assert "is a file, not a folder" in result.stderr and result.stderr.count("\n") == 1
