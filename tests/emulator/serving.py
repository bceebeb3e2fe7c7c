"""The serving half of the SGLang emulator: streamed completions at a set pace, /metrics and decode log lines.

Ours, for bench's tests; no SGLang code in it. The emulator sets the pace, so a bench measures what the
emulator was told: --token-rate decode steps per second per request; with --spec-accept P each step
also proposes --spec-draft-tokens drafts, accepted left to right with probability P each (so one step
yields 1 + accepted tokens, the bonus token included) and costs --spec-step-cost plain steps (drafting
and verifying are not free). A good drafter (P=0.8) then streams faster than no drafter, a bad one
(P=0.15, the incident's) slower. The draws come from a seeded generator, so runs repeat.

Every --decode-log-interval steps it logs SGLang's decode line (`Decode batch, ... accept len: ...,
accept rate: ..., ... gen throughput (token/s): ...`) and refreshes the gauges /metrics serves
(with --enable-metrics; otherwise /metrics answers 404 as SGLang's does).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Emit = Callable[[str, int | None], None]

# socketserver listens with a backlog of 5: eight clients connecting at once lose a SYN and wait a second for
# its retransmission, a TTFT the emulator never meant. uvicorn listens with 2048. (The emulator's only server.)
ThreadingHTTPServer.request_queue_size = 2048


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token-rate", type=float, default=200.0, help="decode steps/s per request (0: instant)")
    parser.add_argument("--spec-accept", type=float, default=None, help="speculate: per-draft acceptance 0..1")
    parser.add_argument("--spec-draft-tokens", type=int, default=4, help="drafts proposed per step")
    parser.add_argument("--spec-step-cost", type=float, default=1.8, help="a speculative step in plain steps")
    parser.add_argument("--spec-seed", type=int, default=0)
    parser.add_argument("--enable-metrics", action="store_true", help="serve Prometheus /metrics")
    parser.add_argument("--decode-log-interval", type=int, default=40, help="decode steps between log lines")
    parser.add_argument("--no-usage", action="store_true", help="never stream usage (clients count chunks)")


class Serving:
    """Shared by every request thread; its counters are guarded by one lock."""

    def __init__(self, args: argparse.Namespace, emit: Emit) -> None:
        self.args = args
        self.emit = emit
        self.lock = threading.Lock()
        self.rng = random.Random(args.spec_seed)
        self.running = 0
        self.steps = 0  # since the last decode log line
        self.tokens = 0
        self.interval_started = time.monotonic()
        self.gauges = {"spec_accept_length": 0.0, "spec_accept_rate": 0.0, "gen_throughput": 0.0}

    @property
    def speculating(self) -> bool:
        return self.args.spec_accept is not None

    def _step(self) -> int:
        """One decode step's yield: 1, plus the drafts accepted before the first rejection."""
        if not self.speculating:
            return 1
        accepted = 0
        with self.lock:
            while accepted < self.args.spec_draft_tokens and self.rng.random() < self.args.spec_accept:
                accepted += 1
        return 1 + accepted

    def _count(self, tokens: int) -> None:
        with self.lock:
            self.steps += 1
            self.tokens += tokens
            if self.steps < self.args.decode_log_interval:
                return
            now = time.monotonic()
            length = self.tokens / self.steps
            rate = (self.tokens - self.steps) / (self.steps * self.args.spec_draft_tokens)
            throughput = self.tokens / max(now - self.interval_started, 1e-9)
            running = self.running
            self.steps = self.tokens = 0
            self.interval_started = now
            if self.speculating:
                self.gauges.update(spec_accept_length=length, spec_accept_rate=rate)
            self.gauges["gen_throughput"] = throughput
        spec = f"accept len: {length:.2f}, accept rate: {rate:.2f}, " if self.speculating else ""
        self.emit(
            f"Decode batch, #running-req: {running}, #token: {running * 64}, token usage: 0.01, {spec}"
            f"cuda graph: True, gen throughput (token/s): {throughput:.2f}, #queue-req: 0",
            0,
        )

    def metrics(self) -> str:
        labels = f'model_name="{self.args.model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
        lines = []
        for name, value in self.gauges.items():
            lines += [f"# HELP sglang:{name} emulated", f"# TYPE sglang:{name} gauge"]
            lines.append(f"sglang:{name}{{{labels}}} {value}")
        return "\n".join(lines) + "\n"

    def handle_get(self, handler: BaseHTTPRequestHandler) -> bool:
        if handler.path != "/metrics":
            return False
        data = self.metrics().encode() if self.args.enable_metrics else b'{"detail":"Not Found"}'
        handler.send_response(200 if self.args.enable_metrics else 404)
        kind = "text/plain; version=0.0.4" if self.args.enable_metrics else "application/json"
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        return True

    def stream(self, handler: BaseHTTPRequestHandler, request: dict[str, Any]) -> None:
        """An OpenAI streamed completion: `data:` events in HTTP/1.1 chunks, usage when asked, [DONE]."""
        # uvicorn sets TCP_NODELAY; without it Nagle holds the first chunk for the client's delayed ACK (40 ms)
        handler.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()

        def send(event: object) -> None:
            data = b"data: " + (event if isinstance(event, bytes) else json.dumps(event).encode()) + b"\n\n"
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

        wanted = max(1, int(request.get("max_tokens") or 16))
        step_s = 1.0 / self.args.token_rate if self.args.token_rate > 0 else 0.0
        cost = step_s * (self.args.spec_step_cost if self.speculating else 1.0)
        made = 0
        due = time.monotonic()
        base = {"id": "cmpl-emulated", "object": "text_completion", "model": self.args.model_name}
        with self.lock:
            self.running += 1
        try:
            while made < wanted:
                tokens = min(self._step(), wanted - made)
                due += cost
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                made += tokens
                self._count(tokens)
                finish = "length" if made >= wanted else None
                send({**base, "choices": [{"index": 0, "text": " tok" * tokens, "finish_reason": finish}]})
            if (request.get("stream_options") or {}).get("include_usage") and not self.args.no_usage:
                prompt_tokens = len(str(request.get("prompt") or "").split())
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": made}
                usage["total_tokens"] = prompt_tokens + made
                send({**base, "choices": [], "usage": usage})
            send(b"[DONE]")
            handler.wfile.write(b"0\r\n\r\n")
        finally:
            with self.lock:
                self.running -= 1
