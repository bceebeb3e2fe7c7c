#!/usr/bin/env python3
"""An SGLang start-up emulator: SGLang 0.5.23's start-up log (docs/smoke.md), a real HTTP server, and the
ways a start goes wrong, chosen with --scenario. Ours, written for smoke's tests; no SGLang code in it.

The main process prints `server_args={...}` and starts one child process per TP rank (--ranks, default
--tp, default 2). Each rank logs `[YYYY-MM-DD HH:MM:SS TPn] ...` lines and draws a tqdm-style checkpoint
bar with carriage returns, unprefixed: every rank, as the incident's SGLang did (--bars per-rank, the
default), or rank 0 only, as 0.5.23 does (--bars rank0). Like tqdm, a bar's close redraws its last state
and then writes its newline separately, and rank r starts r steps later, so other ranks' lines land
glued to bar updates, exactly as several schedulers writing into one stderr do. When every rank is done
the main process opens the HTTP server (/health 503 until warm-up ends, /v1/models, /v1/completions)
and prints uvicorn's lines.

Scenarios:
  healthy                the whole sequence, then ready
  incident               bars reach N/N on every rank, then silence: every process asleep, nothing listens
  crash-no-kernel-image  rank 0 dies in CUDA graph capture with "no kernel image is available", exit 1
  capture-hang           every rank falls asleep after `Capture target decode CUDA graph begin`
  draft-capture-hang     speculative decoding (as --speculative): the draft model loads, the target's verify
                         graph is captured, then TP0 falls asleep in `Capture draft decode CUDA graph begin`
  slow-progress          a slow checkpoint (one shard per --shard-s) and a silent but CPU-busy capture
                         (--busy-s), each longer than a stall timeout, then ready: not a hang
  busy-silent            rank 0 spins the CPU without a word after `Load weight begin`
  health-503             listens, but /health answers 503 forever
  bad-completion         healthy, but /v1/completions returns no choices
  completion-never-returns  /health 200 and /v1/models answer, but POST /v1/completions never replies (the
                         request sleeps forever: no log line, no CPU)
  exit-at-once           prints an argument error and exits 2 before anything else
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import serving  # tests/emulator/serving.py: run as a script, this folder is on sys.path

SCENARIOS = (
    "healthy",
    "incident",
    "crash-no-kernel-image",
    "capture-hang",
    "draft-capture-hang",
    "slow-progress",
    "busy-silent",
    "health-503",
    "bad-completion",
    "completion-never-returns",
    "exit-at-once",
)


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def emit(text: str, rank: int | None = None) -> None:
    """One log line in one write(2), so lines from several ranks never mix mid-line."""
    prefix = f"[{stamp()} TP{rank}] " if rank is not None else f"[{stamp()}] "
    os.write(2, (prefix + text + "\n").encode())


def raw(text: str) -> None:
    os.write(2, text.encode())


def bar(label: str, done: int, total: int, started: float) -> str:
    elapsed = max(time.monotonic() - started, 1e-6)
    rate = done / elapsed
    left = (total - done) / rate if rate else 0.0
    percent = int(100 * done / total)

    def clock(seconds: float) -> str:
        return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"

    eta = clock(left) if done else "?"
    speed = f"{rate:5.2f}it/s" if done else "?it/s"
    return f"{label}: {percent:3d}% Completed | {done}/{total} [{clock(elapsed)}<{eta}, {speed}]"


def checkpoint_bar(total: int, shard_s: float) -> None:
    """tqdm's way: '\\r' + state for each update, the final state again on close, then '\\n' (its own write)."""
    label = "Loading safetensors checkpoint shards"
    started = time.monotonic()
    raw("\r" + bar(label, 0, total, started))
    for done in range(1, total + 1):
        time.sleep(shard_s)
        raw("\r" + bar(label, done, total, started))
    raw("\r" + bar(label, total, total, started))
    raw("\n")


def spin(seconds: float | None) -> None:
    """Burn CPU without a word (a silent compile or capture); forever when seconds is None."""
    deadline = None if seconds is None else time.monotonic() + seconds
    value = 0
    while deadline is None or time.monotonic() < deadline:
        value = (value * 1103515245 + 12345) % (1 << 31)


def process_weights_after_loading() -> None:
    """The incident: the checkpoint is read and then nothing happens, asleep, forever."""
    while True:
        time.sleep(3600)


def draft_capture() -> None:
    """A draft graph capture that never returns, asleep."""
    while True:
        time.sleep(3600)


def scheduler_event_loop() -> None:
    """A ready rank: idle until requests come (the emulator answers them in the main process)."""
    threading.Event().wait()


