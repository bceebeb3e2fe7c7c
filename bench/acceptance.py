"""Speculative acceptance as the server reports it: Prometheus /metrics first, the decode log second.

SGLang (with --enable-metrics) exports gauges `sglang:spec_accept_length` (accepted drafts + the bonus
token per verify step), `sglang:spec_accept_rate` and `sglang:gen_throughput`; its scheduler logs
`Decode batch, ... accept len: X.XX, accept rate: Y.YY, ... gen throughput (token/s): Z` every
--decode-log-interval steps. vLLM exports counters `vllm:spec_decode_num_drafts_total` and
`vllm:spec_decode_num_accepted_tokens_total` (mean acceptance length = 1 + accepted / drafts over an
interval) and logs `SpecDecoding metrics: Mean acceptance length: X.XX, ...`. docs/bench.md names the
source lines. A server that does not speculate exports none of these (or zeros): accept length is None.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
SGLANG_ACCEPT_RATE = "sglang:spec_accept_rate"
SGLANG_GEN_THROUGHPUT = "sglang:gen_throughput"
VLLM_DRAFTS = "vllm:spec_decode_num_drafts"  # the parser strips a counter's _total suffix from the family name
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"

_SGLANG_DECODE = re.compile(
    r"Decode batch\b.*?accept len: (?P<length>[0-9.]+), accept rate: (?P<rate>[0-9.]+)"
    r"(?:.*?gen throughput \(token/s\): (?P<gen>[0-9.]+))?"
)
_VLLM_SPEC = re.compile(r"SpecDecoding metrics: Mean acceptance length: (?P<length>[0-9.]+)")
_VLLM_RATE = re.compile(r"Avg Draft acceptance rate: (?P<rate>[0-9.]+)%")


@dataclass(frozen=True)
class Acceptance:
    accept_length: float | None  # tokens per verify step, bonus token included; None: not speculating
    accept_rate: float | None  # 0..1
    source: str  # "metrics", "log", or "none"

    def to_dict(self) -> dict[str, float | str | None]:
        return {"accept_length": self.accept_length, "accept_rate": self.accept_rate, "source": self.source}


NONE = Acceptance(None, None, "none")


@dataclass(frozen=True)
class Scrape:
    """The speculative series of one /metrics answer (sums over label sets, e.g. over DP ranks)."""

    sglang_length: float | None = None
    sglang_rate: float | None = None
    vllm_drafts: float | None = None
    vllm_accepted: float | None = None


def parse_metrics(text: str) -> Scrape:
    """The speculative series in a Prometheus text exposition; ValueError when it is not one."""
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (SGLANG_ACCEPT_LENGTH, SGLANG_ACCEPT_RATE):
                values.setdefault(sample.name, []).append(sample.value)
            elif sample.name in (f"{VLLM_DRAFTS}_total", f"{VLLM_ACCEPTED}_total"):
                values.setdefault(sample.name.removesuffix("_total"), []).append(sample.value)

    def mean(name: str) -> float | None:
        found = values.get(name)
        return statistics.fmean(found) if found else None

    def total(name: str) -> float | None:
        found = values.get(name)
        return sum(found) if found else None

    return Scrape(
        sglang_length=mean(SGLANG_ACCEPT_LENGTH),
        sglang_rate=mean(SGLANG_ACCEPT_RATE),
        vllm_drafts=total(VLLM_DRAFTS),
        vllm_accepted=total(VLLM_ACCEPTED),
    )


def from_scrapes(before: Scrape | None, after: Scrape | None) -> Acceptance | None:
    """Acceptance over a bench level from the scrapes taken before and after it; None: no metric to go by.

    SGLang's gauges hold the most recent decode-log interval, so the value after the level is its value.
    vLLM's counters grow for the server's lifetime, so the level's share is the difference."""
    if after is None:
        return None
    if after.sglang_length is not None:
        if after.sglang_length <= 0:  # exported, but the server does not speculate
            return NONE
        return Acceptance(round(after.sglang_length, 3), _rounded(after.sglang_rate), "metrics")
    if after.vllm_drafts is not None and after.vllm_accepted is not None:
        drafts = after.vllm_drafts - ((before.vllm_drafts or 0.0) if before else 0.0)
        accepted = after.vllm_accepted - ((before.vllm_accepted or 0.0) if before else 0.0)
        if drafts <= 0:
            return NONE
        return Acceptance(round(1 + accepted / drafts, 3), None, "metrics")
    return None


def from_log(lines: Iterable[str]) -> Acceptance | None:
    """Mean acceptance over the decode log lines of a level (SGLang or vLLM); None when there were none."""
    lengths: list[float] = []
    rates: list[float] = []
    for line in lines:
        match = _SGLANG_DECODE.search(line)
        if match:
            lengths.append(float(match["length"]))
            rates.append(float(match["rate"]))
            continue
        match = _VLLM_SPEC.search(line)
        if match:
            lengths.append(float(match["length"]))
            rate = _VLLM_RATE.search(line)
            if rate:
                rates.append(float(rate["rate"]) / 100)
    lengths = [value for value in lengths if value > 0]  # SGLang logs 0.00 while no verify step ran
    if not lengths:
        return None
    return Acceptance(round(statistics.fmean(lengths), 3), round(statistics.fmean(rates), 3) if rates else None, "log")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
