"""verify: for each requested GPU, does the binary the package's own loader picks hold code that runs there?

Reads every CUDA binary in the source once (headers only), probes the loader once per compute
capability, and judges with the compatibility table. The loader-selected binary decides pass/fail;
every other CUDA binary is a warning per arch unless named with `require`, which makes it decide too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from bwstack.errors import FatbinError, SourceError
from bwstack.recipes.archs import Arch, parse_arch_list
from bwstack.report import Check, Report, Status
from bwstack.verify import sources
from bwstack.verify.compat import Runs, best_runs
from bwstack.verify.fatbin import FatbinEntry
from bwstack.verify.loader_probe import LoaderResult, RunningProbe
from bwstack.verify.wheel_limits import Limits


@dataclass(frozen=True)
class Binary:
    """One shared object in the source: its entries, or why it could not be read."""

    path: str  # relative to the package root when inside it (sgl_kernel/sm100/common_ops.abi3.so)
    entries: tuple[FatbinEntry, ...]
    error: str | None = None

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
        return {"path": self.path, "error": self.error, "entries": [e.to_dict() for e in self.entries]}


def parse_archs(texts: Iterable[str]) -> list[Arch]:
    """`--arch` values for verify, where `all` is the whole table (the one parser: parse_arch_list)."""
    return parse_arch_list(texts)


def open_source(
    *, wheel: str | None, path: str | None, image: str | None, import_name: str, limits: Limits | None = None
) -> AbstractContextManager:
    if not all(part.isidentifier() for part in import_name.split(".")):
        raise SourceError(f"--package {import_name!r} is not a Python import name", remedy="e.g. --package sgl_kernel")
    given = [(k, v) for k, v in (("--wheel", wheel), ("--path", path), ("--image", image)) if v]
    if len(given) != 1:
        raise SourceError("give exactly one of --wheel FILE, --path DIR or --image REF")
    if wheel:
        return sources.open_wheel(Path(wheel), limits)
    if path:
        return sources.open_path(Path(path))
    return sources.open_image(str(image), import_name=import_name)


def verify_tree(
    tree: sources.Tree,
    archs: Sequence[Arch],
    *,
    import_name: str = "sgl_kernel",
    require: Sequence[str] = (),
    kernels: bool = False,
    probe_timeout: float = 30.0,
) -> Report:
    package_root = find_package_root(tree, import_name)
    # The probes are child processes: start them all, read the binaries meanwhile, then collect. The stack
    # closes every probe however this ends (a timeout, an interrupt), so none outlives verify.
    with ExitStack() as stack:
        probes = [
            stack.enter_context(
                RunningProbe(package_root, import_name, a.cc, timeout=probe_timeout, label=_shown(tree, package_root))
            )
            for a in archs
        ]
        binaries = [_read(tree, rel, package_root, kernels) for rel in tree.binaries]
        loaders = [probe.result() for probe in probes]
    cuda_binaries = [b for b in binaries if b.is_cuda]
    report = Report(kind="verify", subject=tree.label)
    targets = [
        _judge(report, arch, loader, cuda_binaries, import_name, require)
        for arch, loader in zip(archs, loaders, strict=True)
    ]
    unmatched = [name for name in require if not any(_matches(b, name) for b in cuda_binaries)]
    for name in unmatched:
        report.add(
            Check(
                f"require {name}",
                Status.FAIL,
                f"--require {name}: no CUDA binary of that name in {tree.label}",
                {"binaries": [b.path for b in cuda_binaries]},
                remedy="check the name (file name without suffix, e.g. flash_ops)",
            )
        )
    if tree.refused:
        report.add(
            Check(
                "source members",
                Status.WARN,
                f"{len(tree.refused)} member(s) refused (absolute paths, '..' or links)",
                {"refused": tree.refused[:50]},
            )
        )
    report.data = {
        "source": tree.label,
        "package": import_name,
        "targets": targets,
        "binaries": [b.to_dict() for b in cuda_binaries],
        "non_cuda_binaries": [b.path for b in binaries if not b.is_cuda],
        "refused": tree.refused,
    }
    return report


def find_package_root(tree: sources.Tree, import_name: str) -> Path:
    """The folder that holds `<import_name>/__init__.py`: site-packages, or the tree root itself."""
    if tree.root.name == import_name and (tree.root / "__init__.py").is_file():
        return tree.root.parent
    found = sorted(tree.root.rglob(f"{import_name}/__init__.py"), key=lambda p: (len(p.parts), str(p)))
    if not found:
        raise SourceError(
            f"{tree.label}: no {import_name} package inside (no {import_name}/__init__.py)",
            remedy="point --path at site-packages, or pass --package with the import name",
        )
    return found[0].parent.parent


def _shown(tree: sources.Tree, package_root: Path) -> str:
    """The probed package as the user knows it: inside their folder, or inside the wheel/image they named."""
    if Path(tree.label).resolve() == tree.root or not package_root.is_relative_to(tree.root):
        return str(package_root)
    inner = package_root.relative_to(tree.root).as_posix()
    return f"{tree.label}!{inner}" if inner != "." else tree.label


def _read(tree: sources.Tree, relative: str, package_root: Path, kernels: bool) -> Binary:
    absolute = tree.root / relative
    shown = absolute.relative_to(package_root).as_posix() if absolute.is_relative_to(package_root) else relative
    try:
        return Binary(shown, tuple(tree.read(relative, kernels=kernels)))
    except FatbinError as error:
        return Binary(shown, (), error.one_line())


def _matches(binary: Binary, name: str) -> bool:
    return binary.name == name or binary.name.split(".")[0] == name or binary.path == name


def _remedy(arch: Arch, import_name: str) -> str:
    family = f"compute_{arch.number}f" if arch.family_since else f"compute_{arch.number}"
    gencode = arch.gencode.replace("-gencode=", "-gencode ")
    return (
        f"rebuild {import_name.replace('_', '-')} with {gencode}, or add {family} PTX (invoke build --arch {arch.name})"
    )


def _judge(
    report: Report,
    arch: Arch,
    loader: LoaderResult,
    cuda_binaries: list[Binary],
    import_name: str,
    require: Sequence[str],
) -> dict[str, Any]:
    """Add this arch's checks to the report and return its `targets[]` record."""
    selected_name = PurePosixPath(loader.selected).name if loader.selected else None
    rows, target_ok = [], True
    selected = next((b for b in cuda_binaries if b.path == loader.selected), None)
    check_name = f"{arch.name} loader"
    evidence: dict[str, Any] = {"cc": arch.cc_str, "loader": loader.to_dict()}
    if loader.selected is None:
        target_ok = False
        report.add(
            Check(
                check_name,
                Status.FAIL,
                f"CC {arch.cc_str}: {import_name}'s loader loads no binary"
                + (f" ({loader.error})" if loader.error else ""),
                evidence,
                remedy=f"install a {import_name} build with a binary for this GPU; {_remedy(arch, import_name)}",
            )
        )
    elif selected is None:
        target_ok = False
        report.add(
            Check(
                check_name,
                Status.FAIL,
                f"CC {arch.cc_str}: the loader picks {loader.selected}, which holds no CUDA device code",
                evidence,
                remedy=_remedy(arch, import_name),
            )
        )
    # The loader's pick first: it is what decides the verdict.
    for binary in sorted(cuda_binaries, key=lambda b: b is not selected):
        is_selected = binary is selected
        required = is_selected or any(_matches(binary, name) for name in require)
        # Same-named builds in other folders are the loader's alternatives, not what runs here.
        alternative = not is_selected and selected_name is not None and binary.name == selected_name
        runs, via = (Runs.NONE, None) if binary.error else best_runs(binary.entries, arch.cc)
        rows.append(
            {
                "path": binary.path,
                "required": required,
                "selected": is_selected,
                "runs": str(runs),
                "via": via.arch if via else None,
            }
        )
        if alternative:
            continue
        ok = runs is not Runs.NONE
        target_ok = target_ok and (ok or not required)
        report.add(_binary_check(arch, binary, runs, via, is_selected, required, evidence, import_name))
    return {"arch": arch.name, "cc": arch.cc_str, "ok": target_ok, "loader": loader.to_dict(), "binaries": rows}