def run_rank(rank: int, args: argparse.Namespace, ready_fd: int | None) -> None:  # noqa: C901
    # Complex on purpose: one straight script of SGLang's start-up, each scenario a branch at the step where it
    # diverges, so a reader sees the whole sequence a rank logs in one place, in the order SGLang logs it.
    threading.Thread(target=threading.Event().wait, name="watchdog", daemon=True).start()  # 'Sl', like a scheduler
    step = args.step_s
    emit("Init parallel begin.", rank)
    time.sleep(step)
    emit(f"Init parallel ends. elapsed={step:.2f} s", rank)
    emit("Memory baseline taken. mem usage=0.41 GB", rank)
    time.sleep(step * rank / 2)  # ranks drift apart: a rank's line lands glued to another rank's bar
    emit("Load weight begin. avail mem=93.72 GB", rank)
    if args.scenario == "busy-silent":
        if rank == 0:
            spin(None)
        process_weights_after_loading()
    shard_s = args.shard_s if args.scenario == "slow-progress" else args.shard_s / 8
    loading = time.monotonic()
    if rank == 0 or args.bars == "per-rank":
        checkpoint_bar(args.shards, shard_s)
    else:
        time.sleep(shard_s * args.shards)  # reading its shards without a bar, as SGLang 0.5.23's other ranks do
    if args.scenario == "incident":
        process_weights_after_loading()
    emit(
        f"Load weight end. elapsed={time.monotonic() - loading:.2f} s, type=DeepseekV3ForCausalLM, "
        "quant=compressed-tensors, avail mem=67.18 GB, mem usage=26.54 GB.",
        rank,
    )
    speculative = args.speculative or args.scenario == "draft-capture-hang"
    if speculative:  # SGLang's draft worker loads its model right after the target's, on every rank
        emit("Load weight begin. avail mem=67.18 GB", rank)
        if rank == 0:
            checkpoint_bar(2, shard_s)
        emit(
            "Load weight end. elapsed=0.05 s, type=DeepseekV3ForCausalLMNextN, avail mem=65.00 GB, mem usage=2.18 GB.",
            rank,
        )
    time.sleep(step)
    emit("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, KV size: 17.04 GB", rank)
    emit("Memory pool end. avail mem=48.92 GB", rank)
    graph = "target verify" if speculative else "target decode"
    emit(f"Capture {graph} CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=48.90 GB", rank)
    if args.scenario == "capture-hang":
        process_weights_after_loading()
    if args.scenario == "crash-no-kernel-image" and rank == 0:
        emit("Scheduler hit an exception: Traceback (most recent call last):", rank)
        for line in (
            '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2712, in run_scheduler',
            "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
            '  File "/sgl-workspace/sglang/python/sglang/srt/model_executor/cuda_graph_runner.py", line 391, in run',
            "    self.capture_one_batch_size(bs, forward)",
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        ):
            raw(line + "\n")
        sys.exit(1)
    if args.scenario == "slow-progress":
        spin(args.busy_s)
    started = time.monotonic()
    for done in range(1, 5):
        time.sleep(step / 2)
        elapsed = time.monotonic() - started
        if rank == 0:  # SGLang draws the capture bar on TP0 only
            raw(
                f"\rCapturing batches (bs={2 ** (4 - done)} avail_mem=48.60 GB): {25 * done:3d}%|"
                f"{'#' * (done * 2):<8}| {done}/4 [00:00<00:00, {done / elapsed:5.2f}it/s]"
            )
    if rank == 0:
        raw("\n")
    emit(
        f"Capture {graph} CUDA graph end. bs=[1, 2, 4, 8], elapsed={time.monotonic() - started:.2f} s, "
        "mem usage=0.31 GB, avail mem=48.59 GB.",
        rank,
    )
    if speculative:  # the draft worker's captures, logged by TP0 only; the other ranks wait for it
        for kind in ("decode", "extend"):
            if rank == 0:
                emit(
                    f"Capture draft {kind} CUDA graph begin. backend=full, num_tokens_per_req=4, bs=[1, 2, 4, 8], "
                    "avail mem=48.50 GB",
                    rank,
                )
            if args.scenario == "draft-capture-hang" and rank == 0:
                draft_capture()
            if args.scenario == "draft-capture-hang":
                process_weights_after_loading()  # the other ranks: waiting for TP0 in the next collective
            time.sleep(step / 2)
            if rank == 0:
                emit(
                    f"Capture draft {kind} CUDA graph end. elapsed=0.02 s, mem usage=0.10 GB, avail mem=48.40 GB.", rank
                )
    if rank == 0:
        emit(
            "max_total_num_tokens=1048576, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=2048, context_len=262144, available_gpu_mem=48.59 GB",
            rank,
        )
    if ready_fd is not None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    scheduler_event_loop()


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.warm = threading.Event()
        self.serving = serving.Serving(args, emit)


