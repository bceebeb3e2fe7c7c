"""Image facts read from files: the real Triton 3.6.0 wheel's bundled ptxas binaries (which archs each knows,
which one Triton picks for a CC and the variable that overrides it), and flashinfer binaries judged by verify."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from bwstack.advise.image import CUDA_PTXAS, TRITON_BIN, image_facts, ptxas_archs
from bwstack.verify import sources
from tests.paths import package
from tests.released import released_wheel

SITE = "usr/lib/python3/dist-packages/"


@pytest.fixture(scope="module")
def triton_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Triton 3.6.0's bin/ptxas (CUDA 12.8) and bin/ptxas-blackwell (12.9), out of the released wheel."""
    out = tmp_path_factory.mktemp("triton")
    with zipfile.ZipFile(released_wheel("triton", "3.6.0")) as wheel:
        for name in ("ptxas", "ptxas-blackwell"):
            with wheel.open(TRITON_BIN + name) as member, (out / name).open("wb") as copy:
                shutil.copyfileobj(member, copy)
    return out


def tree(root: Path, triton_bin: Path, names: tuple[str, ...], *, cuda: str | None = None) -> Path:
    target = root / SITE / TRITON_BIN
    target.mkdir(parents=True)
    for name in names:
        shutil.copy(triton_bin / name, target / name)
    if cuda:
        (root / CUDA_PTXAS).parent.mkdir(parents=True)
        shutil.copy(triton_bin / cuda, root / CUDA_PTXAS)
    return root


def test_the_bundled_ptxas_binaries_list_the_archs_of_their_release(triton_bin: Path) -> None:
    old, blackwell = ptxas_archs(triton_bin / "ptxas"), ptxas_archs(triton_bin / "ptxas-blackwell")
    assert {"sm_90a", "sm_100a", "sm_120a"} <= old and "sm_121a" not in old  # CUDA 12.8: no sm_121 yet
    assert {"sm_120", "sm_121", "sm_121a"} <= blackwell


def test_triton_36_picks_ptxas_blackwell_on_cc_12_and_knows_sm121(tmp_path: Path, triton_bin: Path) -> None:
    with sources.open_path(tree(tmp_path, triton_bin, ("ptxas", "ptxas-blackwell"))) as t:
        facts = image_facts(t, (12, 1))
    assert (facts.triton_ptxas_knows, facts.triton_ptxas_env) == (True, "TRITON_PTXAS_BLACKWELL_PATH")


def test_a_triton_with_only_a_12_8_ptxas_does_not_know_sm121(tmp_path: Path, triton_bin: Path) -> None:
    with sources.open_path(tree(tmp_path, triton_bin, ("ptxas",), cuda="ptxas-blackwell")) as t:
        facts = image_facts(t, (12, 1))
    assert (facts.triton_ptxas_knows, facts.triton_ptxas_env) == (False, "TRITON_PTXAS_PATH")
    assert (facts.cuda_ptxas, facts.cuda_ptxas_knows) == ("/" + CUDA_PTXAS, True)
    with sources.open_path(tmp_path) as t:
        assert image_facts(t, (12, 0)).triton_ptxas_knows is True  # the same ptxas knows sm_120


def test_no_triton_and_no_cc_leave_the_facts_unknown(tmp_path: Path) -> None:
    with sources.open_path(tmp_path) as t:
        assert image_facts(t, (12, 0)).triton_ptxas_knows is None
        assert image_facts(t, None).flashinfer_runs is None


def test_flashinfer_binaries_are_judged_for_the_cc(tmp_path: Path) -> None:
    # nvcc-built fixtures placed as flashinfer binaries: common_ops holds sm_120a SASS, flash_ops only up to sm_90a.
    target = tmp_path / SITE / "flashinfer" / "data"
    target.mkdir(parents=True)
    shutil.copy(package("good") / "sgl_kernel" / "flash_ops.abi3.so", target)
    with sources.open_path(tmp_path) as t:
        assert image_facts(t, (12, 0)).flashinfer_runs is False
        assert image_facts(t, (9, 0)).flashinfer_runs is True
    shutil.copy(package("good") / "sgl_kernel" / "sm100" / "common_ops.abi3.so", target)
    with sources.open_path(tmp_path) as t:
        assert image_facts(t, (12, 0)).flashinfer_runs is True
