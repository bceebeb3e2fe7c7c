"""verify: for each requested GPU, does the binary the package's own loader picks hold code that runs there?

Reads every piece of device code in the source once (headers only): host libraries' fatbins, bare
cubins, fatbin and PTX files. Probes the loader once per compute capability and judges with the
compatibility table, container by container (coverage.py). The loader-selected binary decides
pass/fail; every other CUDA binary is a warning per arch unless named with `require`. When the loader
cannot be probed (it needs more than the stand-in torch, or loads its binaries only on first use), the
conservative rule decides: every CUDA binary the package ships must run, and the report says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.version import InvalidVersion, Version

from bwstack.errors import SourceError
from bwstack.recipes.archs import Arch, parse_arch_list
from bwstack.report import Check, Report, Status
from bwstack.verify import sources
from bwstack.verify.binaries import Binary, read_binaries
from bwstack.verify.compat import Runs, best_runs
from bwstack.verify.coverage import Coverage, coverage
from bwstack.verify.distribution import Distribution, find_distributions, from_wheel_name
from bwstack.verify.fatbin import FatbinEntry
from bwstack.verify.loader_probe import LoaderResult, RunningProbe
from bwstack.verify.static_checks import TORCH_CUDA, cuda_runtime_check, find_triton_ptxas, triton_ptxas_check
from bwstack.verify.wheel_limits import Limits

_HASH = re.compile(r"[0-9a-f]{32,}")


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


@dataclass(frozen=True)
class Options:
    """How strict the verdict is, beyond the loader's pick."""

    require: Sequence[str] = ()
    allow_partial: bool = False  # containers with no code for the GPU only warn
    allow_missing: Sequence[str] = ()  # ... or only when all their kernel names match one of these globs


def verify_tree(
    tree: sources.Tree,
    archs: Sequence[Arch],
    *,
    import_name: str = "sgl_kernel",
    require: Sequence[str] = (),
    kernels: bool = False,
    probe_timeout: float = 30.0,
    allow_partial: bool = False,
    allow_missing: Sequence[str] = (),
    cuda: str | None = None,
) -> Report:
    options = Options(tuple(require), allow_partial, tuple(allow_missing))
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
        binaries = read_binaries(tree, package_root, kernels=kernels or bool(allow_missing))
        bundled_ptxas = find_triton_ptxas(tree, tree.binaries)
        loaders = [probe.result() for probe in probes]
    cuda_binaries = [b for b in binaries if b.is_cuda]
    distributions = _distributions(tree, package_root, import_name)
    project = distributions[0].name if distributions else import_name.replace("_", "-")
    subject = f"{tree.label} ({', '.join(map(str, distributions))})" if distributions else tree.label
    report = Report(kind="verify", subject=subject)
    owned = _owned(tree, import_name, distributions, cuda_binaries)
    _distribution_check(report, import_name, distributions)
    targets = []
    for arch, loader in zip(archs, loaders, strict=True):
        target = _judge(report, arch, loader, cuda_binaries, import_name, project, options, owned)
        if check := triton_ptxas_check(arch, bundled_ptxas):
            report.add(check)
            target["ok"] = target["ok"] and check.status is not Status.FAIL
            target["triton_ptxas"] = check.evidence
        targets.append(target)
    if runtime := cuda_runtime_check(tree.binaries, _cuda_version(cuda)):
        report.add(runtime)
    unmatched = [name for name in options.require if not any(_matches(b, name) for b in cuda_binaries)]
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
        "distributions": [{"name": d.name, "version": d.version} for d in distributions],
        "targets": targets,
        "binaries": [b.to_dict() for b in cuda_binaries],
        "non_cuda_binaries": [b.path for b in binaries if not b.is_cuda],
        "refused": tree.refused,
    }
    return report


def _cuda_version(text: str | None) -> Version | None:
    if not text:
        return None
    try:
        version = Version(text)
    except InvalidVersion:
        raise SourceError(f"--cuda {text!r} is not a CUDA version", remedy="e.g. --cuda 13.0") from None
    if len(version.release) < 2:
        raise SourceError(f"--cuda {text!r}: give major.minor", remedy="e.g. --cuda 13.0")
    return version


def find_package_root(tree: sources.Tree, import_name: str) -> Path:
    """site-packages: the folder that holds `<import/name>/` (a regular or a namespace package)."""
    parts = import_name.split(".")
    if tree.root.parts[-len(parts) :] == tuple(parts) and tree.root.is_dir():
        return tree.root.parents[len(parts) - 1]
    pattern = "/".join(parts)
    # A regular package first (its __init__.py), else a namespace package: the folder alone.
    found = sorted(tree.root.rglob(f"{pattern}/__init__.py"), key=lambda p: (len(p.parts), str(p)))
    folders = [p.parent for p in found] or sorted(
        (p for p in tree.root.rglob(pattern) if p.is_dir() and "." not in p.name[:1]),
        key=lambda p: (len(p.parts), str(p)),
    )
    if not folders:
        raise SourceError(
            f"{tree.label}: no {import_name} package inside (no {pattern}/ folder)",
            remedy="point --path at site-packages, or pass --package with the import name",
        )
    return folders[0].parents[len(parts) - 1]