def _binary_check(
    arch: Arch,
    binary: Binary,
    runs: Runs,
    via: FatbinEntry | None,
    is_selected: bool,
    required: bool,
    loader_evidence: dict[str, Any],
    import_name: str,
) -> Check:
    name = f"{arch.name} loader" if is_selected else f"{arch.name} {binary.name}"
    picked = f"the loader picks {binary.path}, which" if is_selected else binary.path
    evidence = {**(loader_evidence if is_selected else {"cc": arch.cc_str}), "holds": binary.holds()}
    if binary.error:
        return Check(
            name,
            Status.FAIL if required else Status.WARN,
            f"CC {arch.cc_str}: {picked} cannot be read: {binary.error}",
            evidence,
            remedy="reinstall the package; the file is truncated or not a CUDA library",
        )
    if runs is Runs.NONE:
        return Check(
            name,
            Status.FAIL if required else Status.WARN,
            f"CC {arch.cc_str}: {picked} has no code that runs here (holds {binary.holds()})",
            evidence,
            remedy=_remedy(arch, import_name) if required else "not required; --require it to make this fail",
        )
    how = {
        Runs.SASS: "exact SASS" if via and via.cc == arch.cc else "same-major SASS",
        Runs.SASS_FAMILY: "family SASS",
        Runs.PTX_JIT: "PTX JIT at first launch (slow, then cached)",
    }[runs]
    status = Status.WARN if runs is Runs.PTX_JIT else Status.PASS
    return Check(
        name,
        status,
        f"CC {arch.cc_str}: {picked} runs via {via.arch if via else '?'} ({how})",
        evidence,
        remedy="build SASS for this arch to skip the JIT; the driver must be new enough for that PTX"
        if runs is Runs.PTX_JIT
        else None,
    )
