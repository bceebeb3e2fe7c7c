"""verify's resource contract, measured: peak memory and peak temp disk as a function of the input.

    .venv/bin/python benchmarks/bench_verify_resources.py [--sizes 16,256,1024] [--wheel REAL.whl] [--json out.json]

Each row runs the whole task, `invoke verify --arch sm120 --wheel W --json /dev/null`, in a fresh process
with TMPDIR pointed at an empty folder, while a sampler (every 20 ms) records the peak RSS of the task and
all its children (the loader probes, the reaper shims) and the peak bytes under TMPDIR. Inputs:
- a wheel whose one .so member is a real nvcc-built fixture padded with zeros to N MiB (deflated, so the
  wheel is tiny and the member large), without and with --kernels (which reads an on-disk copy);
- a member padded with 16 MiB of fatbin container headers (the hostile case of issue 14);
- optionally a real wheel (e.g. sglang-kernel, whose largest member is 1.07 GB).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import psutil

from bwstack.verify import elf

REPO = Path(__file__).resolve().parent.parent
FIXTURE_PACKAGE = REPO / "tests" / "fixtures" / "packages" / "good"
MIB = 1 << 20


def split_after_fatbin(data: bytes) -> tuple[bytes, bytes]:
    """The .so cut right after its fatbin, with every later offset (sections, section table) moved by `pad`
    bytes, so padding inserted at the cut keeps a valid ELF whose section table is still at the end: the
    shape of a real large library (big device code, small headers)."""
    source = elf.BytesSource(data, "fixture")
    header = elf.read_header(source)
    sections = elf.read_sections(source, header)
    fatbin = elf.find_section(sections, ".nv_fatbin")
    assert fatbin is not None
    cut = fatbin.offset + fatbin.size
    return data[:cut], data[cut:]


def moved(data: bytes, cut: int, pad: int) -> bytes:
    out = bytearray(data)
    source = elf.BytesSource(data, "fixture")
    header = elf.read_header(source)
    if header.shoff >= cut:
        struct.pack_into("<Q", out, 0x28, header.shoff + pad)
    for section in elf.read_sections(source, header):
        if section.offset >= cut:
            struct.pack_into("<Q", out, header.shoff + section.index * 64 + 0x18, section.offset + pad)
    return bytes(out)


def padded_wheel(folder: Path, megabytes: int, *, headers: bool = False) -> tuple[Path, int]:
    """The good fixture package as a wheel, its sm100 .so grown to `megabytes` MiB after its fatbin
    (zeros, or back-to-back fatbin container headers); (wheel, member size)."""
    wheel = folder / f"pad{megabytes}{'h' if headers else ''}.whl"
    target = "sgl_kernel/sm100/common_ops.abi3.so"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(FIXTURE_PACKAGE.rglob("*")):
            name = path.relative_to(FIXTURE_PACKAGE).as_posix()
            if not path.is_file() or "__pycache__" in name:
                continue
            if name != target:
                archive.write(path, name)
                continue
            head, tail = split_after_fatbin(path.read_bytes())
            data = moved(head + tail, len(head), megabytes * MIB)
            unit = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 0) if headers else bytes(16)
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as member:
                member.write(data[: len(head)])
                block = unit * (MIB // len(unit))
                for _ in range(megabytes):
                    member.write(block)
                member.write(data[len(head) :])
            size = len(data) + megabytes * MIB
    return wheel, size


def measure(args: list[str]) -> dict:
    """Run `invoke verify ARGS`; peak RSS of its process tree, peak temp bytes, seconds, exit code."""
    scratch = Path(tempfile.mkdtemp(prefix="bwstack-bench-tmp-"))
    env = {**os.environ, "TMPDIR": str(scratch)}
    started = time.monotonic()
    task = subprocess.Popen(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO), "verify", *args, "--json", "/dev/null"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    peak_rss = peak_task_rss = peak_disk = 0
    root = psutil.Process(task.pid)
    while task.poll() is None:
        total = 0
        try:
            task_rss = root.memory_info().rss
            total = task_rss + sum(c.memory_info().rss for c in root.children(recursive=True))
            peak_task_rss = max(peak_task_rss, task_rss)
        except psutil.Error:
            pass
        peak_rss = max(peak_rss, total)
        disk = 0
        for folder, _dirs, files in os.walk(scratch):
            for name in files:
                with contextlib.suppress(OSError):
                    disk += os.lstat(os.path.join(folder, name)).st_blocks * 512
        peak_disk = max(peak_disk, disk)
        time.sleep(0.02)
    stderr = task.stderr.read().decode(errors="replace") if task.stderr else ""
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "exit": task.returncode,
        "seconds": round(time.monotonic() - started, 2),
        "peak_rss_mb": round(peak_rss / MIB, 1),
        "peak_task_rss_mb": round(peak_task_rss / MIB, 1),
        "peak_temp_mb": round(peak_disk / MIB, 1),
        "stderr": stderr.strip()[-300:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,256,1024", help="padded member sizes in MiB (default 16,256,1024)")
    parser.add_argument("--wheel", type=Path, action="append", default=[], help="also measure this real wheel")
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bwstack-bench-") as folder:
        inputs: list[tuple[str, Path, int, list[str]]] = []
        for megabytes in (int(s) for s in args.sizes.split(",") if s):
            wheel, size = padded_wheel(Path(folder), megabytes)
            inputs.append((f"{megabytes} MiB member", wheel, size, []))
            inputs.append((f"{megabytes} MiB member, --kernels", wheel, size, ["--kernels"]))
        wheel, size = padded_wheel(Path(folder), 16, headers=True)
        inputs.append(("16 MiB of container headers", wheel, size, []))
        for real in args.wheel:
            largest = max(i.file_size for i in zipfile.ZipFile(real).infolist())
            inputs.append((real.name, real, largest, []))
        for label, wheel, size, extra in inputs:
            row = {"input": label, "wheel_mb": round(wheel.stat().st_size / MIB, 1), "largest_member_mb": size / MIB}
            row |= measure(["--arch", "sm120", "--wheel", str(wheel), *extra])
            rows.append(row)
            print(
                f"{label:44} wheel {row['wheel_mb']:>7} MB  member {row['largest_member_mb']:>7.1f} MB  "
                f"exit {row['exit']}  {row['seconds']:>6} s  peak RSS {row['peak_rss_mb']:>6} MB "
                f"(task {row['peak_task_rss_mb']} MB)  peak temp {row['peak_temp_mb']:>7} MB",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
