"""bwstack test fixture: a stand-in for sgl_kernel/load_utils.py, written for bwstack's tests.

It reproduces the real package's choice of binary (as bwstack's docs/facts.md section 4 describes it):
compute capability 90 loads sm90/common_ops.*, every other CC (12.0 and 12.1 included) and "no GPU"
load sm100/common_ops.*; if that fails, sgl_kernel/common_ops.*, and last a plain `import common_ops`.
The CC comes from torch, and the module is loaded with importlib's spec_from_file_location.
"""

import glob
import importlib
import importlib.util
import os

import torch

# Compute capability (major * 10 + minor) -> folder holding that build of common_ops.
ARCH_DIRS = {90: "sm90"}
DEFAULT_DIR = "sm100"
_COMPILED = (".so", ".pyd", ".dll")


def _get_compute_capability():
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.major * 10 + props.minor


def _candidates(pattern):
    """Compiled extensions first (common_ops.abi3.so before a stray common_ops.py)."""
    found = glob.glob(pattern)
    return [f for f in found if any(ext in f for ext in _COMPILED)] + [
        f for f in found if not any(ext in f for ext in _COMPILED)
    ]


def _load_from(path):
    spec = importlib.util.spec_from_file_location("common_ops", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot build a module spec for {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_architecture_specific_ops():
    here = os.path.dirname(os.path.abspath(__file__))
    cc = _get_compute_capability()
    subdir = ARCH_DIRS.get(cc, DEFAULT_DIR)
    errors = []
    for pattern in (os.path.join(here, subdir, "common_ops.*"), os.path.join(here, "common_ops.*")):
        files = _candidates(pattern)
        if not files:
            continue
        try:
            return _load_from(files[0])
        except Exception as error:  # the real loader also swallows and falls through
            errors.append(f"{files[0]}: {type(error).__name__}: {error}")
    try:
        return importlib.import_module("common_ops")
    except Exception as error:
        errors.append(f"import common_ops: {type(error).__name__}: {error}")
    raise ImportError(f"sgl_kernel: no common_ops could be loaded for compute capability {cc}: " + "; ".join(errors))
