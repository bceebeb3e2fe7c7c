"""Run a package's own arch->directory loader for a given compute capability, without a GPU.

sgl-kernel decides at import which common_ops binary to load from the CC torch reports. Re-stating
that logic here would drift from the package; instead the package itself is imported in an isolated
child interpreter (`python -I -S`: no user site, no site-packages, so nothing but the stand-ins below
can answer for torch) with:

- a stand-in `torch` whose `torch.cuda` reports the requested CC (or no GPU),
- `importlib.util.spec_from_file_location` wrapped so that loading an extension module is recorded
  instead of performed: an existing file "loads" and ends the probe; a missing one fails the way the
  real import would, so the loader's own fallbacks run and are recorded too,
- a meta-path recorder for plain `import common_ops`-style fallbacks, and `ctypes.CDLL` recorded
  rather than called (loaders preload CUDA libraries that do not exist here).

The child is bounded by a timeout and killed if it overruns: a misbehaving loader is a LoaderProbeError,
never a hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bwstack.errors import LoaderProbeError
from bwstack.reaper import Lifeline
from bwstack.recipes.archs import CC, cc_text
from bwstack.verify.stand_in_torch import STAND_IN_TORCH, STAND_IN_TORCH_VERSION

RESULT_MARKER = "BWSTACK-PROBE-RESULT "
PROBE_TOKEN = "BWSTACK_PROBE_TOKEN"  # marks every process a probe starts, even one that leaves the session

_PROBE = r'''
import builtins, ctypes, importlib.abc, importlib.machinery, importlib.util, json, os, sys, traceback

MARKER = sys.argv[1]
PACKAGE = sys.argv[2]
ROOT = os.path.realpath(sys.argv[3])
OWN = os.path.join(ROOT, *PACKAGE.split("."))
attempts = []


class ProbeDone(BaseException):
    """A BaseException, so a loader's `except Exception` fallback cannot swallow the end of the probe."""


def report(selected, error=None):
    sys.stdout.write(MARKER + json.dumps({"selected": selected, "attempts": attempts, "error": error}) + "\n")
    sys.stdout.flush()


_real_spec = importlib.util.spec_from_file_location
EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES) + (".so",)


class RecordingLoader(importlib.abc.Loader):
    def __init__(self, path):
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exists = os.path.isfile(self.path)
        attempts.append({"how": "spec_from_file_location", "path": self.path, "exists": exists})
        if not exists:
            raise ImportError(f"{self.path}: cannot open shared object file: No such file or directory")
        raise ProbeDone(self.path)


def under_root(path):
    # A link inside the package that points elsewhere is still the package's binary, so either spelling counts.
    return any(p.startswith(ROOT + os.sep) for p in (os.path.abspath(path), os.path.realpath(path)))


def reason(error):
    """The error's first line; an empty message (a bare ImportError) still says what failed."""
    text = str(error).strip()
    if not text:
        parts = [f"module {error.name}" if getattr(error, "name", None) else "",
                 f"from {error.path}" if getattr(error, "path", None) else ""]
        text = " ".join(p for p in parts if p) or "raised with no message"
    return f"{type(error).__name__}: {text}".splitlines()[0][:500]


def recording_spec(name, location=None, *args, **kwargs):
    path = os.fspath(location) if location is not None else ""
    if path.endswith(EXTENSION_SUFFIXES) and under_root(path):
        return importlib.machinery.ModuleSpec(name, RecordingLoader(path), origin=path)
    return _real_spec(name, location, *args, **kwargs)


importlib.util.spec_from_file_location = recording_spec


