"""Per-kernel listing (`verify --kernels`) against `cuobjdump -symbols` on the same file, one run, as ratios.

    .venv/bin/python benchmarks/bench_kernels.py [FILE] [--cuobjdump PATH] [--repeats 3] [--json OUT]

FILE defaults to sgl_kernel/flash_ops.abi3.so (1.1 GB) of the cached sglang-kernel 0.4.10 wheel
(tests/released.toml; `python3 scripts/prefetch.py`), extracted once into benchmarks/.cache/. Ours is a
fresh process calling `read_entries(FILE, kernels=True)` and counting kernel names over all entries;
cuobjdump's count is its ENTRY symbol lines. The two counts are printed side by side: they must agree.
Time is the median after one warm-up run; peak memory is each child's ru_maxrss (see bench_fatbin.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fatbin import CACHE, REPO, find_cuobjdump, measure, reader_env

TARGET_SPEEDUP = 4.0  # issue 10: at least 4x faster than cuobjdump -symbols ...
TARGET_PEAK_MB = 100.0  # ... at no more than 100 MB peak
MEMBER = "sgl_kernel/flash_ops.abi3.so"

_COUNT = (
    "import sys; from pathlib import Path; from verify.fatbin import read_entries; "
    "print(sum(len(e.kernels) for e in read_entries(Path(sys.argv[1]), kernels=True)))"
)
_CUOBJDUMP_COUNT = "{0} -symbols {1} | grep -c ' ENTRY '"


def default_file() -> Path:
    sys.path.insert(0, str(REPO))
    from tests.released import prefetch

    wheel = prefetch.cached("sglang-kernel", "0.4.10")
    if wheel is None:
        raise SystemExit("sglang-kernel 0.4.10 is not cached: run `python3 scripts/prefetch.py`")
    target = CACHE / wheel.stem / MEMBER
    with zipfile.ZipFile(wheel) as archive:
        if not target.exists() or target.stat().st_size != archive.getinfo(MEMBER).file_size:
            target.parent.parent.mkdir(parents=True, exist_ok=True)
            archive.extract(MEMBER, CACHE / wheel.stem)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("file", nargs="?", type=Path, help="a CUDA .so (default: sglang-kernel 0.4.10 flash_ops)")
    parser.add_argument("--cuobjdump", type=Path, help="cuobjdump binary (default: the nvidia-cuda-cuobjdump wheel's)")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per tool (median reported)")
    parser.add_argument("--json", type=Path, help="write the measurements here as JSON")
    args = parser.parse_args(argv)
    path = args.file or default_file()
    cuobjdump = args.cuobjdump or find_cuobjdump()

    ours = measure([sys.executable, "-c", _COUNT, str(path)], repeats=args.repeats, env=reader_env())
    # The shell pipeline's grep is tiny; ru_maxrss of the wait is the largest child's (cuobjdump's).
    theirs = measure(["/bin/sh", "-c", _CUOBJDUMP_COUNT.format(cuobjdump, path)], repeats=args.repeats)
    ours_n, theirs_n = int(ours.stdout_tail.split()[-1]), int(theirs.stdout_tail.split()[-1])
    speedup = theirs.median_s / ours.median_s
    size = path.stat().st_size / 2**20
    print(f"{path.name}: {size:.0f} MB")
    print(f"  ours       {ours.median_s:7.3f} s  {ours.peak_rss_mb:8.1f} MB peak  {ours_n} kernel names")
    print(f"  cuobjdump  {theirs.median_s:7.3f} s  {theirs.peak_rss_mb:8.1f} MB peak  {theirs_n} ENTRY symbols")
    fast, small = speedup >= TARGET_SPEEDUP, ours.peak_rss_mb <= TARGET_PEAK_MB
    print(
        f"  speed-up {speedup:.2f}x (target >= {TARGET_SPEEDUP:.0f}x: {'met' if fast else 'MISSED'}); "
        f"peak {ours.peak_rss_mb:.0f} MB (target <= {TARGET_PEAK_MB:.0f} MB: {'met' if small else 'MISSED'}); "
        f"counts {'agree' if ours_n == theirs_n else 'DIFFER'}"
    )
    if args.json:
        payload = {"file": str(path), "size_mb": size, "ours": asdict(ours), "cuobjdump": asdict(theirs)}
        args.json.write_text(json.dumps(payload | {"speedup": speedup}, indent=2) + "\n")
    return 0 if ours_n == theirs_n else 1


if __name__ == "__main__":
    sys.exit(main())
