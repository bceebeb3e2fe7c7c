"""The fatbin reader against NVIDIA's cuobjdump on the same files, in one run, as ratios.

    .venv/bin/python benchmarks/bench_fatbin.py [FILE ...] [--fetch] [--repeats 5] [--json OUT]

Each measurement is a fresh process doing the whole job (interpreter start-up included for ours):
`cuobjdump --list-elf --list-ptx FILE` against `read_entries(FILE)`, which lists the same entries
(and more: codecs, sizes, `f` suffixes). Wall time is the median over --repeats runs after one
warm-up (so both read from the page cache); peak memory is each child's own ru_maxrss from wait4.

--fetch downloads the public sglang-kernel wheel (`pip download --no-deps`) into benchmarks/.cache/
and benchmarks its largest .so (flash_ops.abi3.so, ~1.1 GB). Without FILE or --fetch it runs on the
committed test fixtures. `measure()` is the building block for other comparisons (e.g. verifying a
whole wheel against merely decompressing its .so members): give it any argv.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / "benchmarks" / ".cache"
FIXTURES = REPO / "tests" / "fixtures"
WHEEL_PROJECTS = ("sglang-kernel", "sgl-kernel")  # the PyPI name changed at 0.4; try the new one first
TARGET_SPEEDUP = 10.0  # issue 3: >= 10x faster than cuobjdump on the >= 1 GB file
TARGET_MEMORY = 1 / 20  # ... and <= 1/20 of its peak memory

_READER = (
    "import sys; from pathlib import Path; from verify.fatbin import read_entries; "
    "entries = read_entries(Path(sys.argv[1]), kernels=sys.argv[2] == '1'); print(len(entries))"
)


@dataclass(frozen=True)
class Measurement:
    argv: tuple[str, ...]
    median_s: float
    min_s: float
    peak_rss_mb: float  # the largest ru_maxrss over the runs
    runs: int
    stdout_tail: str


def measure(argv: list[str], *, repeats: int = 5, env: dict[str, str] | None = None) -> Measurement:
    """Run argv `repeats` times (after one unmeasured warm-up) in fresh processes: wall time and peak RSS."""
    times: list[float] = []
    peak_kb = 0
    out = ""
    for attempt in range(repeats + 1):
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        assert child.stdout is not None
        out = child.stdout.read().decode(errors="replace")
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)  # stop Popen from reaping it again
        if child.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {child.returncode}: {out[-500:]}")
        if attempt:  # the first run only warms the page cache
            times.append(elapsed)
            peak_kb = max(peak_kb, usage.ru_maxrss)  # kilobytes on Linux
    return Measurement(tuple(argv), statistics.median(times), min(times), peak_kb / 1024, repeats, out[-200:])


def reader_argv(path: Path, *, kernels: bool = False) -> list[str]:
    return [sys.executable, "-c", _READER, str(path), "1" if kernels else "0"]


def reader_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def find_cuobjdump() -> Path:
    """cuobjdump from the installed nvidia-cuda-cuobjdump wheel (nvidia/cu*/bin), wherever the venv is."""
    try:
        import nvidia
    except ImportError as error:
        raise SystemExit("cuobjdump is missing: pip install nvidia-cuda-cuobjdump") from error
    for root in nvidia.__path__:
        for candidate in sorted(Path(root).glob("cu*/bin/cuobjdump")):
            if os.access(candidate, os.X_OK):
                return candidate
    raise SystemExit("cuobjdump is missing: pip install nvidia-cuda-cuobjdump")


def fetch_wheel(cache: Path = CACHE) -> Path:
    """The newest sglang-kernel (else sgl-kernel) wheel for this platform, downloaded once into `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    for project in WHEEL_PROJECTS:
        stem = project.replace("-", "_")
        have = sorted(cache.glob(f"{stem}-*.whl"))
        if have:
            return have[-1]
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", project, "-d", str(cache)],
            capture_output=True,
            text=True,
        )
        have = sorted(cache.glob(f"{stem}-*.whl"))
        if done.returncode == 0 and have:
            return have[-1]
    raise SystemExit(f"could not download any of {WHEEL_PROJECTS} from PyPI into {cache}")


def largest_so(wheel: Path, cache: Path = CACHE) -> Path:
    """Extract (once) the wheel's largest .so member under cache/<wheel stem>/ and return its path."""
    with zipfile.ZipFile(wheel) as archive:
        member = max((i for i in archive.infolist() if ".so" in Path(i.filename).name), key=lambda i: i.file_size)
        target = cache / wheel.stem / member.filename
        if not target.exists() or target.stat().st_size != member.file_size:
            target.parent.mkdir(parents=True, exist_ok=True)
            archive.extract(member, cache / wheel.stem)
    return target


@dataclass(frozen=True)
class Comparison:
    path: str
    size_mb: float
    entries: int
    ours: Measurement
    cuobjdump: Measurement

    @property
    def speedup(self) -> float:
        return self.cuobjdump.median_s / self.ours.median_s

    @property
    def memory_ratio(self) -> float:
        return self.ours.peak_rss_mb / self.cuobjdump.peak_rss_mb

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "speedup": self.speedup, "memory_ratio": self.memory_ratio}


def compare(path: Path, cuobjdump: Path, *, repeats: int) -> Comparison:
    ours = measure(reader_argv(path), repeats=repeats, env=reader_env())
    theirs = measure([str(cuobjdump), "--list-elf", "--list-ptx", str(path)], repeats=repeats)
    entries = int(ours.stdout_tail.split()[-1])
    return Comparison(str(path), path.stat().st_size / 2**20, entries, ours, theirs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="CUDA .so files to read (default: the test fixtures)")
    parser.add_argument("--fetch", action="store_true", help="also benchmark the largest .so of sglang-kernel's wheel")
    parser.add_argument("--repeats", type=int, default=5, help="measured runs per tool and file (median reported)")
    parser.add_argument("--json", type=Path, help="write the measurements here as JSON")
    args = parser.parse_args(argv)

    files = list(args.files)
    if args.fetch:
        files.append(largest_so(fetch_wheel()))
    if not files:
        files = [FIXTURES / "cuda/bin/multi.so", FIXTURES / "packages/good/sgl_kernel/sm100/common_ops.abi3.so"]
    cuobjdump = find_cuobjdump()

    results = [compare(path, cuobjdump, repeats=args.repeats) for path in files]
    print(f"{'file':48} {'MB':>8} {'entries':>7} {'ours s':>8} {'cuobj s':>8} {'speedup':>8} "
          f"{'ours MB':>8} {'cuobj MB':>9} {'mem ratio':>9}")  # fmt: skip
    for r in results:
        print(
            f"{Path(r.path).name[:48]:48} {r.size_mb:8.1f} {r.entries:7d} {r.ours.median_s:8.3f} "
            f"{r.cuobjdump.median_s:8.3f} {r.speedup:7.2f}x {r.ours.peak_rss_mb:8.1f} {r.cuobjdump.peak_rss_mb:9.1f} "
            f"{r.memory_ratio:9.3f}"
        )
    # A child's ru_maxrss starts at its launcher's RSS (exec records the vforked parent's high-water mark),
    # so both tools carry the same floor; it is shown so small-file numbers are not misread.
    floor = measure(["/bin/true"], repeats=args.repeats)
    print(f"spawn floor (/bin/true launched the same way): {floor.peak_rss_mb:.1f} MB, {floor.median_s:.4f} s")
    big = [r for r in results if r.size_mb >= 1024]
    for r in big:
        fast, small = r.speedup >= TARGET_SPEEDUP, r.memory_ratio <= TARGET_MEMORY
        print(
            f"targets on {Path(r.path).name}: speed >= {TARGET_SPEEDUP:.0f}x {'met' if fast else 'MISSED'}, "
            f"memory <= 1/{1 / TARGET_MEMORY:.0f} {'met' if small else 'MISSED'}"
        )
    if args.json:
        payload = {"results": [r.to_dict() for r in results], "spawn_floor": asdict(floor)}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
