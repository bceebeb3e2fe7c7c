"""One bench against a serving URL: for each concurrency level, N streamed requests by C workers.

`output_tok_s` is the aggregate rate, as SGLang's bench_serving reports it: every output token of the
level divided by the level's wall time. Latencies are per request: time to first token (TTFT) and the gaps
between later chunks (ITL), each as p50/p90/p99.
"""

from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bwstack.bench.acceptance import NONE, Acceptance, Scrape, from_log, from_scrapes, parse_metrics
from bwstack.bench.client import Endpoint, Sample, StreamingClient
from bwstack.bench.prompts import make_prompts

Progress = Callable[[str, int, int], None]  # (level label, done, total)


@dataclass(frozen=True)
class BenchSettings:
    requests: int = 64
    concurrency: tuple[int, ...] = (1, 8)
    input_len: int = 512
    output_len: int = 256
    seed: int = 0
    model_name: str | None = None  # None: the first id /v1/models names
    api_key: str | None = None
    request_timeout_s: float = 600.0  # per request, and no read waits longer
    level_timeout_s: float = 3600.0  # no level runs longer; unsent requests are counted as errors


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    output_tokens: int
    output_tok_s: float
    request_s: float
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    acceptance: Acceptance
    error_samples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "wall_s": round(self.wall_s, 3),
            "output_tokens": self.output_tokens,
            "output_tok_s": round(self.output_tok_s, 2),
            "request_s": round(self.request_s, 3),
            "ttft_ms": self.ttft_ms,
            "itl_ms": self.itl_ms,
            "accept_length": self.acceptance.accept_length,
            "accept_rate": self.acceptance.accept_rate,
            "accept_source": self.acceptance.source,
            "error_samples": self.error_samples,
        }


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p90/p99 by the nearest-rank rule (no interpolation between two samples that both happened)."""
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    ordered = sorted(values)

    def rank(p: float) -> float:
        return round(ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)] * scale, 3)

    return {"p50": rank(50), "p90": rank(90), "p99": rank(99)}


class ServerView:
    """What the bench may read from the server besides completions: /metrics and, when known, its log."""

    def __init__(self, endpoint: Endpoint, log_path: Path | None = None, api_key: str | None = None) -> None:
        self.endpoint = endpoint
        self.log_path = log_path
        self._session = requests.Session()
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self._session.close()

    def scrape(self) -> Scrape | None:
        """None when the server has no /metrics (SGLang without --enable-metrics answers 404)."""
        try:
            answer = self._session.get(f"{self.endpoint.base_url}/metrics", timeout=10)
        except requests.RequestException:
            return None
        if answer.status_code != 200:
            return None
        try:
            return parse_metrics(answer.text)
        except ValueError:
            return None

    def log_offset(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path else 0
        except OSError:
            return 0

    def log_since(self, offset: int, limit: int = 8 << 20) -> list[str]:
        if self.log_path is None:
            return []
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(offset)
                data = handle.read(limit)
        except OSError:
            return []
        return data.decode("utf-8", "replace").splitlines()

    def model_name(self) -> str | None:
        with contextlib.suppress(requests.RequestException, ValueError, KeyError, IndexError, TypeError):
            answer = self._session.get(f"{self.endpoint.base_url}/v1/models", timeout=10)
            if answer.status_code == 200:
                return str(answer.json()["data"][0]["id"])
        return None


def run_level(
    endpoint: Endpoint,
    settings: BenchSettings,
    concurrency: int,
    model: str,
    view: ServerView,
    progress: Progress | None = None,
) -> LevelResult:
    """N requests by `concurrency` workers, each on its own connection; the server's acceptance around it."""
    prompts = make_prompts(settings.requests, settings.input_len, settings.seed)
    jobs: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(prompts)):
        jobs.put(index)
    samples: list[Sample] = []
    lock = threading.Lock()
    label = f"concurrency {concurrency}"
    before = view.scrape()
    offset = view.log_offset()
    started = time.perf_counter()
    deadline = started + settings.level_timeout_s

    def worker() -> None:
        client = StreamingClient(endpoint, timeout_s=settings.request_timeout_s, api_key=settings.api_key)
        try:
            while time.perf_counter() < deadline:
                try:
                    index = jobs.get_nowait()
                except queue.Empty:
                    return
                body = {
                    "model": model,
                    "prompt": prompts[index],
                    "max_tokens": settings.output_len,
                    "temperature": 0.0,
                    "ignore_eos": True,  # every request produces output_len tokens, as bench_serving's random set
                }
                sample = client.complete(body, deadline)
                with lock:
                    samples.append(sample)
                    done = len(samples)
                if progress is not None:
                    progress(label, done, len(prompts))
        finally:
            client.close()

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()) + settings.request_timeout_s)
    wall = time.perf_counter() - started
    with lock:
        taken = list(samples)
    missing = len(prompts) - len(taken)
    good = [s for s in taken if s.ok]
    errors = [s.error for s in taken if not s.ok] + ["not sent: the level's time limit passed"] * missing
    tokens = sum(s.output_tokens for s in good)
    acceptance = from_scrapes(before, view.scrape()) or from_log(view.log_since(offset)) or NONE
    return LevelResult(
        concurrency=concurrency,
        requests=len(prompts),
        errors=len(errors),
        wall_s=wall,
        output_tokens=tokens,
        output_tok_s=tokens / wall if wall > 0 else 0.0,
        request_s=len(good) / wall if wall > 0 else 0.0,
        ttft_ms=percentiles([s.ttft_s for s in good if s.ttft_s is not None]),
        itl_ms=percentiles([gap for s in good for gap in s.itl_s]),
        acceptance=acceptance,
        error_samples=sorted(set(errors))[:5],
    )


def run_bench(
    url: str,
    settings: BenchSettings,
    *,
    log_path: Path | None = None,
    progress: Progress | None = None,
) -> tuple[list[LevelResult], str]:
    """Every concurrency level in turn against `url`; the level results and the model name used."""
    endpoint = Endpoint.parse(url)
    view = ServerView(endpoint, log_path, settings.api_key)
    try:
        model = settings.model_name or view.model_name() or "default"
        return [run_level(endpoint, settings, c, model, view, progress) for c in settings.concurrency], model
    finally:
        view.close()
