"""The binaries of a source as report rows: read once, identical copies folded, bare device files grouped.

- Files with the same bytes (sha256; only same-sized files are hashed) are one row listing the copies:
  a wheel turns a library's symlinks into full copies (sgl-kernel 0.3.x ships mscclpp three times).
- A folder of bare device files (.cubin, .fatbin, .ptx) is one row whose containers are its files:
  flashinfer-cubin ships 3,782 cubins in four folders.
- Rows are named by their path relative to site-packages when inside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any

from bwstack.errors import FatbinError
from bwstack.verify import sources
from bwstack.verify.device_files import is_device_name
from bwstack.verify.fatbin import FatbinEntry

_FOLD_MIN = 4096  # files at least this big are compared by digest, so copies fold into one row


@dataclass(frozen=True)
class Binary:
    """One shared object in the source: its entries, or why it could not be read."""

    path: str  # relative to site-packages when inside it (sgl_kernel/sm100/common_ops.abi3.so)
    entries: tuple[FatbinEntry, ...]
    error: str | None = None
    copies: tuple[str, ...] = ()  # other files with the same bytes (sha256), folded into this row
    files: int = 1  # a folder of bare device files is one row: one container per file
    kernels_read: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.copies)

    @property
    def is_cuda(self) -> bool:
        return bool(self.entries) or self.error is not None

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    def holds(self) -> str:
        # A library linked from several objects carries one container per object: name each target once.
        return ", ".join(dict.fromkeys(e.arch for e in self.entries)) or "no device code"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "copies": list(self.copies),
            "files": self.files,
            "error": self.error,
            "entries": [e.to_dict() for e in self.entries],
        }


def read_binaries(tree: sources.Tree, package_root: Path, *, kernels: bool) -> list[Binary]:
    """Every binary of the tree, identical files folded, each folder of bare device files as one row."""
    groups: dict[str, list[str]] = {}
    singles: list[str] = []
    for relative in tree.binaries:
        if is_device_name(relative):
            groups.setdefault(PurePosixPath(relative).parent.as_posix(), []).append(relative)
        else:
            singles.append(relative)
    for folder, members in list(groups.items()):
        if len(members) == 1:
            singles.extend(groups.pop(folder))
    copies = _identical(tree, sorted(singles))
    binaries = [
        _read(tree, relative, package_root, kernels, copies.get(relative, ()))
        for relative in sorted(singles)
        if relative not in copies.get("", ())
    ]
    binaries += [_read_folder(tree, folder, members, package_root, kernels) for folder, members in groups.items()]
    return sorted(binaries, key=lambda b: b.path)


def _identical(tree: sources.Tree, files: list[str]) -> dict[str, tuple[str, ...]]:
    """{first path: its copies}, plus "" -> every copy; only same-sized files are hashed."""
    by_size: dict[int, list[str]] = {}
    for relative in files:
        size = tree.size(relative)
        if size >= _FOLD_MIN:
            by_size.setdefault(size, []).append(relative)
    folded: dict[str, tuple[str, ...]] = {"": ()}
    for same_size in (group for group in by_size.values() if len(group) > 1):
        by_digest: dict[str, list[str]] = {}
        for relative in same_size:
            by_digest.setdefault(tree.digest(relative), []).append(relative)
        for first, *rest in (sorted(g, key=lambda p: (len(p), p)) for g in by_digest.values() if len(g) > 1):
            folded[first] = tuple(rest)
            folded[""] += tuple(rest)
    return folded


def _shown(tree: sources.Tree, relative: str, package_root: Path) -> str:
    absolute = tree.root / relative
    return absolute.relative_to(package_root).as_posix() if absolute.is_relative_to(package_root) else relative


def _read(tree: sources.Tree, relative: str, package_root: Path, kernels: bool, copies: tuple[str, ...]) -> Binary:
    shown = _shown(tree, relative, package_root)
    others = tuple(_shown(tree, c, package_root) for c in copies)
    try:
        return Binary(shown, tuple(tree.read(relative, kernels=kernels)), copies=others, kernels_read=kernels)
    except FatbinError as error:
        return Binary(shown, (), error.one_line(), copies=others)


def _read_folder(tree: sources.Tree, folder: str, members: list[str], package_root: Path, kernels: bool) -> Binary:
    suffixes = {PurePosixPath(m).suffix for m in members}
    shown = _shown(tree, folder, package_root) + "/*" + (suffixes.pop() if len(suffixes) == 1 else "")
    entries: list[FatbinEntry] = []
    for index, relative in enumerate(members):
        try:
            entries += [replace(e, container=index) for e in tree.read(relative, kernels=kernels)]
        except FatbinError as error:
            return Binary(shown, (), error.one_line(), files=len(members))
    return Binary(shown, tuple(entries), files=len(members), kernels_read=kernels)
