"""Image facts read from files: the real Triton 3.6.0 wheel's bundled ptxas binaries (which archs each knows,
which one Triton picks for a CC and the variable that overrides it), and flashinfer binaries judged by verify."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from bwstack.advise.image import CUDA_PTXAS, TRITON_BIN, image_facts, ptxas_archs
from bwstack.verify import sources
from tests.helpers import invoke
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


@pytest.mark.docker
def test_advise_reads_an_images_ptxas_without_running_it(docker_client, tracked_images, tmp_path: Path) -> None:
    """FROM scratch: Triton with only a CUDA 12.8 ptxas (no sm_121a) and a CUDA 13 ptxas that has it."""
    context = tmp_path / "context"
    bin_dir = context / "site" / TRITON_BIN
    bin_dir.mkdir(parents=True)
    (bin_dir / "ptxas").write_bytes(b"\x7fELF ... sm_100a\x00sm_120a\x00sm_120\x00")
    (context / "cuda-ptxas").write_bytes(b"\x7fELF ... sm_120a\x00sm_121a\x00")
    (context / "Dockerfile").write_text(f"FROM scratch\nCOPY site/ /{SITE}\nCOPY cuda-ptxas /{CUDA_PTXAS}\n")
    tag = f"{tracked_images.repo('advise')}:ptxas"  # removed by the fixture: only this run's own tag
    docker_client.images.build(path=str(context), tag=tag, rm=True)
    out = tmp_path / "advice.json"
    result = invoke("advise", "--image", tag, "--arch", "sm121", "--recipe", "demo", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("SGLANG_ENABLE_JIT_DEEPGEMM=0 TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas ")
    data = json.loads(out.read_text())
    assert data["image_evidence"]["triton_ptxas"]["path"].endswith(TRITON_BIN + "ptxas")
    assert not docker_client.containers.list(all=True, filters={"ancestor": tag})


def test_the_cuda_ptxas_is_found_behind_the_cuda_link(tmp_path: Path, triton_bin: Path) -> None:
    # An image export refuses the /usr/local/cuda link: its target folder holds the file.
    for version, source in (("12.8", "ptxas"), ("13.1", "ptxas-blackwell")):
        target = tmp_path / f"usr/local/cuda-{version}/bin/ptxas"
        target.parent.mkdir(parents=True)
        shutil.copy(triton_bin / source, target)
    with sources.open_path(tmp_path) as t:
        facts = image_facts(t, (12, 1))
    assert (facts.cuda_ptxas, facts.cuda_ptxas_knows) == ("/usr/local/cuda-13.1/bin/ptxas", True)
