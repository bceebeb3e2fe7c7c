"""The lines a released wheel's code can log, rendered from its source (zipfile + ast, nothing imported).

Every logging call (`logger.info(...)`, `info_once`, `log_info_on_rank0(logger, ...)`, `print`), every tqdm
description (`desc=...`, `set_description(...)`) and its bar (rendered by the real tqdm with the call's
`bar_format`) becomes one or more sample lines: f-string fields and %-formats get sample values, except
that a field naming a local or module string (`capture_name = f"{role} decode"`, a dict of names) is
resolved to each value it can take. The result is cached beside the wheels, keyed by the wheel and this
file's text, so only the first run parses.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import re
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception"}
_LOG_METHODS |= {f"{m}_once" for m in _LOG_METHODS}
_RANK0 = {"log_info_on_rank0", "print_info_once", "print_warning_once"}
_PREFILTER = re.compile(rb"\.(?:info|warning|debug|error)(?:_once)?\(|log_info_on_rank0|desc=|set_description|print\(")
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.\d+)?([diouxXeEfFgGcrsa%])")
_CAP = 32  # variants per expression: enough for role x graph x backend names


@dataclass(frozen=True)
class Rendered:
    text: str
    where: str  # path:line in the wheel

    def to_list(self) -> list[str]:
        return [self.text, self.where]


def _sample(spec: str) -> str:
    """A sample value for a field with this format spec ('.2f' -> '1.50'); '1' when unknown."""
    kind = spec[-1:] if spec else ""
    try:
        if kind in "eEfFgG%" and kind:
            return format(1.5, spec)
        if kind in "dxXob" and kind:
            return format(1, spec)
        return format("1", spec) if spec else "1"
    except (ValueError, TypeError):
        return "1"


class _Renderer:
    def __init__(self, constants: dict[str, list[ast.expr]]) -> None:
        self.constants = constants  # module-level NAME = <expr>, over the whole wheel

    def values(self, node: ast.expr, env: dict[str, list[ast.expr]], depth: int = 0) -> list[str] | None:
        """Every string `node` can evaluate to (capped), or None when it is not a string we can follow."""
        if depth > 6:
            return None
        if isinstance(node, ast.Constant):
            return [node.value] if isinstance(node.value, str) else [str(node.value)]
        if isinstance(node, ast.JoinedStr):
            parts = [self._part(p, env, depth) for p in node.values]
            return ["".join(combo) for combo in itertools.islice(itertools.product(*parts), _CAP)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.values(node.left, env, depth + 1), self.values(node.right, env, depth + 1)
            if left is None or right is None:
                return None
            return [a + b for a, b in itertools.islice(itertools.product(left, right), _CAP)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            left = self.values(node.left, env, depth + 1)
            return None if left is None else [percent(text) for text in left]
        if isinstance(node, ast.IfExp):
            body, orelse = self.values(node.body, env, depth + 1), self.values(node.orelse, env, depth + 1)
            return (body or []) + (orelse or []) or None
        if isinstance(node, ast.Name):
            found: list[str] = []
            for value in env.get(node.id) or self.constants.get(node.id) or []:
                found += self.values(value, env, depth + 1) or []
            return found[:_CAP] or None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            found = []
            for value in env.get(node.value.id) or self.constants.get(node.value.id) or []:
                for sub in ast.walk(value):
                    if isinstance(sub, ast.Dict):
                        for item in sub.values:
                            found += self.values(item, env, depth + 1) or []
            return found[:_CAP] or None
        return None

    def _part(self, node: ast.expr, env: dict[str, list[ast.expr]], depth: int) -> list[str]:
        if isinstance(node, ast.Constant):
            return [str(node.value)]
        assert isinstance(node, ast.FormattedValue)
        spec = ""
        if isinstance(node.format_spec, ast.JoinedStr):
            spec = "".join(str(p.value) for p in node.format_spec.values if isinstance(p, ast.Constant))
        known = self.values(node.value, env, depth + 1)
        if known is None or spec:
            return [_sample(spec)]
        return [repr(k) if node.conversion == ord("r") else k for k in known]


def percent(text: str) -> str:
    """A %-format rendered with sample arguments ('took %.2f s' -> 'took 1.50 s')."""

    def one(match: re.Match[str]) -> str:
        kind = match.group(1)
        return "%" if kind == "%" else _sample(match.group(0)[1:] if kind in "eEfFgGdxX" else "")

    return _PERCENT.sub(one, text)


def _assignments(body: ast.AST) -> dict[str, list[ast.expr]]:
    env: dict[str, list[ast.expr]] = {}
    for node in ast.walk(body):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    env.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            env.setdefault(node.target.id, []).append(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            for arg, default in zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True):
                env.setdefault(arg.arg, []).append(default)
            for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if default is not None:
                    env.setdefault(arg.arg, []).append(default)
    return env


def _message(call: ast.Call) -> tuple[ast.expr, bool] | None:
    """The message argument of a logging or tqdm call, and whether %-arguments follow it."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name in _RANK0 and len(call.args) >= 2:
        return call.args[1], len(call.args) > 2
    if name in _LOG_METHODS and isinstance(func, ast.Attribute) and call.args:
        return call.args[0], len(call.args) > 1
    if name in ("print", "set_description", "set_description_str") and call.args:
        return call.args[0], False
    return None


