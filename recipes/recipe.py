"""Recipes: one TOML file per stack, loaded into typed, validated dataclasses.

Validation is strict so a typo fails at load with one line naming the file and field, not three hours
into a build: unknown keys are errors, every value is type-checked, archs are checked against the
recipe's CUDA version using the one arch table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import string
import tomllib
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from bwstack.errors import ArchError, RecipeError
from bwstack.recipes.archs import Arch, parse_arch, parse_arch_list

RECIPES_DIR = Path(__file__).resolve().parent
SCHEMA_VERSION = 1
SERVE_PLACEHOLDERS = frozenset({"model", "host", "port"})


@dataclass(frozen=True)
class BaseImage:
    image: str
    tag: str = ""
    digest: str = ""

    @property
    def ref(self) -> str:
        """What FROM names: image[:tag][@digest]."""
        ref = self.image + (f":{self.tag}" if self.tag else "")
        return ref + (f"@{self.digest}" if self.digest else "")


@dataclass(frozen=True)
class PythonSpec:
    version: str


@dataclass(frozen=True)
class TorchSpec:
    version: str
    index_url: str


@dataclass(frozen=True)
class SglKernelSpec:
    import_name: str
    repo: str
    ref: str
    subdir: str
    version: str
    build_requires: list[str]
    max_jobs: int
    nvcc_threads: int


@dataclass(frozen=True)
class SglangSpec:
    version: str
    flashinfer: str = ""  # the flashinfer-python version this SGLang pins; `invoke pins` checks it


@dataclass(frozen=True)
class DemoSpec:
    """A stand-in stack that builds anywhere Docker runs: FROM scratch, busybox and a fixture package."""

    package: str  # folder under images/demo/packages holding an sgl_kernel-shaped package
    busybox: str = "/bin/busybox"  # a statically linked busybox (Debian's busybox-static)
    server: str = "demo/server"  # under the images stage's package data


@dataclass(frozen=True)
class ServeSpec:
    engine: str
    model: str
    tp: int
    port: int
    trust_remote_code: bool = False
    tool_call_parser: str = ""
    reasoning_parser: str = ""
    extra_args: list[str] = field(default_factory=list)
    # A server command of its own instead of the engine's launcher; {model}, {host}, {port} are filled in.
    command: list[str] = field(default_factory=list)


# SGLang 0.5.23's --speculative-algorithm takes free text; its help names these (docs/bench.md).
SPECULATIVE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO"})


@dataclass(frozen=True)
class SpeculativeSpec:
    """Speculative decoding for the recipe's SGLang server; `invoke spec-check` measures whether it pays."""

    algorithm: str
    draft_model: str = ""  # a path or hub id; `spec-check --draft DIR` overrides it
    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4
    enabled: bool = True  # false keeps the table (for spec-check and the advisor) but serves without a drafter

    def sglang_args(self) -> list[str]:
        args = ["--speculative-algorithm", self.algorithm]
        if self.draft_model:
            args += ["--speculative-draft-model-path", self.draft_model]
        args += ["--speculative-num-steps", str(self.num_steps), "--speculative-eagle-topk", str(self.eagle_topk)]
        return [*args, "--speculative-num-draft-tokens", str(self.num_draft_tokens)]