def _owned(tree: sources.Tree, import_name: str, found: list[Distribution], binaries: list[Binary]) -> set[str]:
    """Paths of the binaries the package itself ships: all of a wheel; in a folder or image, those under
    its own folder or listed in its distribution's RECORD (not torch's or another package's)."""
    if tree.label.endswith(".whl"):
        return {b.path for b in binaries}
    prefix = import_name.replace(".", "/") + "/"
    record = frozenset().union(*(d.files for d in found))
    return {b.path for b in binaries if any(p.startswith(prefix) or p in record for p in b.paths)}


def _distributions(tree: sources.Tree, package_root: Path, import_name: str) -> list[Distribution]:
    found = find_distributions(package_root, import_name)
    if not found and tree.label.endswith(".whl") and (named := from_wheel_name(tree.label)):
        found = [named]
    return found


def _distribution_check(report: Report, import_name: str, found: list[Distribution]) -> None:
    if len(found) > 1:
        report.add(
            Check(
                "distribution",
                Status.WARN,
                f"{import_name} is installed by {len(found)} distributions: "
                + ", ".join(map(str, found))
                + "; their files overwrite each other",
                {"distributions": [str(d) for d in found]},
                remedy=f"pip uninstall all but one of: {', '.join(d.name for d in found)}, then reinstall it",
            )
        )
    elif found:
        report.add(Check("distribution", Status.PASS, f"{import_name} is installed by {found[0]}"))


def _shown(tree: sources.Tree, package_root: Path) -> str:
    """The probed package as the user knows it: inside their folder, or inside the wheel/image they named."""
    if Path(tree.label).resolve() == tree.root or not package_root.is_relative_to(tree.root):
        return str(package_root)
    inner = package_root.relative_to(tree.root).as_posix()
    return f"{tree.label}!{inner}" if inner != "." else tree.label


def _matches(binary: Binary, name: str) -> bool:
    return any(
        PurePosixPath(p).name == name or PurePosixPath(p).name.split(".")[0] == name or p == name for p in binary.paths
    )


def _short(path: str) -> str:
    """A check name: the path with content hashes cut to 8 characters (the JSON keeps the whole path)."""
    return "/".join(part[:8] + "…" if _HASH.fullmatch(part) else part for part in path.split("/"))


def _alternative(binary: Binary, selected: Binary) -> bool:
    """A same-named build in a sibling folder (sm90/common_ops vs sm100/common_ops): the loader's other
    choice for other GPUs, not what runs here. A same-named file elsewhere (x/_C.so, x/fa3/_C.so) is not."""
    mine, picked = PurePosixPath(binary.path), PurePosixPath(selected.path)
    return mine.name == picked.name and mine.parent != picked.parent and mine.parent.parent == picked.parent.parent


def _remedy(arch: Arch, project: str) -> str:
    family = f"compute_{arch.number}f" if arch.family_since else f"compute_{arch.number}"
    gencode = arch.gencode.replace("-gencode=", "-gencode ")
    return f"rebuild {project} with {gencode}, or add {family} PTX (invoke build --arch {arch.name})"


