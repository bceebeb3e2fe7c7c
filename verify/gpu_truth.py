"""Ground truth on a real GPU: does the driver load exactly what verify says runs?

verify's verdicts come from NVIDIA's documented rules. Where a GPU is at hand, this checks them against
the driver itself: every fatbin container of every fixture .so is handed to `cuModuleLoadData` on GPU 0,
and the driver's answer (loaded, or CUDA_ERROR_NO_BINARY_FOR_GPU) is compared with `best_runs` for the
GPU's compute capability. The driver is reached through ctypes on libcuda.so.1 (it ships with the driver,
so nothing needs installing on a bare GPU machine); this module is that seam, and nothing else in bwstack
calls the CUDA driver.

    python -m bwstack.verify.gpu_truth [--out DIR] FILE_OR_FOLDER ...
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bwstack.errors import BwstackError
from bwstack.recipes.archs import CC, cc_text
from bwstack.verify.compat import Runs, best_runs
from bwstack.verify.fatbin import read_containers, read_entries

CUDA_SUCCESS = 0
CUDA_ERROR_NO_BINARY_FOR_GPU = 209
_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR


@dataclass(frozen=True)
class Container:
    """One fatbin container: its bytes, as the driver takes them, and where it sits in the file."""

    offset: int
    data: bytes


def containers(path: Path) -> list[Container]:
    """Every container of the file's fatbin section, header included (what cuModuleLoadData accepts)."""
    return [Container(offset, data) for offset, data in read_containers(path)]


class CudaDriver:
    """The few CUDA driver calls this check needs, through ctypes. Raises BwstackError without a driver."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise BwstackError(f"no CUDA driver: libcuda.so.1 cannot be loaded ({error})") from None
        self._call("cuInit", ctypes.c_uint(0))
        self.device = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(self.device), ctypes.c_int(0))
        self.context = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.device)
        self._call("cuCtxSetCurrent", self.context)

    def _call(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code != CUDA_SUCCESS:
            raise BwstackError(f"{name} failed with CUDA error {code}")

    def compute_capability(self) -> CC:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("cuDeviceGetAttribute", ctypes.byref(major), ctypes.c_int(_CC_MAJOR), self.device)
        self._call("cuDeviceGetAttribute", ctypes.byref(minor), ctypes.c_int(_CC_MINOR), self.device)
        return major.value, minor.value

    def load(self, image: bytes) -> int:
        """cuModuleLoadData's result code for this image (the module is unloaded again on success)."""
        module = ctypes.c_void_p()
        buffer = ctypes.create_string_buffer(image, len(image))
        code = self.lib.cuModuleLoadData(ctypes.byref(module), buffer)
        if code == CUDA_SUCCESS:
            self.lib.cuModuleUnload(module)
        return int(code)

    def close(self) -> None:
        self.lib.cuDevicePrimaryCtxRelease(self.device)


@dataclass(frozen=True)
class Comparison:
    file: str
    container_offset: int
    entries: list[str]
    verify_says: str  # sass | sass-family | ptx-jit | none
    via: str | None
    driver_code: int  # 0 loaded; 209 no binary for this GPU; others: see the CUDA driver API
    agrees: bool


def compare(path: Path, cc: CC, load: object) -> list[Comparison]:
    """verify's verdict against the driver's for each container of one file. `load` is CudaDriver.load."""
    entries = read_entries(path)
    results = []
    for container in containers(path):
        inside = [e for e in entries if container.offset <= e.offset < container.offset + len(container.data)]
        if not inside:
            continue  # nvcc emits empty containers (a 16-byte header, no entries): nothing to load
        runs, via = best_runs(inside, cc)
        code = load(container.data)  # type: ignore[operator]
        expect_load = runs is not Runs.NONE
        agrees = (code == CUDA_SUCCESS) if expect_load else (code == CUDA_ERROR_NO_BINARY_FOR_GPU)
        results.append(
            Comparison(
                str(path),
                container.offset,
                [e.arch for e in inside],
                str(runs),
                via.arch if via else None,
                code,
                agrees,
            )
        )
    return results


def _targets(paths: list[str]) -> list[Path]:
    roots = [Path(p) for p in paths]
    found: list[Path] = []
    for root in roots:
        found += sorted(p for p in root.rglob("*.so")) if root.is_dir() else [root]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help=".so files or folders to check (every .so below a folder)")
    parser.add_argument("--out", type=Path, help="write gpu-truth.json into this folder")
    options = parser.parse_args(argv)
    try:
        driver = CudaDriver()
    except BwstackError as error:
        print(f"bwstack: error: {error.one_line()}", file=sys.stderr)
        return 2
    try:
        cc = driver.compute_capability()
        results = [c for path in _targets(options.paths) for c in compare(path, cc, driver.load)]
    finally:
        driver.close()
    disagreements = [r for r in results if not r.agrees]
    for result in results:
        mark = "ok  " if result.agrees else "DIFF"
        print(
            f"{mark} {result.file}@{result.container_offset}: verify={result.verify_says} "
            f"driver={result.driver_code} ({', '.join(result.entries)})"
        )
    print(f"CC {cc_text(cc)}: {len(results) - len(disagreements)} of {len(results)} containers agree")
    if options.out:
        options.out.mkdir(parents=True, exist_ok=True)
        record = {"cc": list(cc), "results": [asdict(r) for r in results]}
        (options.out / "gpu-truth.json").write_text(json.dumps(record, indent=2))
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
