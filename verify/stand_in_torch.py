"""The stand-in `torch` package the loader probe (loader_probe.py) puts first on the child's sys.path.

Written out as source text: the probe child imports it as `torch`, and nothing of bwstack is importable
there. `torch/__init__.py` is STAND_IN_TORCH, `torch/version.py` is STAND_IN_TORCH_VERSION (a file,
because loaders such as vllm read it from disk without importing torch).
"""

STAND_IN_TORCH = r'''
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

STAND_IN_TORCH_VERSION = """\
__version__ = "2.9.1"
cuda = "13.0"
hip = None
git_version = "bwstack-probe"
debug = False
"""
