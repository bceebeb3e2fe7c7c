"""A recipe's pins, proved against the released metadata of the SGLang wheel it pins.

SGLang's Requires-Dist names the sglang-kernel, torch and flashinfer-python versions it runs with; the
sglang-kernel wheel's own metadata names the torch it was built against and, in its Project-URL, the
folder of the sglang repository it is built from. Every pin in the recipe that mirrors one of these is a
row: the recipe's value, the value the metadata requires, ok or not. `bump` rewrites the recipe text to
the required values, line by line, so comments and layout survive and the diff is reviewable.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from bwstack.errors import RecipeError
from bwstack.recipes.recipe import Recipe
from bwstack.recipes.registry import Target, WheelMetadata
from bwstack.report import Check, Report, Status

Fetch = Callable[[str, str], WheelMetadata | None]
SGLANG = "sglang"
KERNEL = "sglang-kernel"
# Recipe field -> the package whose version it pins, as SGLang's Requires-Dist names it.
REQUIRED_BY_SGLANG = {"sgl_kernel.version": KERNEL, "torch.version": "torch", "sglang.flashinfer": "flashinfer-python"}
_GITHUB_TREE = re.compile(r"^/(?P<owner>[^/]+)/(?P<repo>[^/]+)/tree/[^/]+/(?P<path>.+?)/?$")


@dataclass(frozen=True)
class Pin:
    """One recipe value checked against what the released metadata requires."""

    name: str  # the recipe field ("sgl_kernel.version") or, for a wheel's existence, "<package>==<version> wheel"
    recipe: str
    required: str
    source: str  # where `required` was read
    ok: bool
    fix: str | None = None  # the value to write into the recipe field, when one value is right
    field: str = ""  # the recipe field `fix` goes to (default: name)

    @property
    def finding(self) -> str:
        if self.name.endswith(" wheel"):
            return f"for {self.recipe}: {self.required}"
        return f"recipe {self.recipe} | required {self.required} | {'ok' if self.ok else 'MISMATCH'}"

    @property
    def remedy(self) -> str | None:
        if self.ok:
            return None
        if self.fix is not None:
            return f'set {self.field or self.name} = "{self.fix}" in the recipe (or run invoke pins --bump-sglang)'
        return f"pick a release that publishes a wheel for {self.recipe}, or change the recipe's python/base"


def _field(recipe: Recipe, name: str) -> str:
    section, key = name.split(".")
    return str(getattr(getattr(recipe, section), key))


def _against(name: str, recipe_value: str, requirement: Requirement | None, source: str) -> Pin:
    """A version pin against a requirement: ok when the recipe's version satisfies it."""
    if requirement is None:
        return Pin(name, recipe_value, "(not required)", source, True)
    spec: SpecifierSet = requirement.specifier
    exact = [s.version for s in spec if s.operator == "==" and "*" not in s.version]
    required = exact[0] if len(exact) == 1 and len(spec) == 1 else (str(spec) or "any")
    try:
        ok = spec.contains(Version(recipe_value), prereleases=True)
    except InvalidVersion:
        ok = False
    return Pin(name, recipe_value, required, source, ok, fix=exact[0] if len(exact) == 1 else None)


def _wheel(package: str, version: str, target: Target, found: WheelMetadata | None) -> Pin:
    """Is there a wheel of the release for the target? Without one nothing in it can be read, and no recipe
    value fixes that."""
    shown = found.filename if found else "none published"
    return Pin(f"{package}=={version} wheel", target.label, shown, "registry", found is not None)


def source_folder(kernel: WheelMetadata) -> tuple[str, str]:
    """(repository URL, folder) from the kernel wheel's Homepage: github.com/<owner>/<repo>/tree/<ref>/<path>."""
    homepage = kernel.project_urls.get("Homepage", "")
    parts = urlsplit(homepage)
    match = _GITHUB_TREE.match(parts.path) if parts.netloc == "github.com" else None
    if not match:
        return "", ""
    return f"https://github.com/{match['owner']}/{match['repo']}.git", match["path"]


