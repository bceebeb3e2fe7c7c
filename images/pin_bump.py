"""`invoke pins --bump-sglang X`: move a recipe to another SGLang release and render it for review.

The new SGLang's metadata decides every dependent pin (sglang-kernel, torch, flashinfer-python, the
kernel's source folder and tag); the recipe file is rewritten line by line (comments kept), checked by
loading it again, and rendered for every arch it lists, so the change is one reviewable diff.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from bwstack.errors import RecipeError
from bwstack.images.render import render, write
from bwstack.recipes.pins import Fetch, bump, fixes, resolve, to_report
from bwstack.recipes.recipe import Recipe, load_recipe
from bwstack.recipes.registry import Target
from bwstack.report import Report

__all__ = ["bump_recipe"]


def bump_recipe(recipe: Recipe, version: str, target: Target, fetch: Fetch, *, out: str) -> Report:
    """Rewrite `recipe`'s file for SGLang `version`; the report is the pin check of the rewritten recipe.
    Nothing is written when the new release cannot be read for the recipe's target."""
    if recipe.sglang is None or recipe.sgl_kernel is None:
        raise RecipeError(f"{recipe.path}: recipe {recipe.name} pins no SGLang ([sglang] and [sgl_kernel])")
    moved = {"sglang.version": version, "sgl_kernel.ref": f"v{version}"}
    candidate = dataclasses.replace(
        recipe,
        sglang=dataclasses.replace(recipe.sglang, version=version),
        sgl_kernel=dataclasses.replace(recipe.sgl_kernel, ref=moved["sgl_kernel.ref"]),
    )
    pins = resolve(candidate, target, fetch)
    if any(not p.ok and p.fix is None for p in pins):
        return to_report(candidate, target, pins)  # e.g. no wheel for the target: leave the file alone
    values = {**moved, **fixes(pins)}
    original = recipe.path.read_text(encoding="utf-8")
    changed = {
        name: (_current(recipe, name), value) for name, value in values.items() if _current(recipe, name) != value
    }
    _replace(recipe.path, bump(original, values))
    try:
        bumped = load_recipe(str(recipe.path))
    except RecipeError:
        _replace(recipe.path, original)
        raise
    folder = Path(out)
    rendered = [str(write(render(bumped, arch), folder)) for arch in bumped.archs]
    report = to_report(bumped, target, resolve(bumped, target, fetch))
    report.data["bumped"] = {name: {"from": old, "to": new} for name, (old, new) in changed.items()}
    report.data["rendered"] = rendered
    for name, (old, new) in changed.items():
        print(f"pins: {recipe.path.name}: {name} {old} -> {new}")
    return report


def _current(recipe: Recipe, name: str) -> str:
    section, key = name.split(".")
    return str(getattr(getattr(recipe, section), key))


def _replace(path: Path, text: str) -> None:
    """Write through a temporary file, so an interrupted bump never leaves half a recipe."""
    temporary = path.with_name(f".{path.name}.bump")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as error:
        raise RecipeError(f"{path}: cannot rewrite the recipe: {error.strerror or error}") from None
