"""The bench client's own ceiling: streamed tokens/s it sustains against a server that streams instantly.

    .venv/bin/python benchmarks/bench_client.py [--tokens 256] [--requests 200] [--concurrency 1 8] [--json OUT]

The server is a separate process (so it never shares the client's GIL) that answers every POST with a
pre-rendered OpenAI SSE stream, one token per `data:` event in HTTP/1.1 chunks, written in one go. Side by
side, on the same server in the same run:
- ours: bwstack.bench's run_level (threads, one kept-alive connection each, SSE parsed, TTFT/ITL kept);
- reference: the same requests read as raw bytes to the stream's end with no parsing at all, the floor
  of what any Python client over http.client could do.
Issue 12's target: ours >= 5,000 streamed tokens/s on this machine.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_TOK_S = 5000.0


def render_stream(tokens: int) -> bytes:
    events = []
    for index in range(tokens):
        finish = "length" if index == tokens - 1 else None
        choice = {"index": 0, "text": " tok", "finish_reason": finish}
        event = {"id": "x", "object": "text_completion", "choices": [choice]}
        events.append(b"data: " + json.dumps(event).encode() + b"\n\n")
    usage = {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}}
    events += [b"data: " + json.dumps(usage).encode() + b"\n\n", b"data: [DONE]\n\n"]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + chunks


def serve(port: int, tokens: int) -> None:
    """Answer every request on every connection with the same stream, at once."""
    answer = render_stream(tokens)
    listener = socket.create_server(("127.0.0.1", port), backlog=256)

    def handle(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, rest = buffer.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                length = next((int(ln.split(b":")[1]) for ln in lines if ln.lower().startswith(b"content-length")), 0)
                while len(rest) < length:
                    rest += conn.recv(65536)
                buffer = rest[length:]
                if head.startswith(b"GET /v1/models"):
                    body = b'{"data":[{"id":"m"}]}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                elif head.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                else:
                    conn.sendall(answer)

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def raw_reference(port: int, tokens: int, requests: int, concurrency: int) -> float:
    """Streamed tokens/s when the bytes are only read, never parsed."""
    import http.client

    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": tokens, "stream": True}).encode()
    left = list(range(requests))
    lock = threading.Lock()

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        while True:
            with lock:
                if not left:
                    break
                left.pop()
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            conn.getresponse().read()
        conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return requests * tokens / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per streamed request")
    parser.add_argument("--requests", type=int, default=200, help="requests per level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.tokens)
        return 0
    sys.path.insert(0, str(REPO))
    from bwstack.bench import BenchSettings
    from bwstack.bench.client import Endpoint
    from bwstack.bench.levels import ServerView, run_level

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--tokens", str(args.tokens)])
    rows = []
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        endpoint = Endpoint.parse(f"http://127.0.0.1:{port}")
        view = ServerView(endpoint)
        for concurrency in args.concurrency:
            settings = BenchSettings(requests=args.requests, concurrency=(concurrency,), input_len=8,
                                     output_len=args.tokens, model_name="m")  # fmt: skip
            run_level(endpoint, settings, concurrency, "m", view)  # warm-up
            level = run_level(endpoint, settings, concurrency, "m", view)
            assert level.errors == 0 and level.output_tokens == args.requests * args.tokens, level.error_samples
            reference = raw_reference(port, args.tokens, args.requests, concurrency)
            rows.append(
                {
                    "concurrency": concurrency,
                    "ours_tok_s": round(level.output_tok_s),
                    "raw_read_tok_s": round(reference),
                    "ratio": round(level.output_tok_s / reference, 3),
                    "meets_target": level.output_tok_s >= TARGET_TOK_S,
                }
            )
        view.close()
    finally:
        server.kill()
        server.wait()
    print(f"{'concurrency':>11} {'ours tok/s':>11} {'raw read tok/s':>15} {'ratio':>6}  target >= {TARGET_TOK_S:g}")
    for row in rows:
        print(f"{row['concurrency']:>11} {row['ours_tok_s']:>11} {row['raw_read_tok_s']:>15} {row['ratio']:>6}  "
              f"{'met' if row['meets_target'] else 'MISSED'}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"tokens": args.tokens, "requests": args.requests, "rows": rows}, indent=2))
    return 0 if all(row["meets_target"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
