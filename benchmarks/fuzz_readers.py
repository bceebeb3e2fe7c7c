"""Drive hostile inputs through verify's readers and count what goes wrong.

    .venv/bin/python benchmarks/fuzz_readers.py [--cases 100000] [--workers 2] [--seed 1] [--json out.json]

Three readers, each fed mutations of real inputs:
- ELF/fatbin: the nvcc-built fixtures (tests/fixtures/cuda/bin and the fixture packages), mutated where the
  reader looks: ELF and section header fields, fatbin container and entry header fields (set to 0, 1,
  header sizes +-1, 2**31, 2**63, ...), byte flips, truncation, repeated container headers (padding), and
  splices of two files. Read by path (`read_entries`, with and without kernel listing) and through the
  single-pass stream reader that `--wheel` uses.
- wheel: wheels built from the fixture packages, mutated at the zip level: local and central header sizes,
  compression methods, flags (encryption), name lengths, member names (`..`, absolute, file/folder
  clashes), duplicated members, truncation and byte flips. Opened with `open_wheel` and every .so read.
- folder: a package folder holding a mutated .so plus hostile entries (a FIFO named .so, a link loop, a
  folder named .so, a link out of the tree). Opened with `open_path` and every .so read.

Each case runs in-process in a forked worker under RLIMIT_AS (--memory-mb) with a per-case time cap
(--case-seconds, SIGALRM; a worker stuck in C past 5x that is killed and counted). A case ends as:
handled (entries, or a bwstack error naming the problem), crash (any other exception, or the worker
died), timeout, or memory (MemoryError under the cap: the reader trusted a size). The report gives
cases / crashes / time-outs / memory / peak RSS of a worker / wall time, and the first crashes with
their seeds, so one can be replayed with `--replay SEED`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import select
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import warnings
import zipfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
NASTY = [0, 1, 15, 16, 17, 63, 64, 65, 0x7F, 0xFF, 0xFFFF, 2**31, 2**32 - 1, 2**63, 2**64 - 1]
KINDS = ("fatbin", "fatbin", "wheel", "folder")  # fatbin mutations are the cheapest and most varied


class CaseTimeout(BaseException):
    """Raised by SIGALRM: a BaseException so no reader's `except Exception` can swallow it."""


def _alarm(_signum: int, _frame: object) -> None:
    raise CaseTimeout


# --- Inputs -----------------------------------------------------------------------------------------------


def load_corpus() -> tuple[list[bytes], list[dict[str, bytes]]]:
    binaries = [p.read_bytes() for p in sorted((FIXTURES / "cuda" / "bin").iterdir()) if p.is_file()]
    packages = []
    for root in sorted((FIXTURES / "packages").iterdir()):
        files = {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        }
        packages.append(files)
        binaries += [data for name, data in files.items() if name.endswith(".so")]
    return binaries, packages