@dataclass(frozen=True)
class Recipe:
    schema: int
    name: str
    description: str
    template: str
    archs: list[str]
    base: BaseImage
    serve: ServeSpec
    cuda: str = ""  # only needed when the base tag does not start with the CUDA version (FROM scratch)
    python: PythonSpec | None = None
    torch: TorchSpec | None = None
    sgl_kernel: SglKernelSpec | None = None
    sglang: SglangSpec | None = None
    demo: DemoSpec | None = None
    speculative: SpeculativeSpec | None = None
    # Set by the loader, never by the TOML file.
    path: Path = field(default=Path(), compare=False, metadata={"derived": True})
    digest: str = field(default="", compare=False, metadata={"derived": True})  # sha256 of the parsed TOML

    @property
    def cuda_version(self) -> Version:
        text = self.cuda or _cuda_from_tag(self.base.tag)
        return Version(text)

    @property
    def supported_archs(self) -> list[Arch]:
        return [parse_arch(name) for name in self.archs]

    def resolve_archs(self, values: str | Iterable[str | Arch]) -> list[Arch]:
        """`--arch` values (any spelling, repeats, commas; `all` = this recipe's archs), each checked by
        resolve_arch."""
        return [self.resolve_arch(arch) for arch in parse_arch_list(values, self.archs)]

    def resolve_arch(self, text: str | Arch) -> Arch:
        """The table row for `text`, if this recipe builds for it; RecipeError/ArchError otherwise."""
        arch = text if isinstance(text, Arch) else parse_arch(text)
        if not arch.supported_by(self.cuda_version):
            raise RecipeError(
                f"{self.path}: {arch.name} ({arch.build_target}) needs CUDA >= {arch.min_cuda()}, "
                f"recipe {self.name} uses CUDA {self.cuda_version}",
                remedy=f"pick one of {', '.join(self.archs)} or raise the recipe's CUDA version",
            )
        if arch.name not in self.archs:
            raise RecipeError(
                f"{self.path}: recipe {self.name} does not build {arch.name}; it builds {', '.join(self.archs)}",
                remedy=f"add {arch.name!r} to archs in {self.path.name}",
            )
        return arch

    def serve_command(
        self, model_path: str, *, host: str, port: int, speculative: SpeculativeSpec | bool | None = None
    ) -> list[str]:
        """The server command line for this recipe's engine and serving defaults.

        `speculative`: None serves as the recipe says ([speculative] if it has one), False without a
        drafter, a SpeculativeSpec with that one (spec-check's base and speculative runs)."""
        if self.serve.command:
            values = {"model": model_path, "host": host, "port": str(port)}
            return [part.format(**values) for part in self.serve.command]
        if self.serve.engine != "sglang":
            raise RecipeError(f"{self.path}: serve.engine {self.serve.engine!r} has no command builder")
        command = ["python3", "-m", "sglang.launch_server", "--model-path", model_path]
        command += ["--tp", str(self.serve.tp), "--host", host, "--port", str(port)]
        # Prometheus /metrics is off by default in SGLang; bench reads throughput and acceptance there.
        command.append("--enable-metrics")
        if self.serve.trust_remote_code:
            command.append("--trust-remote-code")
        if self.serve.tool_call_parser:
            command += ["--tool-call-parser", self.serve.tool_call_parser]
        if self.serve.reasoning_parser:
            command += ["--reasoning-parser", self.serve.reasoning_parser]
        spec = self.speculative if speculative is None or speculative is True else speculative or None
        if spec is not None and (spec.enabled or speculative is not None):
            command += spec.sglang_args()
        return command + list(self.serve.extra_args)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # Relative to the repo so build.json is the same in every clone.
        data["path"] = (
            str(self.path.relative_to(RECIPES_DIR.parent))
            if self.path.is_relative_to(RECIPES_DIR.parent)
            else str(self.path)
        )
        data["cuda_version"] = str(self.cuda_version)
        return data


def _cuda_from_tag(tag: str) -> str:
    match = re.match(r"^(\d+\.\d+(?:\.\d+)?)-", tag)
    return match.group(1) if match else ""