def resolve(recipe: Recipe, target: Target, fetch: Fetch) -> list[Pin]:
    """Every pin of the recipe against the released metadata of its SGLang (and that SGLang's kernel)."""
    if recipe.sglang is None or recipe.sgl_kernel is None or recipe.torch is None or recipe.python is None:
        raise RecipeError(f"{recipe.path}: recipe {recipe.name} pins no SGLang stack ([sglang], [sgl_kernel], [torch])")
    version = recipe.sglang.version
    sglang = fetch(SGLANG, version)
    if sglang is None:
        return [_wheel(SGLANG, version, target, None)]
    where = f"{sglang.filename} Requires-Dist"
    pins = [_wheel(SGLANG, version, target, sglang)]
    python_spec = SpecifierSet(sglang.requires_python)
    pins.append(
        Pin(
            "python.version",
            recipe.python.version,
            str(python_spec) or "any",
            f"{sglang.filename} Requires-Python",
            python_spec.contains(f"{recipe.python.version}.0", prereleases=True),
        )
    )
    for name, package in REQUIRED_BY_SGLANG.items():
        pins.append(_against(name, _field(recipe, name), sglang.requirement(package, target), where))
    tag = f"v{version}"
    pins.append(
        Pin("sgl_kernel.ref", recipe.sgl_kernel.ref, tag, "the SGLang release tag", recipe.sgl_kernel.ref == tag, tag)
    )
    needed = sglang.requirement(KERNEL, target)
    pinned = [s.version for s in needed.specifier if s.operator == "=="] if needed else []
    if len(pinned) != 1:
        return pins  # no single kernel release to read: the kernel row above already says so
    kernel = fetch(KERNEL, pinned[0])
    pins.append(_wheel(KERNEL, pinned[0], target, kernel))
    if kernel is None:
        return pins
    repo, folder = source_folder(kernel)
    homepage = f"{kernel.filename} Project-URL Homepage"
    shown = folder or f"(unreadable: {kernel.project_urls.get('Homepage', 'no Homepage')})"
    subdir = recipe.sgl_kernel.subdir
    pins.append(Pin("sgl_kernel.subdir", subdir, shown, homepage, subdir == folder, folder or None))
    if repo:
        pins.append(
            Pin("sgl_kernel.repo", recipe.sgl_kernel.repo, repo, homepage, recipe.sgl_kernel.repo == repo, repo)
        )
    built_with = _against("torch.version", recipe.torch.version, kernel.requirement("torch", target), "")
    pins.append(
        dataclasses.replace(
            built_with,
            name=f"torch.version ({KERNEL})",
            field="torch.version",
            source=f"{kernel.filename} Requires-Dist",
        )
    )
    return pins


def fixes(pins: list[Pin]) -> dict[str, str]:
    """Recipe field -> value for every pin that is wrong and has one right value."""
    return {p.field or p.name: p.fix for p in pins if not p.ok and p.fix is not None}


def bump(text: str, values: dict[str, str]) -> str:
    """Set `section.key = "value"` lines of a recipe's TOML text, keeping every comment and the layout.
    Only existing string keys are rewritten; a key the text lacks is a RecipeError (nothing is invented)."""
    lines = text.splitlines(keepends=True)
    for name, value in values.items():
        section, key = name.split(".")
        current = ""
        hits = 0
        for index, line in enumerate(lines):
            header = re.match(r"^\s*\[([^\]]+)\]\s*(?:#.*)?$", line)
            if header:
                current = header.group(1).strip()
                continue
            match = re.match(rf'^(\s*{re.escape(key)}\s*=\s*)"[^"]*"(.*)$', line, flags=re.DOTALL)
            if current == section and match:
                lines[index] = f'{match.group(1)}"{value}"{match.group(2)}'
                hits += 1
        if hits != 1:
            raise RecipeError(f'cannot set {name}: the recipe needs exactly one line {key} = "..." in [{section}]')
    return "".join(lines)


def pins_report(recipe: Recipe, target: Target, fetch: Fetch) -> Report:
    """`invoke pins`: one check per pin, recipe value | required | ok; exit 1 when any pin disagrees."""
    return to_report(recipe, target, resolve(recipe, target, fetch))


def to_report(recipe: Recipe, target: Target, pins: list[Pin]) -> Report:
    report = Report(kind="pins", subject=f"{recipe.name} ({target.label})")
    for pin in pins:
        report.add(
            Check(
                name=pin.name,
                status=Status.PASS if pin.ok else Status.FAIL,
                finding=pin.finding,
                evidence={"recipe": pin.recipe, "required": pin.required, "source": pin.source},
                remedy=pin.remedy,
            )
        )
    report.data["target"] = {"python": target.python, "platforms": target.platforms}
    report.data["pins"] = [dataclasses.asdict(p) for p in pins]
    return report
