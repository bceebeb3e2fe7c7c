"""pins: prove a recipe's pins against the registry's metadata of the SGLang release it pins, or bump them."""

from __future__ import annotations

from bwstack.cli.program import Context, finish, guarded, setting, task
from bwstack.errors import BwstackError


@task(
    help={
        "recipe": "recipe name under recipes/ or a path to a .toml file (default from invoke.yaml: sglang)",
        "bump_sglang": "move the recipe to this SGLang release: rewrite every pin it implies (comments kept), "
        "then render every arch into --out for review",
        "out": "where --bump-sglang renders <recipe>-<arch>/Dockerfile and build.json (default: build)",
        "refresh": "ask the registry again even for releases already in the wheel cache",
        "json": "write the report as JSON to this file",
        "junit": "write the report as JUnit XML to this file",
    }
)
@guarded
def pins(
    c: Context,
    recipe: str | None = None,
    bump_sglang: str | None = None,
    out: str | None = None,
    refresh: bool = False,
    json: str | None = None,
    junit: str | None = None,
) -> None:
    """Check the recipe's pins against what its SGLang wheel requires (exit 1 names the value to use)."""
    from packaging.version import InvalidVersion, Version

    from bwstack.images.pin_bump import bump_recipe
    from bwstack.recipes.pins import pins_report
    from bwstack.recipes.recipe import load_recipe
    from bwstack.recipes.registry import PipRegistry, cache_dir, target_for

    loaded = load_recipe(setting(c, "recipe", recipe))
    if loaded.sglang is None or loaded.python is None:
        raise BwstackError(
            f"{loaded.path}: recipe {loaded.name} pins no SGLang ([sglang] and [python]): nothing to check"
        )
    target = target_for(loaded.python.version, loaded.base.tag, where=str(loaded.path))
    fetch = PipRegistry(target, cache_dir(), refresh=refresh)
    if bump_sglang:
        try:
            version = str(Version(bump_sglang.strip()))
        except InvalidVersion:
            raise BwstackError(f"--bump-sglang {bump_sglang!r}: not a version (e.g. 0.5.24)") from None
        report = bump_recipe(loaded, version, target, fetch, out=setting(c, "out", out))
    else:
        report = pins_report(loaded, target, fetch)
    finish(report, json=json, junit=junit)