def _judge(
    report: Report,
    arch: Arch,
    loader: LoaderResult,
    cuda_binaries: list[Binary],
    import_name: str,
    project: str,
    options: Options,
    owned: set[str],
) -> dict[str, Any]:
    """Add this arch's checks to the report and return its `targets[]` record."""
    selected = next((b for b in cuda_binaries if loader.selected in b.paths), None) if loader.selected else None
    reason = loader.not_probed_reason
    if loader.selected and selected is None:
        # The probe ends at the first of the package's own binaries; a host-only one says nothing about the GPU.
        reason = f"the first binary it loads, {loader.selected}, holds no device code; the rest load later"
    conservative = reason is not None
    rows, target_ok = [], True
    check_name = f"{arch.name} loader"
    evidence: dict[str, Any] = {"cc": arch.cc_str, "loader": loader.to_dict(), "probed": not conservative}
    if conservative:
        rule = (
            f"conservative rule: every CUDA binary {import_name} ships must run here"
            if owned
            else f"{import_name} ships no CUDA device code, so nothing of it has to run here"
        )
        report.add(
            Check(
                check_name,
                Status.WARN if owned else Status.PASS,
                f"CC {arch.cc_str}: loader: not probed ({reason}); {rule}",
                evidence,
                remedy="nothing to do if the package loads its binaries on first use; otherwise --require the one "
                "that matters",
            )
        )
    elif loader.selected is None:
        target_ok = False
        report.add(
            Check(
                check_name,
                Status.FAIL,
                f"CC {arch.cc_str}: {import_name}'s loader loads no binary"
                + (f" ({loader.error})" if loader.error else ""),
                evidence,
                remedy=f"install a {project} build with a binary for this GPU; {_remedy(arch, project)}",
            )
        )
    # The loader's pick first: it is what decides the verdict.
    for binary in sorted(cuda_binaries, key=lambda b: b is not selected):
        is_selected = binary is selected
        required = (
            is_selected
            or (conservative and binary.path in owned)
            or any(_matches(binary, name) for name in options.require)
            or any(p.endswith(TORCH_CUDA) for p in binary.paths)
        )
        alternative = not is_selected and selected is not None and _alternative(binary, selected)
        runs, via = (Runs.NONE, None) if binary.error else best_runs(binary.entries, arch.cc)
        cover = coverage(binary.entries, arch.cc, kernels_read=binary.kernels_read)
        rows.append(
            {
                "path": binary.path,
                "copies": list(binary.copies),
                "required": required,
                "selected": is_selected,
                "runs": str(runs),
                "via": via.arch if via else None,
                "coverage": cover.to_dict(),
            }
        )
        if alternative:
            continue
        check = _binary_check(arch, binary, runs, via, cover, is_selected, required, evidence, project, options)
        target_ok = target_ok and (check.status is not Status.FAIL)
        report.add(check)
    record = {"arch": arch.name, "cc": arch.cc_str, "ok": target_ok, "loader": loader.to_dict(), "binaries": rows}
    return record | {"probed": not conservative}


def _binary_check(
    arch: Arch,
    binary: Binary,
    runs: Runs,
    via: FatbinEntry | None,
    cover: Coverage,
    is_selected: bool,
    required: bool,
    loader_evidence: dict[str, Any],
    project: str,
    options: Options,
) -> Check:
    name = f"{arch.name} loader" if is_selected else f"{arch.name} {_short(binary.path)}"
    picked = f"the loader picks {binary.path}, which" if is_selected else binary.path
    if binary.copies:
        picked += f" (same bytes as {', '.join(binary.copies)})"
    if binary.files > 1:
        picked += f" ({binary.files} files)"
    evidence = {**(loader_evidence if is_selected else {"cc": arch.cc_str}), "holds": binary.holds()}
    evidence |= {"coverage": cover.to_dict(), "copies": list(binary.copies)}
    failing = Status.FAIL if required else Status.WARN
    if binary.error:
        return Check(
            name,
            failing,
            f"CC {arch.cc_str}: {picked} cannot be read: {binary.error}",
            evidence,
            remedy="reinstall the package; the file is truncated or not a CUDA library",
        )
    if runs is Runs.NONE:
        return Check(
            name,
            failing,
            f"CC {arch.cc_str}: {picked} has no code that runs here (holds {binary.holds()})",
            evidence,
            remedy=(
                f"install a torch build whose CUDA arch list covers {arch.cc_str} (TORCH_CUDA_ARCH_LIST "
                f"{arch.torch_arch}): torch fails every op on this GPU"
                if any(p.endswith(TORCH_CUDA) for p in binary.paths)
                else _remedy(arch, project)
                if required
                else "not required; --require it to make this fail"
            ),
        )
    how = {
        Runs.SASS: "exact SASS" if via and via.cc == arch.cc else "same-major SASS",
        Runs.SASS_FAMILY: "family SASS",
        Runs.PTX_JIT: "PTX JIT at first launch (slow, then cached)",
    }[runs]
    finding = f"CC {arch.cc_str}: {picked} runs via {via.arch if via else '?'} ({how})"
    described = cover.describe(arch.cc_str, "files" if binary.files > 1 else "containers")
    if cover.missing:
        allowed = options.allow_partial or cover.allowed_by(options.allow_missing)
        status = Status.WARN if allowed or not required else Status.FAIL
        why = " (allowed)" if allowed else ""
        hint = "" if cover.kernels_read else "; --kernels names them"
        return Check(
            name,
            status,
            f"{finding}, but {described}{why}{hint}",
            evidence,
            remedy=None
            if allowed
            else f"{_remedy(arch, project)}; if those kernels are arch-specific by design, --allow-missing GLOB "
            "(kernel names) or --allow-partial",
        )
    if runs is Runs.PTX_JIT or cover.ptx_only:
        detail = f"; {described}" if cover.ptx_only and runs is not Runs.PTX_JIT else ""
        return Check(
            name,
            Status.WARN,
            finding + detail,
            evidence,
            remedy="build SASS for this arch to skip the JIT; the driver must be new enough for that PTX",
        )
    return Check(name, Status.PASS, finding, evidence)