def _bars(call: ast.Call, renderer: _Renderer, env: dict[str, list[ast.expr]]) -> list[str]:
    """A tqdm call's description drawn as bars by the real tqdm (0/64, 63/64, 64/64), with its bar_format."""
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    if "desc" not in keywords:
        return []
    descs = renderer.values(keywords["desc"], env) or []
    formats: list[str | None] = [None]
    if "bar_format" in keywords:
        formats = list(renderer.values(keywords["bar_format"], env) or [None])
    lines = []
    for desc, bar_format in itertools.product(descs, formats):
        for done in (0, 63, 64):
            lines.append(tqdm.format_meter(done, 64, 3.0, ncols=100, prefix=desc, bar_format=bar_format))
    return lines


def _calls(node: ast.AST, function: ast.AST | None) -> Iterator[tuple[ast.Call, ast.AST | None]]:
    """Every call under `node` with the innermost function around it, in one walk."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _calls(child, child)
            continue
        if isinstance(child, ast.Call):
            yield child, function
        yield from _calls(child, function)


def render_module(source: bytes, path: str, renderer: _Renderer) -> list[Rendered]:
    try:
        with warnings.catch_warnings():  # invalid escape sequences in upstream source are not ours to report
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = ast.parse(source)
    except SyntaxError:
        return []
    module_env: dict[str, list[ast.expr]] = {}
    for statement in tree.body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            for name, values in _assignments(statement).items():
                module_env.setdefault(name, []).extend(values)
    envs: dict[int, dict[str, list[ast.expr]]] = {}
    out: dict[tuple[str, str], Rendered] = {}
    for call, function in _calls(tree, None):
        message = _message(call)
        if message is None and not any(k.arg == "desc" for k in call.keywords):
            continue
        if function is None:
            env = module_env
        else:
            if id(function) not in envs:
                envs[id(function)] = {**module_env, **_assignments(function)}
            env = envs[id(function)]
        texts = _bars(call, renderer, env)
        if message is not None:
            rendered = [percent(t) if message[1] else t for t in renderer.values(message[0], env) or []]
            texts += rendered
            if isinstance(call.func, ast.Attribute) and call.func.attr.startswith("set_description"):
                texts += [tqdm.format_meter(63, 64, 3.0, ncols=100, prefix=t) for t in rendered]
        for text in texts:
            where = f"{path}:{call.lineno}"
            out[(text, where)] = Rendered(text, where)
    return list(out.values())


def _constants(archive: zipfile.ZipFile, names: list[str]) -> dict[str, list[ast.expr]]:
    """Module-level string constants of the whole package (BAR_FORMAT is imported from another module)."""
    constants: dict[str, list[ast.expr]] = {}
    for name in names:
        source = archive.read(name)
        if b"FORMAT" not in source and b"DESC" not in source:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        constants.setdefault(target.id, []).append(node.value)
    return constants


def rendered_lines(wheel: Path, package: str, cache: Path) -> list[Rendered]:
    """Every sample line the wheel's `package` code can log; cached under `cache`."""
    key = hashlib.sha256(Path(__file__).read_bytes() + wheel.name.encode() + str(wheel.stat().st_size).encode())
    cached = cache / f"{wheel.stem}.{key.hexdigest()[:16]}.json"
    if cached.is_file():
        return [Rendered(text, where) for text, where in json.loads(cached.read_text())]
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(f"{package}/") and n.endswith(".py")]
        renderer = _Renderer(_constants(archive, names))
        lines: list[Rendered] = []
        for name in names:
            source = archive.read(name)
            if _PREFILTER.search(source):
                lines += render_module(source, name, renderer)
    cache.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".tmp")
    partial.write_text(json.dumps([r.to_list() for r in lines]))
    partial.replace(cached)
    return lines
