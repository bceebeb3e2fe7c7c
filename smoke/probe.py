"""Prove the server serves: the port accepts, /health says 200, /v1/models names a model, and one small
completion comes back as a completion. Each step is retried on the next `step()` until it passes."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from bwstack.errors import SmokeError

PROMPT = "The capital of France is"


def resolve_host(host: str, port: int) -> None:
    """SmokeError (exit 2) when `host` does not resolve: port_open would read that as "nothing listening",
    and the run would wait out the stall timeout and call a server that could never be reached a hang."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise SmokeError(
            f"--host {host!r} does not resolve: {reason}", remedy="give an address or a name this machine resolves"
        ) from None


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when something accepts a TCP connection on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class ProbeResult:
    name: str  # tcp, health, models, completion
    ok: bool
    detail: str  # one line: "200", "503 {...}", "connection refused"
    status: int | None = None
    seconds: float = 0.0
    answered: bool = False  # an HTTP reply came back (any status): the server is alive
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "detail": self.detail,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "attempts": self.attempts,
        }


REQUESTS = {
    "tcp": "a TCP connection",
    "health": "GET /health",
    "models": "GET /v1/models",
    "completion": "POST /v1/completions",
}
_NEVER = {
    "tcp": "a TCP connection to {where} was never accepted",
    "health": "GET /health never answered 200",
    "models": "GET /v1/models never named a model",
    "completion": "POST /v1/completions never returned a completion",
}


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_completion(body: Any) -> str | None:
    """Why a /v1/completions reply is not a completion; None when it is one."""
    if not isinstance(body, dict):
        return "reply is not a JSON object"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "reply has no choices"
    text = choices[0].get("text")
    if not isinstance(text, str) or not text.strip():
        return "first choice has no text"
    return None


def _direct_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # never through an HTTP(S)_PROXY: the server is on this host
    return session


@dataclass
class ReadinessProbe:
    """tcp -> health -> models -> completion, one request per `step()`."""

    host: str
    port: int
    request_timeout_s: float = 5.0
    completion_timeout_s: float = 30.0
    session: requests.Session = field(default_factory=lambda: _direct_session())
    results: dict[str, ProbeResult] = field(default_factory=dict)
    model: str | None = None
    completion_text: str | None = None

    STEPS = ("tcp", "health", "models", "completion")

    @property
    def base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def current(self) -> str | None:
        """The first step not yet passed; None when all passed."""
        for name in self.STEPS:
            result = self.results.get(name)
            if result is None or not result.ok:
                return name
        return None

    @property
    def ready(self) -> bool:
        return self.current is None

    def passed_requests(self) -> list[str]:
        """The HTTP requests that passed, in order, as people write them ("GET /health")."""
        done = self.STEPS if self.current is None else self.STEPS[: self.STEPS.index(self.current)]
        return [REQUESTS[name] for name in done if name != "tcp"]

    def failing(self) -> str:
        """The probe that keeps failing, in words: "POST /v1/completions never returned a completion"."""
        name = self.current
        return "every probe passed" if name is None else _NEVER[name].format(where=f"{self.host}:{self.port}")

    def step(self, budget_s: float | None = None) -> ProbeResult | None:
        """Run the current step once; its result (None when already ready)."""
        name = self.current
        if name is None:
            return None
        started = time.monotonic()
        if name == "tcp":
            ok = port_open(self.host, self.port)
            result = ProbeResult("tcp", ok, "accepting" if ok else f"nothing listening on {self.host}:{self.port}")
        else:
            timeout = self.completion_timeout_s if name == "completion" else self.request_timeout_s
            if budget_s is not None:  # the watcher's: inside the stall window and the startup timeout
                timeout = max(0.5, min(timeout, budget_s))
            result = getattr(self, f"_{name}")(timeout)
        result.seconds = time.monotonic() - started
        previous = self.results.get(name)
        result.attempts = previous.attempts + 1 if previous else 1
        self.results[name] = result
        return result

    def _http(self, name: str, method: str, path: str, timeout: float, **kwargs: Any) -> tuple[ProbeResult, Any]:
        try:
            reply = self.session.request(method, self.base + path, timeout=timeout, **kwargs)
        except requests.Timeout:
            return ProbeResult(name, False, f"no reply within {timeout:.3g} s"), None
        except requests.ConnectionError as error:
            reason = "connection refused" if "refused" in str(error).lower() else f"connection failed: {error}"
            return ProbeResult(name, False, _short(reason)), None
        try:
            body = reply.json()
        except (json.JSONDecodeError, ValueError):
            body = None
        detail = f"{reply.status_code} {_short(reply.text, 120)}".strip()
        return ProbeResult(name, reply.status_code == 200, detail, reply.status_code, answered=True), body

    def _health(self, timeout: float) -> ProbeResult:
        result, _ = self._http("health", "GET", "/health", timeout)
        return result

    def _models(self, timeout: float) -> ProbeResult:
        result, body = self._http("models", "GET", "/v1/models", timeout)
        if not result.ok:
            return result
        data = body.get("data") if isinstance(body, dict) else None
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        ids = [i for i in ids if isinstance(i, str) and i]
        if not ids:
            return ProbeResult("models", False, f"no model in the reply: {result.detail}", result.status, answered=True)
        self.model = ids[0]
        return ProbeResult("models", True, f"serves {', '.join(ids)}", result.status, answered=True)

    def _completion(self, timeout: float) -> ProbeResult:
        payload = {"model": self.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
        result, body = self._http("completion", "POST", "/v1/completions", timeout, json=payload)
        if not result.ok:
            return result
        problem = check_completion(body)
        if problem:
            return ProbeResult("completion", False, f"{problem}: {result.detail}", result.status, answered=True)
        self.completion_text = body["choices"][0]["text"]
        return ProbeResult("completion", True, f"{PROMPT!r} -> {self.completion_text!r}", result.status, answered=True)

    def close(self) -> None:
        self.session.close()