def available_recipes(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    return sorted(p.stem for p in recipes_dir.glob("*.toml"))


def recipe_path(name: str, recipes_dir: Path = RECIPES_DIR) -> Path:
    """A recipe by name (recipes/<name>.toml) or by path to a .toml file."""
    as_path = Path(name)
    if as_path.suffix == ".toml":
        if not as_path.is_file():
            raise RecipeError(f"{as_path}: recipe file not found")
        return as_path
    candidate = recipes_dir / f"{name}.toml"
    if not candidate.is_file():
        known = ", ".join(available_recipes(recipes_dir)) or "none"
        raise RecipeError(f"unknown recipe {name!r}: {recipes_dir} holds {known}")
    return candidate


def load_recipe(name: str, recipes_dir: Path = RECIPES_DIR) -> Recipe:
    """Load and validate one recipe. Every problem is a RecipeError naming the file and field."""
    path = recipe_path(name, recipes_dir)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"{path}: TOML syntax error: {error}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RecipeError(f"{path}: cannot read recipe: {error}") from None
    recipe = _build(Recipe, raw, path, prefix="")
    digest = hashlib.sha256(json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    recipe = dataclasses.replace(recipe, path=path, digest=digest)
    _check_semantics(recipe, path)
    return recipe


def _check_semantics(recipe: Recipe, path: Path) -> None:
    if recipe.schema != SCHEMA_VERSION:
        raise RecipeError(f"{path}: field schema: version {recipe.schema} is not supported (expected 1)")
    if recipe.name != path.stem:
        raise RecipeError(f"{path}: field name: {recipe.name!r} must match the file name {path.stem!r}")
    if not recipe.archs:
        raise RecipeError(f"{path}: field archs: list at least one arch")
    try:
        cuda = recipe.cuda_version
    except InvalidVersion:
        raise RecipeError(
            f'{path}: field cuda: cannot tell the CUDA version (set cuda = "13.1" or use a base tag '
            f"like 13.1.0-devel-ubuntu24.04)"
        ) from None
    for index, name in enumerate(recipe.archs):
        try:
            arch = parse_arch(name)
        except ArchError as error:
            raise RecipeError(f"{path}: field archs[{index}]: {error.message}") from None
        if not arch.supported_by(cuda):
            raise RecipeError(
                f"{path}: field archs[{index}]: {arch.name} ({arch.build_target}) needs CUDA >= "
                f"{arch.min_cuda()}, recipe uses CUDA {cuda}"
            )
    if recipe.base.digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", recipe.base.digest):
        raise RecipeError(f"{path}: field base.digest: expected sha256:<64 hex>, got {recipe.base.digest!r}")
    if recipe.serve.tp < 1 or not 0 < recipe.serve.port < 65536:
        raise RecipeError(f"{path}: field serve: tp must be >= 1 and port in 1..65535")
    for index, part in enumerate(recipe.serve.command):
        try:
            fields = {name for _text, name, _spec, _conv in string.Formatter().parse(part) if name is not None}
        except ValueError as error:
            raise RecipeError(f"{path}: field serve.command[{index}]: {error} in {part!r}") from None
        unknown = fields - SERVE_PLACEHOLDERS
        if unknown:
            raise RecipeError(
                f"{path}: field serve.command[{index}]: unknown placeholder {{{sorted(unknown)[0]}}} "
                f"(known: {', '.join('{' + n + '}' for n in sorted(SERVE_PLACEHOLDERS))})"
            )
    _check_speculative(recipe.speculative, path)
    if recipe.sgl_kernel and (recipe.sgl_kernel.max_jobs < 1 or recipe.sgl_kernel.nvcc_threads < 1):
        raise RecipeError(f"{path}: field sgl_kernel: max_jobs and nvcc_threads must be >= 1")


def _check_speculative(spec: SpeculativeSpec | None, path: Path) -> None:
    if spec is None:
        return
    if spec.algorithm not in SPECULATIVE_ALGORITHMS:
        raise RecipeError(
            f"{path}: field speculative.algorithm: {spec.algorithm!r} is not one of "
            f"{', '.join(sorted(SPECULATIVE_ALGORITHMS))}"
        )
    if spec.algorithm in ("EAGLE", "EAGLE3", "STANDALONE") and not spec.draft_model:
        raise RecipeError(f"{path}: field speculative.draft_model: {spec.algorithm} needs a draft model")
    for name in ("num_steps", "eagle_topk", "num_draft_tokens"):
        if getattr(spec, name) < 1:
            raise RecipeError(f"{path}: field speculative.{name}: must be >= 1, got {getattr(spec, name)}")
    if spec.eagle_topk == 1 and spec.num_draft_tokens != spec.num_steps + 1:
        raise RecipeError(
            f"{path}: field speculative.num_draft_tokens: with eagle_topk 1 SGLang sets it to num_steps + 1 "
            f"= {spec.num_steps + 1} whatever is asked, got {spec.num_draft_tokens}"
        )


def _build(cls: type, raw: Any, path: Path, prefix: str) -> Any:
    """Construct dataclass `cls` from a TOML table, checking keys and value types."""
    where = prefix.rstrip(".") or "top level"
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: field {where}: expected a table, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    settable = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("derived")}
    unknown = sorted(set(raw) - settable.keys())
    if unknown:
        raise RecipeError(f"{path}: field {prefix}{unknown[0]}: unknown field (known: {', '.join(settable)})")
    values: dict[str, Any] = {}
    for name, spec in settable.items():
        key = f"{prefix}{name}"
        if name not in raw:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise RecipeError(f"{path}: field {key}: missing (required)")
            continue
        values[name] = _convert(hints[name], raw[name], path, key)
    return cls(**values)


_SCALARS: dict[type, str] = {str: "string", int: "integer", bool: "boolean"}


def _convert(hint: Any, value: Any, path: Path, key: str) -> Any:
    if isinstance(hint, types.UnionType):  # `X | None`: a section that may be absent
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, prefix=f"{key}.")
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise RecipeError(f"{path}: field {key}: expected a list of {_SCALARS[item]}s, got {value!r}")
        return [_convert(item, entry, path, f"{key}[{i}]") for i, entry in enumerate(value)]
    # bool is a subclass of int in Python; TOML keeps them apart, and so do we.
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise RecipeError(f"{path}: field {key}: expected {_SCALARS[hint]}, got {type(value).__name__} {value!r}")
    return value