class ExtensionRecorder(importlib.abc.MetaPathFinder):
    """Records extension modules found through sys.path (`import common_ops`) and ends the probe there."""

    def find_spec(self, fullname, path=None, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                origin = spec.origin or ""
                # Only the package's own binaries are the loader's pick; a stdlib extension the package
                # imports on the way (select, _posixsubprocess, ...) loads for real.
                if origin.endswith(EXTENSION_SUFFIXES) and under_root(origin):
                    attempts.append({"how": "import", "path": origin, "name": fullname, "exists": True})
                    spec.loader = RecordingLoader(origin)
                return spec
        if "ops" in fullname.rsplit(".", 1)[-1]:
            attempts.append({"how": "import", "path": None, "name": fullname, "exists": False})
        return None


sys.meta_path.insert(0, ExtensionRecorder())


def own_file(path):
    """Inside the package's own folder: a binary its loader picks (not another package's library)."""
    return os.path.realpath(path).startswith(OWN + os.sep)


def record_library(path):
    """torch.ops.load_library / torch.classes.load_library: the loader's pick when it is the package's own."""
    exists = os.path.isfile(path)
    attempts.append({"how": "load_library", "path": path, "exists": exists})
    if not exists:
        raise OSError(f"{path}: cannot open shared object file: No such file or directory")
    if own_file(path):
        raise ProbeDone(path)


class RecordedCDLL:
    def __init__(self, name, *args, **kwargs):
        path = os.fspath(name) if name else None
        attempts.append({"how": "ctypes", "path": path, "exists": None})
        if path and os.path.isfile(path) and own_file(path) and path.endswith(EXTENSION_SUFFIXES):
            raise ProbeDone(path)

    def __getattr__(self, name):
        raise AttributeError(f"bwstack probe: {name} is not callable in a probe")


ctypes.CDLL = RecordedCDLL
ctypes.cdll.LoadLibrary = RecordedCDLL
try:
    __import__(PACKAGE)
except ProbeDone as done:
    report(str(done))
except BaseException as error:
    report(None, reason(error))
else:
    report(None)
'''


@dataclass(frozen=True)
class LoaderAttempt:
    how: str  # spec_from_file_location | import | load_library | ctypes
    path: str | None  # relative to the package root where it lies inside it
    exists: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {"how": self.how, "path": self.path, "exists": self.exists}


@dataclass(frozen=True)
class LoaderResult:
    """What the package's loader did for one CC: the binary it loads, and the loads it tried first."""

    cc: CC | None
    selected: str | None  # path relative to the package root, e.g. sgl_kernel/sm100/common_ops.abi3.so
    attempts: tuple[LoaderAttempt, ...] = field(default=())
    error: str | None = None

    @property
    def probed(self) -> bool:
        """Did the loader run far enough to choose? It picked a binary, or it looked for its own and found none."""
        return self.selected is not None or (
            self.error is not None and any(a.exists is False and a.how != "ctypes" for a in self.attempts)
        )

    @property
    def not_probed_reason(self) -> str | None:
        if self.probed:
            return None
        if self.error:
            return f"the import stopped before loading a binary: {self.error}"
        return "importing the package loads none of its binaries (they load later, on first use)"

    @property
    def fallbacks(self) -> list[str]:
        """Extension loads tried before the selected one (the loader fell back past them)."""
        return [a.path or "?" for a in self.attempts if a.how != "ctypes" and a.path != self.selected]

    def to_dict(self) -> dict[str, Any]:
        return {
            "selected": self.selected,
            "probed": self.probed,
            "not_probed_reason": self.not_probed_reason,
            "fallbacks": self.fallbacks,
            "attempts": [a.to_dict() for a in self.attempts],
            "error": self.error,
        }


class RunningProbe:
    """One probe child, started now and judged later, so several run while the caller does other work.

    The caller must close() it (a `with` block does): that kills the child's process group and anything it
    forked that left the group, and deletes the scratch folder, whether the probe finished, timed out or
    the caller was interrupted.
    """

    def __init__(
        self, package_root: Path, import_name: str, cc: CC | None, *, timeout: float, label: str | None = None
    ) -> None:
        self.package_root = package_root.resolve()
        # What errors name: the source the user gave (a wheel), not a scratch folder gone by the time it prints.
        self.label = label or str(self.package_root / import_name)
        self.import_name = import_name
        self.cc = cc
        self.timeout = timeout
        if not self.package_root.joinpath(*import_name.split(".")).is_dir():
            raise LoaderProbeError(f"{self.package_root}: no package {import_name!r} to probe")
        self.token = uuid.uuid4().hex
        self.scratch = Path(tempfile.mkdtemp(prefix="bwstack-probe-"))
        stand_ins = self.scratch / "stand-ins"
        (stand_ins / "torch").mkdir(parents=True)
        (stand_ins / "torch" / "__init__.py").write_text(STAND_IN_TORCH)
        (stand_ins / "torch" / "version.py").write_text(STAND_IN_TORCH_VERSION)
        script = self.scratch / "probe.py"
        script.write_text(
            # sys.path: the stand-ins first, then the package root, then the stdlib; nothing else.
            f"import sys\nsys.path[:0] = [{str(stand_ins)!r}, {str(self.package_root)!r}]\n" + _PROBE
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "BWSTACK_PROBE_CC": cc_text(cc) if cc else "none",
            PROBE_TOKEN: self.token,
        }
        # -B: never write __pycache__ into the folder being verified (-I ignores PYTHONDONTWRITEBYTECODE).
        command = [sys.executable, "-I", "-S", "-B", str(script), RESULT_MARKER, import_name, str(self.package_root)]
        # Under the reaper shim, a child subreaper: what the loader forks stays its descendant (even with an
        # empty environment, out of the session), and it all dies with verify, even if verify is SIGKILLed.
        self.lifeline = Lifeline().__enter__()
        command, fds = self.lifeline.guarded(command)
        env.update(self.lifeline.environment())
        # Its own session, so a loader that forks leaves nothing behind: the whole group is killed. Output
        # goes to files, not pipes, so a forked child that keeps them open cannot stall the wait.
        with (self.scratch / "stdout").open("w") as out, (self.scratch / "stderr").open("w") as err:
            self.child = subprocess.Popen(
                command, stdout=out, stderr=err, env=env, cwd=self.scratch, start_new_session=True, pass_fds=fds
            )
        self.deadline = time.monotonic() + timeout

    def __enter__(self) -> RunningProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def result(self) -> LoaderResult:
        """Wait for the probe (until its own deadline) and read what the loader did."""
        where = self.label
        try:
            self.child.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise LoaderProbeError(
                f"{where}: importing {self.import_name} for CC {_cc_text(self.cc)} did not finish in "
                f"{self.timeout:g} s (--timeout); its loader hangs",
                remedy="run `python -X importtime -c 'import " + self.import_name + "'` to see where",
            ) from None
        stdout = (self.scratch / "stdout").read_text(errors="replace")
        lines = [line for line in stdout.splitlines() if line.startswith(RESULT_MARKER)]
        if not lines:
            stderr = (self.scratch / "stderr").read_text(errors="replace")
            tail = (stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise LoaderProbeError(
                f"{where}: loader probe for CC {_cc_text(self.cc)} exited {self.child.returncode} without a result: "
                f"{tail}"
            )
        raw = json.loads(lines[-1][len(RESULT_MARKER) :])
        return LoaderResult(
            cc=self.cc,
            selected=_relative(raw["selected"], self.package_root),
            attempts=tuple(
                LoaderAttempt(
                    a["how"],
                    _relative(a.get("path"), self.package_root) or (f"import {a['name']}" if a.get("name") else None),
                    a.get("exists"),
                )
                for a in raw["attempts"]
            ),
            error=raw["error"],
        )

    def close(self) -> None:
        self.lifeline.cut()  # the shim kills every descendant, escaped ones included, and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.wait(timeout=5)
        _kill_group(self.child)  # the fallback, should the shim itself be stuck
        self.child.wait()
        _kill_escaped(self.token)
        shutil.rmtree(self.scratch, ignore_errors=True)


def probe_loader(package_root: Path, import_name: str, cc: CC | None, *, timeout: float = 30.0) -> LoaderResult:
    """Import `import_name` from `package_root` as if on a GPU of compute capability `cc` (None: no GPU)."""
    with RunningProbe(package_root, import_name, cc, timeout=timeout) as probe:
        return probe.result()


def _kill_escaped(token: str) -> None:
    """Kill what the loader forked that left the process group (setsid): it still carries our token."""
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get(PROBE_TOKEN) == token:
                process.kill()


def _kill_group(child: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)


def _cc_text(cc: CC | None) -> str:
    return cc_text(cc) if cc else "none (no GPU)"


def _relative(path: str | None, root: Path) -> str | None:
    if not path:
        return None
    resolved = Path(path).resolve()
    return resolved.relative_to(root).as_posix() if resolved.is_relative_to(root) else path
