"""Render a recipe for one arch into a Dockerfile plus a build manifest (build.json).

Jinja2 with StrictUndefined: a template that names a field the recipe lacks fails loudly at render,
not as an empty string in a Dockerfile. Every partial is wrapped in `# === BEGIN name ===` markers so
a line of rendered output can be traced back to its template. Output is a pure function of the
recipe, the arch, the templates and the build args: the same inputs give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from bwstack.errors import RenderError
from bwstack.images.sizing import decide_build_args
from bwstack.inputs import writing
from bwstack.recipes.archs import Arch
from bwstack.recipes.kernel_build import KernelBuild, plan
from bwstack.recipes.recipe import Recipe
from bwstack.templating import strict_environment

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
# Package data of the images stage (templates, the demo stack's server and packages): found beside this
# module both in a checkout and in an installed wheel.
IMAGES_DIR = Path(__file__).resolve().parent
LABEL_PREFIX = "io.bwstack"


@dataclass(frozen=True)
class ImageTag:
    """An image reference kept as its parts until printed: Docker's tag and push APIs take them apart."""

    repo: str
    tag: str

    def __str__(self) -> str:
        return f"{self.repo}:{self.tag}"


@dataclass(frozen=True)
class RenderedImage:
    """A rendered Dockerfile and everything a build needs to know about it."""

    recipe: Recipe
    arch: Arch
    dockerfile: str
    build_args: dict[str, str]
    labels: dict[str, str]
    content_digest: str  # sha256 over recipe, arch and templates: names the image's content
    repo: str
    context_files: dict[str, str] = field(default_factory=dict)  # context path -> source path (demo stacks)
    kernel_build: KernelBuild | None = None  # the sgl-kernel compile's CMake options and gencode targets

    @property
    def content_image_tag(self) -> ImageTag:
        """The content tag: <repo>:<recipe>-<arch>-cuda<ver>-<12 hex>."""
        cuda = self.recipe.cuda_version
        return ImageTag(
            self.repo, f"{self.recipe.name}-{self.arch.name}-cuda{cuda.major}.{cuda.minor}-{self.content_digest[:12]}"
        )

    @property
    def moving_image_tag(self) -> ImageTag:
        """<repo>:<recipe>-<arch>, moved to each new gated build."""
        return ImageTag(self.repo, f"{self.recipe.name}-{self.arch.name}")

    @property
    def tag(self) -> str:
        return str(self.content_image_tag)

    @property
    def moving_tag(self) -> str:
        return str(self.moving_image_tag)

    @property
    def dirname(self) -> str:
        return f"{self.recipe.name}-{self.arch.name}"

    def manifest(self) -> dict[str, Any]:
        extra = {"sgl_kernel_build": self.kernel_build.manifest()} if self.kernel_build else {}
        return {
            **extra,
            "recipe": self.recipe.to_dict(),
            "arch": {
                "name": self.arch.name,
                "cc": self.arch.cc_str,
                "build_target": self.arch.build_target,
                "gencode": self.arch.gencode,
            },
            "build_args": self.build_args,
            "labels": self.labels,
            "content_digest": self.content_digest,
            "tag": self.tag,
            "moving_tag": self.moving_tag,
            "context_files": self.context_files,
        }


# Docker's reference grammar for a repository: [host[:port]/]path, path components lowercase alphanumerics
# joined by one '.', one or two '_', or any number of '-'.
_REPOSITORY = re.compile(
    r"^(?:(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:\.|_{1,2}|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_{1,2}|-+)[a-z0-9]+)*)*$"
)


def check_repository(repo: str) -> None:
    """Refuse a repository Docker would refuse, before hours of building, not at the final tag."""
    if len(repo) > 255 or not _REPOSITORY.match(repo):
        raise RenderError(
            f"image repository {repo!r} is not a valid Docker repository name",
            remedy="use lowercase [registry-host[:port]/]path, e.g. registry.example.com/ml/bwstack",
        )


def _environment() -> jinja2.Environment:
    env = strict_environment(TEMPLATES_DIR)

    @jinja2.pass_context
    def partial(context: jinja2.runtime.Context, name: str, **extra: Any) -> str:
        body = env.get_template(f"partials/{name}.j2").render({**context.get_all(), **extra})
        return f"# === BEGIN {name} ===\n{body.rstrip()}\n# === END {name} ==="

    env.globals["partial"] = partial
    return env


def _require_sections(recipe: Recipe) -> Any:
    """A template global: `{{ require("torch", ...) }}` fails naming every recipe section it lacks."""

    def require(*sections: str) -> str:
        missing = [name for name in sections if getattr(recipe, name, None) is None]
        if missing:
            raise RenderError(
                f"{recipe.path}: template {recipe.template} needs recipe section(s) "
                f"{', '.join(f'[{name}]' for name in missing)}, which the recipe lacks"
            )
        return ""

    return require


def template_files(template: str) -> list[Path]:
    """The files that can shape an image: its own template and every partial (not e.g. fleet manifests)."""
    return [TEMPLATES_DIR / template, *sorted((TEMPLATES_DIR / "partials").glob("*.j2"))]


