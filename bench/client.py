"""The bench's HTTP client: OpenAI-compatible streaming completions over one kept-alive connection per worker.

http.client rather than requests: the client's own cost per streamed chunk is what bounds the rate it can
measure (benchmarks/bench_client.py), and a buffered readline() over http.client's chunked decoding is the
cheapest path the standard library offers. SSE framing: `data: {json}` lines, blank lines between events,
and `data: [DONE]` at the end.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from bwstack.errors import BenchError


@dataclass
class Sample:
    """One streamed request, as the client saw it."""

    ok: bool
    error: str = ""
    ttft_s: float | None = None  # request sent -> first chunk that carried text
    itl_s: list[float] = field(default_factory=list)  # gaps between later text chunks
    latency_s: float = 0.0
    output_tokens: int = 0
    chunks: int = 0  # text chunks seen (what tokens are counted from when the server sends no usage)
    usage_tokens: int | None = None  # completion_tokens from the server's streamed usage


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    path: str  # the completions path, e.g. /v1/completions

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchError(f"--url {url!r} is not an http(s) URL", remedy="give e.g. http://127.0.0.1:30000")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as error:
            raise BenchError(f"--url {url!r}: {error}") from None
        base = parts.path.rstrip("/")
        return cls(parts.scheme, parts.hostname, port, f"{base}/v1/completions")

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path.removesuffix('/v1/completions')}"


class StreamingClient:
    """One worker's connection; not shared between threads."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float, api_key: str | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self.endpoint.scheme == "https" else http.client.HTTPConnection
            self._conn = kind(self.endpoint.host, self.endpoint.port, timeout=self.timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def complete(self, body: dict[str, Any], deadline: float) -> Sample:
        """Send one streaming completion and read it to [DONE]; never raises for the server's faults."""
        payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
        started = time.perf_counter()
        try:
            sample = self._stream(payload, started, deadline)
        except (OSError, http.client.HTTPException, ValueError) as error:
            self.close()  # the connection's state is unknown after a failure: the next request opens a new one
            sample = Sample(ok=False, error=f"{type(error).__name__}: {error}"[:300])
        sample.latency_s = time.perf_counter() - started
        if sample.ok:
            sample.output_tokens = sample.usage_tokens if sample.usage_tokens is not None else sample.chunks
        return sample

    def _stream(self, payload: bytes, started: float, deadline: float) -> Sample:
        conn = self._connection()
        conn.request("POST", self.endpoint.path, body=payload, headers=self.headers)
        response = conn.getresponse()
        if response.status != 200:
            text = response.read(2000).decode("utf-8", "replace")
            self.close()
            return Sample(ok=False, error=f"HTTP {response.status}: {' '.join(text.split())[:200]}")
        sample = Sample(ok=True)
        last: float | None = None
        done = False
        while True:
            line = response.readline()
            if not line:
                break
            if not line.startswith(b"data:"):
                continue  # blank separators, comments (`: ping`), event names
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                response.read()  # the stream's end (the last chunk): the connection is reused for the next request
                break
            event = json.loads(data)
            if "error" in event and not event.get("choices"):
                self.close()
                return Sample(ok=False, error=f"server error: {str(event['error'])[:200]}")
            usage = event.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                sample.usage_tokens = int(usage["completion_tokens"])
            if any(choice.get("text") for choice in event.get("choices") or ()):
                now = time.perf_counter()
                if last is None:
                    sample.ttft_s = now - started
                else:
                    sample.itl_s.append(now - last)
                last = now
                sample.chunks += 1
            if time.perf_counter() > deadline:
                self.close()
                return Sample(ok=False, error="the bench's time limit passed mid-stream")
        if not done:
            self.close()
            return Sample(ok=False, error="the stream ended without data: [DONE]")
        if sample.chunks == 0:
            return Sample(ok=False, error="the stream carried no text")
        return sample
