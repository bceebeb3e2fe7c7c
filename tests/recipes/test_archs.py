"""The arch table: spellings, CUDA floors and nvcc flags derived from it."""

from __future__ import annotations

import pytest
from packaging.version import Version

from bwstack.errors import ArchError
from bwstack.recipes.archs import ARCHS, arch_for_cc, cc_text, parse_arch, parse_arch_list


@pytest.mark.parametrize("spelling", ["sm120", "sm_120", "SM_120", "12.0", "sm_120a", "120", " sm120 "])
def test_spellings_of_sm120_resolve_to_one_row(spelling: str) -> None:
    arch = parse_arch(spelling)
    assert arch.name == "sm120"
    assert arch.cc == (12, 0)


@pytest.mark.parametrize("bad", ["sm999", "12.9", "sm_12", "", "hopper", "sm_120x", "13"])
def test_unknown_arch_names_the_known_ones(bad: str) -> None:
    with pytest.raises(ArchError, match=r"unknown arch .*known archs are sm80, .*sm121"):
        parse_arch(bad)


def test_table_covers_the_issue_archs_once_each() -> None:
    names = [a.name for a in ARCHS]
    assert names == ["sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm110", "sm120", "sm121"]
    assert len({a.cc for a in ARCHS}) == len(ARCHS)


def test_sm120_builds_arch_specific_sass_with_matching_flags() -> None:
    arch = parse_arch("sm120")
    assert arch.build_target == "sm_120a"
    assert arch.gencode == "-gencode=arch=compute_120a,code=sm_120a"
    assert arch.torch_arch == "12.0a"
    assert arch.family_runs_on == ((12, 0), (12, 1))


def test_sm100_builds_family_code_that_covers_b300() -> None:
    arch = parse_arch("sm100")
    assert arch.build_target == "sm_100f"
    assert (10, 3) in arch.family_runs_on
    assert arch.gencode == "-gencode=arch=compute_100f,code=sm_100f"


@pytest.mark.parametrize(
    ("name", "cuda", "ok"),
    [
        ("sm120", "12.8", True),  # sm_120a arrived with 12.8
        ("sm100", "12.8", False),  # sm_100f needs 12.9
        ("sm100", "12.9", True),
        ("sm121", "12.8", False),
        ("sm110", "12.9", False),  # sm_110 is a CUDA 13 name (was sm_101)
        ("sm110", "13.0", True),
        ("sm90", "11.8", False),  # sm_90a needs 12.0
        ("sm80", "11.0", True),
    ],
)
def test_cuda_floor_for_each_build_target(name: str, cuda: str, ok: bool) -> None:
    assert parse_arch(name).supported_by(Version(cuda)) is ok


def test_arch_for_cc_knows_the_table_and_nothing_else() -> None:
    assert arch_for_cc((9, 0)).name == "sm90"
    assert arch_for_cc((7, 5)) is None


@pytest.mark.parametrize(("spelling", "builds"), [("sm_80a", "sm_80"), ("sm_100a", "sm_100f"), ("sm_86f", "sm_86")])
def test_a_suffix_bwstack_does_not_build_is_refused_not_swapped(spelling: str, builds: str) -> None:
    with pytest.raises(ArchError, match=rf"bwstack builds sm\d+ as {builds}, not as {spelling}"):
        parse_arch(spelling)


@pytest.mark.parametrize(
    ("values", "names"),
    [
        (["sm120"], ["sm120"]),
        ("sm_120", ["sm120"]),
        (["12.0", "sm_120", "sm120"], ["sm120"]),  # repeats collapse
        (["sm121,12.0", " sm_90 , "], ["sm90", "sm120", "sm121"]),  # commas; table order, not flag order
        ([parse_arch("sm100"), "10.3"], ["sm100", "sm103"]),  # rows already parsed pass through
    ],
)
def test_arch_lists_take_every_spelling_repeats_and_commas(values: list[str] | str, names: list[str]) -> None:
    assert [a.name for a in parse_arch_list(values)] == names


def test_all_is_the_recipes_archs_where_a_recipe_is_involved_else_the_table() -> None:
    assert [a.name for a in parse_arch_list(["all"])] == [a.name for a in ARCHS]
    assert [a.name for a in parse_arch_list(["ALL,sm80"], recipe_archs=["sm_120", "9.0"])] == ["sm80", "sm90", "sm120"]


@pytest.mark.parametrize("values", [[], None, [""], [" , "]])
def test_no_arch_is_an_arch_error_with_the_forms_as_remedy(values: list[str] | None) -> None:
    with pytest.raises(ArchError, match=r"^no --arch given \(e\.g\. --arch sm120\) \(remedy: repeat --arch"):
        parse_arch_list(values)


def test_a_bad_arch_in_a_list_is_named() -> None:
    with pytest.raises(ArchError, match="unknown arch 'sm999'"):
        parse_arch_list(["sm120,sm999"])


@pytest.mark.parametrize(("cc", "text"), [((12, 0), "12.0"), ((8, 6), "8.6"), ((10, 3), "10.3")])
def test_cc_text_is_nvidias_spelling(cc: tuple[int, int], text: str) -> None:
    assert cc_text(cc) == text
    if (arch := arch_for_cc(cc)) is not None:
        assert arch.cc_str == text and parse_arch(text) is arch