def content_digest(recipe: Recipe, arch: Arch, context_files: dict[str, str] | None = None) -> str:
    """sha256 of what decides an image's content: the parsed recipe, the arch, every template and the
    files copied into the build context (a demo stack's package and server)."""
    digest = hashlib.sha256()
    digest.update(recipe.digest.encode())
    digest.update(arch.name.encode())
    for path in template_files(recipe.template):
        if not path.is_file():
            continue  # a missing main template is reported by render() with the recipe field named
        digest.update(path.relative_to(TEMPLATES_DIR).as_posix().encode())
        digest.update(path.read_bytes())
    for name, shown in sorted((context_files or {}).items()):
        root = Path(shown) if Path(shown).is_absolute() else IMAGES_DIR / shown
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts:
                continue
            digest.update(f"{name}/{path.relative_to(root).as_posix()}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def image_labels(recipe: Recipe, arch: Arch, digest: str) -> dict[str, str]:
    cuda = str(recipe.cuda_version)
    return {
        "org.opencontainers.image.title": f"bwstack {recipe.name} for {arch.name}",
        "org.opencontainers.image.description": recipe.description,
        "org.opencontainers.image.version": f"{recipe.name}-{arch.name}-cuda{cuda}-{digest[:12]}",
        "org.opencontainers.image.base.name": recipe.base.ref,
        f"{LABEL_PREFIX}.recipe": recipe.name,
        f"{LABEL_PREFIX}.recipe.digest": f"sha256:{recipe.digest}",
        f"{LABEL_PREFIX}.content.digest": f"sha256:{digest}",
        f"{LABEL_PREFIX}.arch": arch.name,
        f"{LABEL_PREFIX}.cc": arch.cc_str,
        f"{LABEL_PREFIX}.sass-target": arch.build_target,
        f"{LABEL_PREFIX}.cuda": cuda,
    }


def render(
    recipe: Recipe,
    arch_text: str | Arch,
    *,
    repo: str = "bwstack",
    build_args: dict[str, str] | None = None,
) -> RenderedImage:
    """Render `recipe` for one arch. Raises RecipeError/ArchError for bad input, RenderError for templates."""
    check_repository(repo)
    arch = recipe.resolve_arch(arch_text)
    context_files = _context_files(recipe)
    digest = content_digest(recipe, arch, context_files)
    args = {**decide_build_args(recipe), **(build_args or {})}  # the Dockerfile's ARG defaults
    for key, value in args.items():
        if not str(value).isdigit() or int(value) < 1:
            raise RenderError(f"build arg {key}={value!r}: expected a whole number >= 1")
    labels = image_labels(recipe, arch, digest)
    serve_command = recipe.serve_command("/model", host="0.0.0.0", port=recipe.serve.port)
    kernel_build = plan(arch, recipe.cuda_version) if recipe.sgl_kernel else None
    values = {
        "kernel_build": kernel_build,
        "recipe": recipe,
        "arch": arch,
        "build_args": args,
        "labels": labels,
        "serve_command": serve_command,
        "context_files": context_files,
        "require": _require_sections(recipe),
    }
    try:
        text = _environment().get_template(recipe.template).render(values)
    except jinja2.TemplateNotFound as error:
        raise RenderError(f"{recipe.path}: field template: no template {error.name!r} under {TEMPLATES_DIR}") from None
    except jinja2.UndefinedError as error:
        raise RenderError(
            f"{recipe.path}: template {recipe.template} needs a value the recipe lacks: {error}"
        ) from None
    except jinja2.TemplateError as error:
        raise RenderError(f"{TEMPLATES_DIR / recipe.template}: template error: {error}") from None
    return RenderedImage(recipe, arch, text, args, labels, digest, repo, context_files, kernel_build)


def _context_files(recipe: Recipe) -> dict[str, str]:
    """Files a demo stack copies into its build context: name in the context -> path on this host."""
    if recipe.demo is None:
        return {}
    wanted = {
        "package": IMAGES_DIR / "demo" / "packages" / recipe.demo.package,
        "server": IMAGES_DIR / recipe.demo.server,
        "busybox": Path(recipe.demo.busybox),
    }
    for name, path in wanted.items():
        if not path.exists():
            hint = " (apt-get install busybox-static)" if name == "busybox" else ""
            raise RenderError(f"{recipe.path}: field demo.{name}: {path} does not exist{hint}")
    return {name: _shown(path) for name, path in wanted.items()}


def _shown(path: Path) -> str:
    """Package data is recorded relative to the images stage, so build.json is the same in every clone and
    every installation."""
    return path.relative_to(IMAGES_DIR).as_posix() if path.is_relative_to(IMAGES_DIR) else str(path)


def write(rendered: RenderedImage, out: Path) -> Path:
    """Write <out>/<recipe>-<arch>/Dockerfile and build.json; return the Dockerfile's path."""
    folder = out / rendered.dirname
    dockerfile = folder / "Dockerfile"
    manifest = json.dumps(rendered.manifest(), indent=2, sort_keys=True) + "\n"
    with writing(folder, error=RenderError, remedy="pass --out a writable folder"):
        folder.mkdir(parents=True, exist_ok=True)
        dockerfile.write_text(rendered.dockerfile, encoding="utf-8")
        (folder / "build.json").write_text(manifest, encoding="utf-8")
    return dockerfile
