"""SGLang's server options read from a released wheel's source (parsed with ast, never imported), and an
argparse-faithful check of a command line against them.

Where options are defined (docs/advise.md): from 0.5.20 as annotated dataclass fields in
`sglang/srt/arg_groups/fields/*.py` (`name: A[T, "help"]` or `A[T, Arg(aliases=[...], choices=...)]`,
flag `--` + name with `-` for `_`), before that as the same kind of fields in `server_args.py`; plus a few
`parser.add_argument("--x", ...)` calls in `server_args.py`. A `bool` field is a switch (store_true);
`Literal[...]` or `Arg(choices=NAME)` give the choices (NAME from `arg_groups/choices.py`). The parser
keeps argparse's allow_abbrev, so a unique prefix of an option is accepted and an ambiguous one refused.
"""

from __future__ import annotations

import ast
import dataclasses
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from bwstack.advise.facts import AdviseError

_ROOT = "sglang/srt/"
# Options argparse takes as free text but SGLang checks against a list at start-up
# (speculative/draft_worker_common.py checks the draft backend against DRAFT_ATTENTION_BACKEND_CHOICES).
RUNTIME_CHOICES = {"--speculative-draft-attention-backend": "DRAFT_ATTENTION_BACKEND_CHOICES"}


@dataclass(frozen=True)
class OptionDef:
    flag: str
    names: tuple[str, ...]  # the flag and its aliases
    kind: str  # "switch", "value" or "list"
    choices: tuple[str, ...] | None
    source: str  # file:line inside the wheel


@dataclass
class OptionTable:
    version: str
    by_name: dict[str, OptionDef] = field(default_factory=dict)

    def add(self, option: OptionDef) -> None:
        for name in option.names:
            self.by_name.setdefault(name, option)

    def resolve(self, given: str) -> OptionDef:
        """What argparse does with `given`: an exact name, else a unique prefix; AdviseError otherwise."""
        if given in self.by_name:
            return self.by_name[given]
        matches = sorted(name for name in self.by_name if name.startswith(given))
        if len(matches) == 1:
            return self.by_name[matches[0]]
        if matches:
            raise AdviseError(f"SGLang {self.version}: ambiguous option: {given} could match {', '.join(matches)}")
        raise AdviseError(f"SGLang {self.version}: unrecognized arguments: {given}")

    def problems(self, argv: list[str]) -> list[str]:
        """Every option of a server command line (after the launcher) SGLang would refuse, and bad choices."""
        found: list[str] = []
        index = 0
        while index < len(argv):
            token = argv[index]
            index += 1
            if not token.startswith("--"):
                continue
            name, eq, inline = token.partition("=")
            try:
                option = self.resolve(name)
            except AdviseError as error:
                found.append(error.message)
                continue
            if option.kind == "switch":
                continue
            values = [inline] if eq else []
            if not eq:
                while index < len(argv) and not argv[index].startswith("--"):
                    values.append(argv[index])
                    index += 1
                    if option.kind == "value":
                        break
            if not values:
                found.append(f"SGLang {self.version}: {option.flag} expects a value")
            for value in values:
                if option.choices is not None and value not in option.choices:
                    found.append(f"SGLang {self.version}: {option.flag} {value!r} is not one of its choices")
        return found