def make_handler(state: State) -> type[BaseHTTPRequestHandler]:
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *values: object) -> None:  # uvicorn's access-log shape
            host, port = self.client_address[:2]
            raw(f'INFO:     {host}:{port} - "{self.requestline}" {values[1] if len(values) > 1 else ""}\n')

        def reply(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if state.serving.handle_get(self):
                return
            if self.path == "/health":
                healthy = state.warm.is_set() and args.scenario != "health-503"
                self.reply(200 if healthy else 503, {} if healthy else {"detail": "server is starting"})
            elif self.path == "/v1/models":
                card = {"id": args.model_name, "object": "model", "owned_by": "sglang", "max_model_len": 262144}
                self.reply(200, {"object": "list", "data": [card]})
            elif self.path in ("/get_model_info", "/model_info"):
                self.reply(200, {"model_path": args.model_path, "is_generation": True})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"{}")
            if self.path not in ("/v1/completions", "/generate"):
                self.reply(404, {"detail": "Not Found"})
                return
            if args.scenario == "completion-never-returns":
                threading.Event().wait()  # a request stuck in the scheduler: asleep, never answered
            if args.scenario == "bad-completion":
                self.reply(200, {"id": "cmpl-0", "object": "text_completion", "choices": []})
                return
            if request.get("stream"):
                state.serving.stream(self, request)
                return
            prompt = str(request.get("prompt") or request.get("text") or "")
            text = " Paris. It is also the" if "France" in prompt else " a test reply"
            self.reply(
                200,
                {
                    "id": "cmpl-emulated",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": args.model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14},
                },
            )

    return Handler


def serve(args: argparse.Namespace) -> None:
    state = State(args)
    try:
        server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    except OSError as error:
        raw(
            f"ERROR:    [Errno {error.errno}] error while attempting to bind on address ({args.host!r}, {args.port}): "
            f"{error.strerror.lower()}\n"
        )
        sys.exit(1)
    raw(f"INFO:     Started server process [{os.getpid()}]\n")
    raw("INFO:     Waiting for application startup.\n")
    raw("INFO:     Application startup complete.\n")
    threading.Thread(target=server.serve_forever, name="uvicorn", daemon=True).start()
    raw(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)\n")
    time.sleep(args.warmup_s)
    if args.scenario != "health-503":
        emit("Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0", 0)
        state.warm.set()
        emit("The server is fired up and ready to roll!")
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=SCENARIOS, default="healthy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-path", default="/models/Kimi-K2.5")
    parser.add_argument("--model-name", default=None, help="the id /v1/models serves (default: --model-path)")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=None, help="rank processes (default --tp)")
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--bars", choices=("per-rank", "rank0"), default="per-rank", help="who draws the shard bar")
    parser.add_argument("--speculative", action="store_true", help="a draft model: its load and graph captures")
    parser.add_argument("--shard-s", type=float, default=0.02, help="seconds per shard (slow-progress; else /8)")
    parser.add_argument("--busy-s", type=float, default=2.5, help="silent CPU-busy capture (slow-progress)")
    parser.add_argument("--step-s", type=float, default=0.05, help="pause between log lines")
    parser.add_argument("--warmup-s", type=float, default=0.3, help="/health stays 503 this long after listening")
    serving.add_arguments(parser)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, default=None, help=argparse.SUPPRESS)
    args, _sglang_flags = parser.parse_known_args()  # accepts the rest of SGLang's command line
    args.model_name = args.model_name or args.model_path
    if args.rank is not None:
        run_rank(args.rank, args, args.ready_fd)
        return
    if args.scenario == "exit-at-once":
        raw("launch_server.py: error: argument --tp: invalid int value: 'eight'\n")
        sys.exit(2)
    ranks = max(1, args.tp if args.ranks is None else args.ranks)
    server_args = {
        "model_path": args.model_path,
        "tokenizer_path": args.model_path,
        "trust_remote_code": True,
        "host": args.host,
        "port": args.port,
        "tp_size": ranks,
        "speculative_algorithm": None,
        "tool_call_parser": "kimi_k2",
        "reasoning_parser": "kimi_k2",
        "attention_backend": None,
        "watchdog_timeout": 300,
    }
    emit(f"server_args={server_args}")
    children = []
    readers = []
    for rank in range(ranks):
        reader, writer = os.pipe()
        argv = [
            sys.executable,
            os.path.abspath(__file__),
            *sys.argv[1:],
            "--rank",
            str(rank),
            "--ready-fd",
            str(writer),
        ]
        children.append(subprocess.Popen(argv, pass_fds=(writer,), stdin=subprocess.DEVNULL))
        os.close(writer)
        readers.append(reader)
    for reader in readers:
        if os.read(reader, 1) != b"1":  # EOF without the ready byte: the rank died
            emit("Received sigquit from a child process. It usually means the child failed.")
            for child in children:
                child.kill()
            sys.exit(1)
    serve(args)


if __name__ == "__main__":
    main()
