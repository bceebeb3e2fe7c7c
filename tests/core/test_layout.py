"""The package boundaries of docs/ARCHITECTURE.md, enforced: each stage imports only the stages below it,
no module cycle exists anywhere, and no product file points outside the repository."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO

# Stage -> checkout folder. The installed names are bwstack.<stage>.
FOLDERS = {
    "core": "bwstack",
    "recipes": "recipes",
    "verify": "verify",
    "smoke": "smoke",
    "advise": "advise",
    "bench": "bench",
    "images": "images",
    "nodes": "nodes",
    "cli": "cli",
}
# Who may import whom (besides itself). The picture is in docs/ARCHITECTURE.md.
ALLOWED = {
    "core": set(),
    "recipes": {"core"},
    "verify": {"core", "recipes"},
    "smoke": {"core", "recipes"},
    "advise": {"core", "recipes", "verify"},
    "bench": {"core", "recipes", "smoke"},
    "images": {"core", "recipes", "verify"},
    "nodes": {"core", "recipes", "verify", "smoke", "advise", "bench", "images"},
    "cli": {"core", "recipes", "verify", "smoke", "advise", "bench", "images", "nodes"},
}


def stage_of_module(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "bwstack":
        return None
    if len(parts) > 1 and parts[1] in FOLDERS and parts[1] != "core":
        return parts[1]
    return "core"


def module_name(path: Path) -> str:
    for stage, folder in FOLDERS.items():
        root = REPO / folder
        if path.is_relative_to(root):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            base = ["bwstack"] if stage == "core" else ["bwstack", stage]
            return ".".join(base + parts)
    raise AssertionError(path)


def product_files() -> list[Path]:
    files = []
    for folder in FOLDERS.values():
        root = REPO / folder
        if root.is_dir():
            files += [p for p in root.rglob("*.py") if "packages" not in p.relative_to(root).parts[:2]]
    return sorted(files)


def imports_of(path: Path) -> list[str]:
    """Every module the file imports, at any depth (function-local imports hide cycles otherwise)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in product_files()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in imports_of(path) if m in modules and m != name}
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        here = stage_of_module(module)
        for target in targets:
            there = stage_of_module(target)
            if there != here and there not in ALLOWED[here]:
                found.append(f"{module} ({here}) imports {target} ({there})")
    return sorted(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Module cycles (a package __init__ re-exporting its own modules is not a cycle of meaning: skipped)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith(node + ".") or node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                found.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def test_stages_import_only_what_they_may() -> None:
    assert violations(import_graph()) == []


def test_no_module_imports_itself_round_a_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_check_sees_a_forbidden_import_and_a_cycle() -> None:
    """The rule must be able to fail: yesterday's images -> verify -> images loop and a recipes -> nodes import."""
    graph = {
        "bwstack.images.build": {"bwstack.verify.verify"},
        "bwstack.verify.verify": {"bwstack.images.build"},
        "bwstack.recipes.recipe": {"bwstack.nodes.preflight"},
        "bwstack.nodes.preflight": set(),
    }
    assert violations(graph) == [
        "bwstack.recipes.recipe (recipes) imports bwstack.nodes.preflight (nodes)",
        "bwstack.verify.verify (verify) imports bwstack.images.build (images)",
    ]
    assert cycles(graph)


@pytest.mark.parametrize("word", ["FIELD-NOTES", "shared/docs", "is lent", "device tool"])
def test_product_files_stand_alone(word: str) -> None:
    """No product file points at material outside the repository or speaks of the development setup."""
    roots = [*FOLDERS.values(), "docs", "scripts", "benchmarks", ".github", ".ci"]
    hits = []
    for root in roots:
        for path in (REPO / root).rglob("*") if (REPO / root).is_dir() else []:
            text_file = path.is_file() and path.suffix in {".py", ".md", ".toml", ".j2", ".sh", ".yml", ".yaml", ""}
            if text_file and word in path.read_text(errors="replace"):
                hits.append(str(path.relative_to(REPO)))
    for name in ("README.md", "tasks.py", "pyproject.toml"):
        if word in (REPO / name).read_text():
            hits.append(name)
    assert hits == []