def read_options(wheel: Path, version: str) -> OptionTable:
    """The options of the SGLang wheel at `wheel` (its version given for messages)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            sources = {
                n: archive.read(n).decode("utf-8")
                for n in names
                if n == _ROOT + "server_args.py"
                or n == _ROOT + "arg_groups/choices.py"
                or (n.startswith(_ROOT + "arg_groups/fields/") and n.endswith(".py"))
            }
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as error:
        raise AdviseError(f"{wheel}: not a readable SGLang wheel: {error}") from None
    if _ROOT + "server_args.py" not in sources:
        raise AdviseError(f"{wheel}: no {_ROOT}server_args.py: not an SGLang wheel")
    constants: dict[str, tuple[str, ...]] = {}
    for text in sources.values():
        constants.update(_literal_lists(ast.parse(text)))
    table = OptionTable(version)
    for name, text in sorted(sources.items()):
        tree = ast.parse(text)
        short = name.removeprefix(_ROOT)
        for option in _field_options(tree, short, constants):
            table.add(option)
        if short == "server_args.py":
            for option in _add_argument_options(tree, short, constants):
                table.add(option)
    if not table.by_name:
        raise AdviseError(f"{wheel}: no option definitions found")
    for flag, constant in RUNTIME_CHOICES.items():
        option = table.by_name.get(flag)
        if option is not None and option.choices is None and constant in constants:
            checked = dataclasses.replace(option, choices=constants[constant])
            for name in option.names:
                table.by_name[name] = checked
    return table


def _literal_lists(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if isinstance(value, list | tuple | set | frozenset) and all(isinstance(v, str) for v in value):
                out[node.targets[0].id] = tuple(value)
    return out


def _is_annotated(node: ast.expr) -> bool:
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("A", "Annotated")


def _field_options(tree: ast.Module, where: str, constants: dict[str, tuple[str, ...]]) -> list[OptionDef]:
    out = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            if not _is_annotated(stmt.annotation):
                continue  # a plain annotation is not a CLI option
            elts = stmt.annotation.slice.elts if isinstance(stmt.annotation.slice, ast.Tuple) else []
            if len(elts) < 2:
                continue
            typ, metas = elts[0], elts[1:]
            arg = next((m for m in metas if isinstance(m, ast.Call) and getattr(m.func, "id", "") == "Arg"), None)
            helps = any(isinstance(m, ast.Constant | ast.JoinedStr | ast.BinOp) for m in metas)
            if arg is None and not helps:
                continue
            kw = {k.arg: k.value for k in (arg.keywords if arg else []) if k.arg}
            if "no_cli" in kw and _literal(kw["no_cli"]) is True:
                continue
            flag = _literal(kw["cli_name"]) if "cli_name" in kw else "--" + stmt.target.id.replace("_", "-")
            aliases = _literal(kw["aliases"]) if "aliases" in kw else []
            choices = _choices(kw.get("choices"), constants) if "choices" in kw else _literal_type_choices(typ)
            text = ast.unparse(typ)
            kind = "switch" if text == "bool" else "list" if "List[" in text or "list[" in text else "value"
            if "action" in kw or "type_parser" in kw or "nargs" in kw:
                kind = "switch" if kind == "switch" else "value"
            names = (flag, *[a for a in aliases or [] if isinstance(a, str)])
            out.append(OptionDef(flag, names, kind, choices, f"{where}:{stmt.lineno}"))
    return out


def _add_argument_options(tree: ast.Module, where: str, constants: dict[str, tuple[str, ...]]) -> list[OptionDef]:
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
            continue
        names = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--"))
        if not names:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = _literal(kw["action"]) if "action" in kw else None
        kind = "switch" if action in ("store_true", "store_false") else "value"
        if "nargs" in kw and _literal(kw["nargs"]) in ("+", "*"):
            kind = "list"
        choices = _choices(kw.get("choices"), constants) if "choices" in kw else None
        out.append(OptionDef(names[0], names, kind, choices, f"{where}:{node.lineno}"))
    return out


def _literal(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _choices(node: ast.expr | None, constants: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """Choices a static reading can know; None (unchecked) for ones computed at run time."""
    if node is None:
        return None
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    value = _literal(node)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _literal_type_choices(typ: ast.expr) -> tuple[str, ...] | None:
    node = typ
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Optional":
        node = node.slice
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Literal":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        values = [_literal(e) for e in elts]
        if all(isinstance(v, str) for v in values):
            return tuple(values)  # type: ignore[arg-type]
    return None
