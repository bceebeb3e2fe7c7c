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
from bwstack.recipes.archs import CC

RESULT_MARKER = "BWSTACK-PROBE-RESULT "
PROBE_TOKEN = "BWSTACK_PROBE_TOKEN"  # marks every process a probe starts, even one that leaves the session

_STAND_IN_TORCH = r'''
"""Stand-in torch for bwstack's loader probe: reports one GPU of the CC in BWSTACK_PROBE_CC.

Loaders touch much of torch on the way to their binary (annotations with torch.Tensor, subclasses of
torch.nn.Module, decorators such as torch.compiler.disable, torch.library registrations). Everything
not written out below is a permissive stub: any attribute of any torch module is a class that can be
subclassed, called, used as a decorator (returns what it decorates) or indexed. What decides the
probe is explicit: torch.cuda, torch.version, and torch.ops/torch.classes.load_library, which hands
the path to the probe (that call IS the loader's choice of binary).
"""
import builtins
import importlib.abc
import importlib.machinery
import os
import sys
import types
from types import SimpleNamespace

__version__ = "2.9.1"
_cc = os.environ.get("BWSTACK_PROBE_CC", "none")


class _StubMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        stub = _stub(name)
        type.__setattr__(cls, name, stub)
        return stub

    def __call__(cls, *args, **kwargs):
        # A bare stub used as a decorator returns what it decorates; a subclass builds an instance.
        if cls.__dict__.get("_bwstack_stub") and len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return super().__call__()

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0

    def __bool__(cls):
        return True

    def __or__(cls, other):
        # `stub | {ops}` (a set of ops) and `torch.Tensor | None` (an annotation) both still work.
        return set(other) if isinstance(other, (set, frozenset)) else type.__or__(cls, other)

    def __ror__(cls, other):
        return set(other) if isinstance(other, (set, frozenset)) else type.__ror__(cls, other)


class _Stub(metaclass=_StubMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub(name)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Stub()

    def __getitem__(self, item):
        return _Stub()

    def __iter__(self):
        return iter(())


def _stub(name):
    return _StubMeta(name, (_Stub,), {"_bwstack_stub": True})


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        stub = _stub(name)
        setattr(self, name, stub)
        return stub


def _load_library(path):
    sys.modules["__main__"].record_library(os.fspath(path))


class _Ops(_StubModule):
    def load_library(self, path):
        _load_library(path)


class _Cuda(_StubModule):
    def is_available(self):
        return _cc != "none"

    def device_count(self):
        return 0 if _cc == "none" else 1

    def current_device(self):
        if _cc == "none":
            raise RuntimeError("No CUDA GPUs are available")
        return 0

    def _capability(self):
        if _cc == "none":
            raise RuntimeError("No CUDA GPUs are available")
        # builtins.int: this module's own `int` is the dtype stub, as in torch.
        major, minor = (builtins.int(x) for x in _cc.split("."))
        return major, minor

    def get_device_capability(self, device=None):
        return self._capability()

    def get_device_properties(self, device=None):
        major, minor = self._capability()
        return SimpleNamespace(major=major, minor=minor, name=f"bwstack probe GPU (CC {major}.{minor})",
                               total_memory=96 << 30, multi_processor_count=188, gcnArchName="",
                               L2_cache_size=96 << 20, warp_size=32, uuid="bwstack-probe")

    def get_device_name(self, device=None):
        return self.get_device_properties(device).name

    def get_arch_list(self):
        return [] if _cc == "none" else ["sm_%s%s" % tuple(_cc.split("."))]

    def is_initialized(self):
        return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every torch submodule that has no file here as a permissive stub module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torch.") and fullname not in sys.modules:
            here = os.path.join(os.path.dirname(__file__), *fullname.split(".")[1:])
            if not os.path.exists(here + ".py"):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())


def _module(name, cls=_StubModule):
    module = cls("torch." + name)
    module.__path__ = []
    sys.modules[module.__name__] = module
    globals()[name] = module
    return module


cuda = _module("cuda", _Cuda)
ops = _module("ops", _Ops)
classes = _module("classes", _Ops)
from torch import version  # noqa: E402  (a file, as loaders read it from disk without importing torch)

for _name in ("float16", "bfloat16", "float32", "float64", "float", "half", "double", "int8", "uint8", "int16",
              "int32", "int64", "long", "int", "bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
              "float4_e2m1fn_x2", "complex64", "uint32", "uint64"):
    globals()[_name] = _stub(_name)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    stub = _stub(name)
    globals()[name] = stub
    return stub
'''

_STAND_IN_TORCH_VERSION = """\
__version__ = "2.9.1"
cuda = "13.0"
hip = None
git_version = "bwstack-probe"
debug = False
"""

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
    return os.path.realpath(path).startswith(ROOT + os.sep)


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
    report(None, f"{type(error).__name__}: {error}".splitlines()[0][:500])
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

    def __init__(self, package_root: Path, import_name: str, cc: CC | None, *, timeout: float) -> None:
        self.package_root = package_root.resolve()
        self.import_name = import_name
        self.cc = cc
        self.timeout = timeout
        if not self.package_root.joinpath(*import_name.split(".")).is_dir():
            raise LoaderProbeError(f"{self.package_root}: no package {import_name!r} to probe")
        self.token = uuid.uuid4().hex
        self.scratch = Path(tempfile.mkdtemp(prefix="bwstack-probe-"))
        stand_ins = self.scratch / "stand-ins"
        (stand_ins / "torch").mkdir(parents=True)
        (stand_ins / "torch" / "__init__.py").write_text(_STAND_IN_TORCH)
        (stand_ins / "torch" / "version.py").write_text(_STAND_IN_TORCH_VERSION)
        script = self.scratch / "probe.py"
        script.write_text(
            # sys.path: the stand-ins first, then the package root, then the stdlib; nothing else.
            f"import sys\nsys.path[:0] = [{str(stand_ins)!r}, {str(self.package_root)!r}]\n" + _PROBE
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "BWSTACK_PROBE_CC": f"{cc[0]}.{cc[1]}" if cc else "none",
            PROBE_TOKEN: self.token,
        }
        # -B: never write __pycache__ into the folder being verified (-I ignores PYTHONDONTWRITEBYTECODE).
        command = [sys.executable, "-I", "-S", "-B", str(script), RESULT_MARKER, import_name, str(self.package_root)]
        # Its own session, so a loader that forks leaves nothing behind: the whole group is killed. Output
        # goes to files, not pipes, so a forked child that keeps them open cannot stall the wait.
        with (self.scratch / "stdout").open("w") as out, (self.scratch / "stderr").open("w") as err:
            self.child = subprocess.Popen(
                command, stdout=out, stderr=err, env=env, cwd=self.scratch, start_new_session=True
            )
        self.deadline = time.monotonic() + timeout

    def __enter__(self) -> RunningProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def result(self) -> LoaderResult:
        """Wait for the probe (until its own deadline) and read what the loader did."""
        where = self.package_root.joinpath(*self.import_name.split("."))
        try:
            self.child.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise LoaderProbeError(
                f"{where}: importing the package for CC {_cc_text(self.cc)} did not finish in {self.timeout:g} s; "
                "its loader hangs",
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
        _kill_group(self.child)
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
    return f"{cc[0]}.{cc[1]}" if cc else "none (no GPU)"


def _relative(path: str | None, root: Path) -> str | None:
    if not path:
        return None
    resolved = Path(path).resolve()
    return resolved.relative_to(root).as_posix() if resolved.is_relative_to(root) else path
