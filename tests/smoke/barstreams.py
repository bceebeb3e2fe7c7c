#!/usr/bin/env python3
"""Real multi-rank checkpoint-bar streams: K processes, each writing real `tqdm` bars (SGLang's own bar
format, read from the pinned wheel) and real `logging` lines with SGLang's `[time TPk]` prefix.

    python3 -m tests.smoke.barstreams record    # writes tests/fixtures/bar_streams/*.json (committed)

`record` runs every case once with each rank's stderr on its own pipe and keeps each rank's writes in
order (one chunk per read, in arrival order), so tests can replay any interleaving of the same real
writes. `live()` runs a case with every rank writing into one shared pipe, as schedulers share a stderr.

Cases: per-rank bars (SGLang up to 0.5.22, the incident: every rank draws one) or rank 0 only (0.5.23),
K = 1, 2 or 8, every bar completing (then rank 0 draws a `Capturing batches` bar, another loader's
bar in the same stream) or one drawing rank stuck inside its last shard (its bar stops at N-1).
"""

from __future__ import annotations

import json
import logging
import os
import random
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bar_streams"
SHARDS = 16


@dataclass(frozen=True)
class Case:
    ranks: int
    bars: str  # "per-rank" or "rank0"
    stuck: int | None  # the rank whose load never finishes its last shard

    @property
    def name(self) -> str:
        return f"{self.bars}-k{self.ranks}-{'complete' if self.stuck is None else f'stuck{self.stuck}'}"

    def draws(self, rank: int) -> bool:
        return self.bars == "per-rank" or rank == 0


CASES = (
    Case(1, "per-rank", None),
    Case(1, "per-rank", 0),
    Case(2, "per-rank", None),
    Case(2, "per-rank", 1),
    Case(8, "per-rank", None),
    Case(8, "per-rank", 5),
    Case(2, "rank0", None),
    Case(8, "rank0", None),
    Case(8, "rank0", 0),
)


def bar_format() -> str:
    """SGLang's BAR_FORMAT, read from the pinned wheel's source (never copied by hand)."""
    import ast
    import zipfile

    from tests.released import released_wheel

    with zipfile.ZipFile(released_wheel("sglang", "0.5.23")) as wheel:
        tree = ast.parse(wheel.read("sglang/srt/utils/common.py"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "BAR_FORMAT" for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError("BAR_FORMAT not found in sglang 0.5.23")


def rank_main(rank: int, case: Case, fmt: str, seed: int) -> None:
    """One rank: SGLang-shaped log lines, its checkpoint bar (if it draws one), then rank 0's capture bar."""
    from tqdm import tqdm

    random.seed(seed * 100 + rank)
    tag = f" TP{rank}" if case.ranks > 1 else ""  # SGLang adds TPn only when tp_size > 1
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s{tag}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    log = logging.getLogger(f"rank{rank}")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info("Init parallel begin.")
    time.sleep(random.uniform(0, 0.05))
    log.info("Load weight begin. avail mem=93.72 GB")
    shards = range(SHARDS)
    bar = tqdm(shards, desc="Loading safetensors checkpoint shards", bar_format=fmt, disable=not case.draws(rank))
    for shard in bar:
        time.sleep(random.uniform(0.02, 0.06))
        if shard % 5 == 2:
            log.info(f"shard {shard} read")  # other lines between bar updates, as a loader's warnings are
        if rank == case.stuck and shard == SHARDS - 1:
            time.sleep(3600)  # inside its last shard: its bar stays at N-1
    if case.stuck is not None:
        time.sleep(3600)  # every rank waits for the stuck one in the next collective
    if rank == 0:
        capture = tqdm(list(reversed([1, 2, 4, 8])))
        for bs in capture:
            capture.set_description(f"Capturing batches ({bs=} avail_mem={48.6:.2f} GB)")
            time.sleep(0.01)


def _spawn(rank: int, case: Case, fmt: str, seed: int, stderr: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.smoke.barstreams", "rank", str(rank), case.name, fmt, str(seed)]
    root = Path(__file__).resolve().parents[2]
    return subprocess.Popen(args, stderr=stderr, stdout=subprocess.DEVNULL, cwd=root)


def record(case: Case, fmt: str, seed: int = 0, quiet_s: float = 2.0) -> list[tuple[int, str]]:
    """Each rank on its own pipe; (rank, chunk) in arrival order, until every rank ended or all are quiet
    (after the first output: starting K interpreters on a busy machine takes a while)."""
    pipes, procs = {}, []
    for rank in range(case.ranks):
        reader, writer = os.pipe()
        procs.append(_spawn(rank, case, fmt, seed, writer))
        os.close(writer)
        pipes[reader] = rank
    chunks: list[tuple[int, str]] = []
    try:
        while pipes:
            ready, _, _ = select.select(list(pipes), [], [], quiet_s if chunks else 60.0)
            if not ready:
                break  # the stuck case: nothing more will come
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    os.close(fd)
                    del pipes[fd]
                else:
                    chunks.append((pipes[fd], data.decode()))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for fd in pipes:
            os.close(fd)
    return chunks


def live(case: Case, fmt: str, seed: int, quiet_s: float = 2.0) -> bytes:
    """Every rank writing into one shared pipe; the bytes as the reader got them."""
    reader, writer = os.pipe()
    procs = [_spawn(rank, case, fmt, seed, writer) for rank in range(case.ranks)]
    os.close(writer)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([reader], [], [], quiet_s if data else 60.0)
            chunk = os.read(reader, 65536) if ready else b""
            if not chunk:
                break
            data += chunk
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        os.close(reader)
    return data


def arrival(case: Case) -> list[tuple[int, str]]:
    """The recorded (rank, chunk) reads of `case`, in the order they arrived."""
    return [(rank, chunk) for rank, chunk in json.loads((FIXTURES / f"{case.name}.json").read_text())["chunks"]]


def load(case: Case) -> list[list[str]]:
    """The recorded reads of each rank of `case`, in order: streams[rank] = [chunk, ...]."""
    streams: list[list[str]] = [[] for _ in range(case.ranks)]
    for rank, chunk in arrival(case):
        streams[rank].append(chunk)
    return streams


def main(argv: list[str]) -> int:
    if argv[:1] == ["rank"]:
        rank, name, fmt, seed = int(argv[1]), argv[2], argv[3], int(argv[4])
        rank_main(rank, next(c for c in CASES if c.name == name), fmt, seed)
        return 0
    if argv[:1] == ["record"]:
        fmt = bar_format()
        FIXTURES.mkdir(parents=True, exist_ok=True)
        for case in CASES:
            chunks = record(case, fmt)
            head = json.dumps({"case": case.name, "ranks": case.ranks, "bar_format": fmt})[:-1]
            body = ",\n".join(json.dumps(chunk) for chunk in chunks)  # one write per line: reviewable
            (FIXTURES / f"{case.name}.json").write_text(f'{head}, "chunks": [\n{body}\n]}}\n')
            print(f"{case.name}: {len(chunks)} chunks")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