def structural_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of the header fields the reader trusts: ELF header, section headers, fatbin headers."""
    fields = [(0x04, 1), (0x05, 1), (0x20, 8), (0x28, 8), (0x3A, 2), (0x3C, 2), (0x3E, 2)]
    if len(data) < 64 or data[:4] != b"\x7fELF":
        return fields
    shoff, _, _, _shentsize, shnum, _ = struct.unpack_from("<QIHHHH", data, 0x28)
    for index in range(min(shnum, 64)):
        base = shoff + index * 64
        if base + 64 <= len(data):
            fields += [(base, 4), (base + 4, 4), (base + 0x18, 8), (base + 0x20, 8)]
    at = data.find(struct.pack("<I", 0xBA55ED50))
    while 0 <= at < len(data) - 16:
        fields += [(at, 4), (at + 4, 2), (at + 6, 2), (at + 8, 8)]
        entry = at + struct.unpack_from("<H", data, at + 6)[0]
        for _ in range(32):
            if entry + 64 > len(data):
                break
            fields += [(entry + o, w) for o, w in ((0, 2), (4, 4), (8, 8), (0x10, 4), (0x1C, 4), (0x28, 8), (0x38, 8))]
            header, payload = struct.unpack_from("<IQ", data, entry + 4)
            if header < 64:
                break
            entry += header + payload
        at = data.find(struct.pack("<I", 0xBA55ED50), at + 4)
    return fields


def _put(data: bytearray, offset: int, width: int, value: int) -> None:
    if offset >= 0 and offset + width <= len(data):
        data[offset : offset + width] = (value % (1 << (8 * width))).to_bytes(width, "little")


def mutate_binary(rng: random.Random, corpus: list[bytes], fields: list[list[tuple[int, int]]]) -> bytes:
    pick = rng.randrange(len(corpus))
    data = bytearray(corpus[pick])
    for _ in range(rng.choice((1, 1, 2, 3, 5))):
        how = rng.random()
        if how < 0.55 and fields[pick]:
            offset, width = rng.choice(fields[pick])
            value = rng.choice(NASTY) if rng.random() < 0.7 else rng.getrandbits(8 * width)
            if rng.random() < 0.2:  # near the true value: off by a little
                value = int.from_bytes(data[offset : offset + width], "little") + rng.choice((-65, -1, 1, 16, 64))
            _put(data, offset, width, value)
        elif how < 0.7:
            for _ in range(rng.randint(1, 16)):
                data[rng.randrange(len(data))] = rng.getrandbits(8)
        elif how < 0.8:
            del data[rng.randrange(len(data)) :]
            if not data:
                break
        elif how < 0.9:  # repeated container headers, as padding or in place of the fatbin
            header = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, rng.choice((0, 16, 64, 2**40)))
            at = rng.randrange(len(data) + 1)
            data[at:at] = header * rng.choice((1, 2, 100, 4096, 65536))
        else:
            other = rng.choice(corpus)
            at, cut = rng.randrange(len(data) + 1), rng.randrange(len(other) + 1)
            data[at:] = other[cut:]
    return bytes(data)


def build_wheel(members: list[tuple[str, bytes]], method: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        for name, data in members:
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=method)
    return buffer.getvalue()


def mutate_wheel(rng: random.Random, binaries: list[bytes], packages: list[dict[str, bytes]]) -> bytes:
    files = dict(rng.choice(packages))
    members = list(files.items())
    if rng.random() < 0.3:  # a hostile binary inside an otherwise good wheel
        name = rng.choice([n for n in files if n.endswith(".so")])
        members.append((name, mutate_binary(rng, binaries, [[] for _ in binaries])))
    if rng.random() < 0.25:
        members.append(
            rng.choice(
                [
                    ("../evil.so", b"x"),
                    ("/abs/evil.so", b"x"),
                    ("sgl_kernel/__init__.py/x.so", b"x"),  # a file and a folder of one name
                    ("sgl_kernel/" + "d/" * 200 + "deep.so", b""),
                    (members[0][0], b"duplicate"),
                    ("sgl_kernel/\x00nul.so", b""),
                    ("sgl_kernel/big.txt", bytes(rng.choice((1 << 20, 70 << 20)))),
                ]
            )
        )
    method = rng.choice((zipfile.ZIP_DEFLATED, zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED))
    try:
        data = bytearray(build_wheel(members, method))
    except (ValueError, OSError):
        data = bytearray(build_wheel(list(files.items()), method))
    for _ in range(rng.choice((0, 1, 1, 2, 4))):
        how = rng.random()
        records = [(b"PK\x03\x04", (6, 8, 14, 18, 22, 26, 28)), (b"PK\x01\x02", (8, 10, 16, 20, 24, 28, 42))]
        signature, offsets = rng.choice(records)
        spots = []
        at = data.find(signature)
        while at >= 0:
            spots.append(at)
            at = data.find(signature, at + 4)
        if how < 0.6 and spots:
            offset = rng.choice(spots) + rng.choice(offsets)
            width = 2 if offset - spots[0] in (6, 8, 10, 26, 28) else 4
            value = rng.choice([0, 1, 2, 8, 12, 14, 93, 99, 0xFFFF, 0xFFFFFFFF, 1 << 31]) if width == 4 else None
            _put(data, offset, width, value if value is not None else rng.choice([0, 1, 8, 9, 12, 14, 93, 99, 0xFFFF]))
        elif how < 0.8:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.getrandbits(8)
        else:
            del data[rng.randrange(len(data)) :]
            if not data:
                break
    return bytes(data)


# --- Cases ------------------------------------------------------------------------------------------------


def run_case(kind: str, seed: int, state: dict, scratch: Path) -> None:
    """One hostile input through one reader; returns quietly or raises what the reader raised."""
    from bwstack.errors import BwstackError, FatbinError
    from bwstack.verify import sources
    from bwstack.verify.fatbin import is_cuda_binary, read_entries, read_source_entries
    from bwstack.verify.stream_capture import WindowMiss, capture
    from bwstack.verify.wheel_limits import Limits

    rng = random.Random(seed)
    binaries, packages, fields = state["binaries"], state["packages"], state["fields"]
    if kind == "fatbin":
        data = mutate_binary(rng, binaries, fields)
        path = scratch / "case.so"
        path.write_bytes(data)
        for kernels in (False, True):
            with contextlib.suppress(FatbinError):
                read_entries(path, kernels=kernels)
        with contextlib.suppress(FatbinError):
            is_cuda_binary(path)
        with contextlib.suppress(WindowMiss, FatbinError):
            read_source_entries(capture(io.BytesIO(data), len(data), "case.so"))
    elif kind == "wheel":
        path = scratch / "case.whl"
        path.write_bytes(mutate_wheel(rng, binaries, packages))
        try:
            with sources.open_wheel(path, Limits(32 << 20)) as tree:
                for relative in tree.binaries:
                    with contextlib.suppress(FatbinError):
                        tree.read(relative, kernels=rng.random() < 0.2)
        except BwstackError:
            pass
    else:
        root = scratch / "folder"
        shutil.rmtree(root, ignore_errors=True)
        (root / "sgl_kernel" / "sm100").mkdir(parents=True)
        (root / "sgl_kernel" / "__init__.py").write_text("")
        (root / "sgl_kernel" / "sm100" / "common_ops.abi3.so").write_bytes(mutate_binary(rng, binaries, fields))
        hostile = rng.choice(("fifo", "loop", "dir", "outside", "none"))
        target = root / "sgl_kernel" / "odd.so"
        if hostile == "fifo":
            os.mkfifo(target)
        elif hostile == "loop":
            (root / "sgl_kernel" / "loop").symlink_to(root / "sgl_kernel")
            target.symlink_to(target)
        elif hostile == "dir":
            target.mkdir()
        elif hostile == "outside":
            target.symlink_to("/etc/hostname")
        try:
            with sources.open_path(root) as tree:
                for relative in tree.binaries:
                    with contextlib.suppress(FatbinError):
                        tree.read(relative)
        except BwstackError:
            pass


def worker(index: int, seeds: list[tuple[int, str]], args: argparse.Namespace, out: int) -> None:
    """Runs in a forked child: caps its address space, runs its cases, writes one JSON line per case."""
    limit = args.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _alarm)
    warnings.simplefilter("ignore")  # zipfile warns about the duplicated names we write on purpose
    binaries, packages = load_corpus()
    state = {"binaries": binaries, "packages": packages, "fields": [structural_fields(b) for b in binaries]}
    scratch = Path(tempfile.mkdtemp(prefix=f"worker-{index}-", dir=args.scratch))
    tempfile.tempdir = str(scratch)  # the readers' own temp copies land in this worker's scratch too
    try:
        for seed, kind in seeds:
            outcome, detail = "handled", ""
            signal.setitimer(signal.ITIMER_REAL, args.case_seconds)
            started = time.monotonic()
            try:
                run_case(kind, seed, state, scratch)
            except CaseTimeout:
                outcome = "timeout"
            except MemoryError:
                outcome, detail = "memory", "MemoryError"
            except Exception as error:
                outcome = "crash"
                detail = "".join(traceback.format_exception_only(error)).strip()[:300]
                frames = traceback.extract_tb(error.__traceback__)
                ours = [f for f in frames if "/verify/" in f.filename or "/bwstack/" in f.filename] or frames
                detail += f" @ {ours[-1].filename.rsplit('/', 1)[-1]}:{ours[-1].lineno}"
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            record = {"seed": seed, "kind": kind, "outcome": outcome, "detail": detail}
            record["ms"] = round((time.monotonic() - started) * 1000, 2)
            os.write(out, (json.dumps(record) + "\n").encode())
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        os.write(out, (json.dumps({"done": True, "peak_rss_kb": rss}) + "\n").encode())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fuzz(cases: int, workers: int = 2, seed: int = 1, case_seconds: float = 5.0, memory_mb: int = 1024) -> dict:
    """Run `cases` cases over `workers` forked workers; the summary as a dict."""
    # One folder for all workers, removed at the end even if a killed worker could not remove its own.
    args = argparse.Namespace(
        case_seconds=case_seconds, memory_mb=memory_mb, scratch=tempfile.mkdtemp(prefix="bwstack-fuzz-")
    )
    master = random.Random(seed)
    todo = [(master.getrandbits(48), master.choice(KINDS)) for _ in range(cases)]
    started = time.monotonic()
    counts: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    crashes: list[dict] = []
    peak_rss_kb = 0
    slowest = 0.0
    queue = [todo[i::workers] for i in range(workers)]
    running: dict[int, dict] = {}

    def spawn(slot: int, seeds: list[tuple[int, str]]) -> None:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's code
            os.close(read)
            code = 0
            try:
                worker(slot, seeds, args, write)
            except BaseException:
                code = 1
            os._exit(code)
        os.close(write)
        running[read] = {"pid": pid, "seeds": seeds, "done": 0, "buffer": b"", "last": time.monotonic()}

    for slot in range(workers):
        if queue[slot]:
            spawn(slot, queue[slot])
    while running:
        ready, _, _ = select.select(list(running), [], [], 1.0)
        now = time.monotonic()
        for fd in list(running):
            job = running[fd]
            if fd in ready:
                chunk = os.read(fd, 1 << 16)
                job["last"] = now
                if chunk:
                    job["buffer"] += chunk
                    *lines, job["buffer"] = job["buffer"].split(b"\n")
                    for line in lines:
                        record = json.loads(line)
                        if record.get("done"):
                            peak_rss_kb = max(peak_rss_kb, record["peak_rss_kb"])
                            continue
                        job["done"] += 1
                        counts[record["outcome"]] += 1
                        by_kind[record["kind"]] += 1
                        slowest = max(slowest, record["ms"])
                        if record["outcome"] != "handled" and len(crashes) < 50:
                            crashes.append(record)
                    continue
            elif now - job["last"] < case_seconds * 5:
                continue
            else:
                os.kill(job["pid"], signal.SIGKILL)  # stuck where SIGALRM cannot reach (inside C)
            # The worker ended (or was killed): account for the case it was on, restart after it.
            os.close(fd)
            _, status = os.waitpid(job["pid"], 0)
            del running[fd]
            rest = job["seeds"][job["done"] :]
            if rest:  # it stopped before its last case: the case it was on is the finding
                seed_, kind = rest[0]
                outcome = "timeout" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL else "crash"
                counts[outcome] += 1
                by_kind[kind] += 1
                if len(crashes) < 50:
                    detail = f"worker status {status}"
                    crashes.append({"seed": seed_, "kind": kind, "outcome": outcome, "detail": detail})
                if rest[1:]:
                    spawn(len(running), rest[1:])
    shutil.rmtree(args.scratch, ignore_errors=True)
    return {
        "cases": sum(counts.values()),
        "by_reader": dict(by_kind),
        "handled": counts["handled"],
        "crashes": counts["crash"],
        "timeouts": counts["timeout"],
        "memory": counts["memory"],
        "peak_rss_mb": round(peak_rss_kb / 1024, 1),
        "slowest_case_ms": slowest,
        "wall_s": round(time.monotonic() - started, 1),
        "workers": workers,
        "memory_cap_mb": memory_mb,
        "case_cap_s": case_seconds,
        "seed": seed,
        "findings": crashes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=100_000, help="hostile inputs to try (default 100000)")
    parser.add_argument("--workers", type=int, default=2, help="forked workers (default 2)")
    parser.add_argument("--seed", type=int, default=1, help="master seed; the same seed gives the same cases")
    parser.add_argument("--case-seconds", type=float, default=5.0, help="time cap per case (default 5)")
    parser.add_argument("--memory-mb", type=int, default=1024, help="RLIMIT_AS per worker in MiB (default 1024)")
    parser.add_argument("--json", type=Path, help="write the summary here as JSON")
    parser.add_argument("--replay", type=int, help="run one case by its seed in this process, with a traceback")
    parser.add_argument("--kind", choices=sorted(set(KINDS)), default="fatbin", help="reader for --replay")
    args = parser.parse_args()
    if args.replay is not None:
        binaries, packages = load_corpus()
        state = {"binaries": binaries, "packages": packages, "fields": [structural_fields(b) for b in binaries]}
        scratch = Path(tempfile.mkdtemp(prefix="bwstack-fuzz-replay-"))
        try:
            run_case(args.kind, args.replay, state, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        print("handled")
        return 0
    summary = fuzz(args.cases, args.workers, args.seed, args.case_seconds, args.memory_mb)
    shown = {k: v for k, v in summary.items() if k != "findings"}
    print(json.dumps(shown, indent=2))
    for finding in summary["findings"][:10]:
        print(f"  {finding['outcome']}: --kind {finding['kind']} --replay {finding['seed']}: {finding['detail']}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if summary["crashes"] or summary["timeouts"] or summary["memory"] else 0


if __name__ == "__main__":
    sys.exit(main())
