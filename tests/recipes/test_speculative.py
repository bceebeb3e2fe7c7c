"""The [speculative] recipe table: validation, the SGLang flags it renders, and those flags against SGLang 0.5.23."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from bwstack.errors import RecipeError
from bwstack.recipes import load_recipe
from bwstack.recipes.recipe import SPECULATIVE_ALGORITHMS
from tests.paths import REPO
from tests.released import released_wheel

BASE = (REPO / "recipes" / "sglang.toml").read_text(encoding="utf-8")
TABLE = """
[speculative]
algorithm = "EAGLE3"
draft_model = "/models/kimi-eagle3"
num_steps = 3
eagle_topk = 1
num_draft_tokens = 4
"""


def recipe_with(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "sglang.toml"
    path.write_text(BASE + table, encoding="utf-8")
    return path


def flags_of(command: list[str]) -> list[str]:
    return [part for part in command if part.startswith("--")]


def test_the_table_becomes_sglang_flags_and_spec_check_can_turn_it_off(tmp_path: Path) -> None:
    recipe = load_recipe(str(recipe_with(tmp_path, TABLE)))
    assert recipe.speculative is not None and recipe.speculative.draft_model == "/models/kimi-eagle3"
    command = recipe.serve_command("/m", host="127.0.0.1", port=9)
    joined = " ".join(command)
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path /models/kimi-eagle3" in joined
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in joined
    assert "--enable-metrics" in command
    off = recipe.serve_command("/m", host="127.0.0.1", port=9, speculative=False)
    assert "--enable-metrics" in off and not any(f.startswith("--speculative") for f in off)
    assert load_recipe("sglang").speculative is None  # optional: the shipped recipe does not speculate
    disabled = load_recipe(str(recipe_with(tmp_path, TABLE + "enabled = false\n")))
    assert not any(f.startswith("--speculative") for f in disabled.serve_command("/m", host="h", port=1))
    assert recipe.speculative is not None
    forced = disabled.serve_command("/m", host="h", port=1, speculative=recipe.speculative)
    assert "--speculative-algorithm" in forced  # spec-check's speculative run, whatever `enabled` says


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[speculative]\nalgorithm = "MEDUSA"\n', "speculative.algorithm: 'MEDUSA' is not one of"),
        ('[speculative]\nalgorithm = "EAGLE3"\n', "speculative.draft_model: EAGLE3 needs a draft model"),
        (TABLE.replace("num_steps = 3", "num_steps = 0"), "speculative.num_steps: must be >= 1"),
        (TABLE.replace("num_draft_tokens = 4", "num_draft_tokens = 8"), "SGLang sets it to num_steps + 1 = 4"),
        (TABLE.replace("eagle_topk = 1", 'eagle_topk = "1"'), "speculative.eagle_topk: expected integer"),
        (TABLE + "draft_tokens = 3\n", "speculative.draft_tokens: unknown field"),
    ],
)
def test_a_bad_table_is_refused_at_load(tmp_path: Path, table: str, message: str) -> None:
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_recipe(str(recipe_with(tmp_path, table)))


def _sglang_fields() -> tuple[set[str], str]:
    """Every annotated field of SGLang's argument groups as its CLI flag, and spec.py's text."""
    flags: set[str] = set()
    spec_text = ""
    with zipfile.ZipFile(released_wheel("sglang", "0.5.23")) as wheel:
        for member in wheel.namelist():
            if member.startswith("sglang/srt/arg_groups/fields/") and member.endswith(".py"):
                text = wheel.read(member).decode()
                flags |= {"--" + name.replace("_", "-") for name in re.findall(r"^    (\w+): A\[", text, re.M)}
                if member.endswith("/spec.py"):
                    spec_text = text
    return flags, spec_text


def test_the_rendered_flags_and_algorithms_exist_in_sglang_0_5_23(tmp_path: Path) -> None:
    flags, spec_text = _sglang_fields()
    command = load_recipe(str(recipe_with(tmp_path, TABLE))).serve_command("/m", host="h", port=1)
    added = [f for f in flags_of(command) if f.startswith("--speculative") or f == "--enable-metrics"]
    assert len(added) == 6 and set(added) <= flags, set(added) - flags
    builtins = re.search(r"Builtins: ([A-Z0-9_, ]+)\.", spec_text)
    assert builtins is not None
    assert {name.strip() for name in builtins.group(1).split(",")} == SPECULATIVE_ALGORITHMS
