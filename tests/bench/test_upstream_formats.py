"""bench's acceptance readers against the REAL released SGLang 0.5.23 and vLLM 0.33.0 sources: metric names and
types, and decode log lines rendered from the wheels' own format strings (never hand-copied)."""

from __future__ import annotations

import argparse
import ast
import re
from types import SimpleNamespace
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bwstack.bench import acceptance as acc
from tests.emulator.serving import Serving, add_arguments
from tests.released import released_wheel, wheel_text

SGLANG_METRICS = "sglang/srt/observability/metrics_collector.py"
SGLANG_REPORTER = "sglang/srt/managers/scheduler_components/metrics_reporter.py"
VLLM_SPEC = "vllm/v1/spec_decode/metrics.py"


def sglang_source(member: str) -> str:
    return wheel_text(released_wheel("sglang", "0.5.23"), member)


def vllm_source() -> str:
    return wheel_text(released_wheel("vllm", "0.33.0"), VLLM_SPEC)


def sglang_metric_kinds() -> dict[str, str]:
    """Every `Gauge(name="sglang:...")`-style metric in the collector: name -> prometheus_client class."""
    found = re.findall(r"(\w+)\(\s*name=\"(sglang:\w+)\"", sglang_source(SGLANG_METRICS))
    return {name: kind for kind, name in found}


def test_sglang_exports_the_metrics_bench_reads_and_they_parse() -> None:
    kinds = sglang_metric_kinds()
    names = (acc.SGLANG_ACCEPT_LENGTH, acc.SGLANG_ACCEPT_RATE, acc.SGLANG_GEN_THROUGHPUT)
    assert {kinds.get(n) for n in names} == {"Gauge"}, {n: kinds.get(n) for n in names}
    registry = CollectorRegistry()
    labels = {"model_name": "kimi", "tp_rank": "0"}
    for name, value in zip(names, (3.25, 0.56, 812.0), strict=True):
        metric = getattr(prometheus_client, kinds[name])(name, "doc", list(labels), registry=registry)
        metric.labels(**labels).set(value)
    scrape = acc.parse_metrics(generate_latest(registry).decode())
    assert (scrape.sglang_length, scrape.sglang_rate) == (3.25, 0.56)
    assert acc.from_scrapes(None, scrape) == acc.Acceptance(3.25, 0.56, "metrics")


def test_the_emulator_serves_only_metric_names_and_types_sglang_has() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--spec-accept", "0.5"])
    args.model_name = "m"
    families = text_string_to_metric_families(Serving(args, lambda _text, _rank: None).metrics())
    emulated = {family.name: family.type for family in families}
    kinds = sglang_metric_kinds()
    assert emulated and {name: kinds.get(name, "missing").lower() for name in emulated} == emulated


def test_vllm_counters_parse_into_a_mean_acceptance_length() -> None:
    source = vllm_source()
    counters = set(re.findall(r"\(\s*\"(vllm:spec_decode_\w+)\"", source))
    assert {acc.VLLM_DRAFTS, acc.VLLM_ACCEPTED} <= counters, counters

    def exposition(drafts: float, accepted: float) -> str:
        registry = CollectorRegistry()
        for name, value in ((acc.VLLM_DRAFTS, drafts), (acc.VLLM_ACCEPTED, accepted)):
            counter = prometheus_client.Counter(name, "doc", ["engine"], registry=registry)
            counter.labels(engine="0").inc(value)
        return generate_latest(registry).decode()

    before = acc.parse_metrics(exposition(100, 150))
    after = acc.parse_metrics(exposition(300, 550))
    assert acc.from_scrapes(before, after) == acc.Acceptance(3.0, None, "metrics")  # 1 + 400 / 200
    assert acc.from_scrapes(after, after) == acc.NONE  # no drafts in between: nothing speculated


def _joined_strings(source: str, start: str) -> list[ast.JoinedStr]:
    """The f-strings whose text begins with `start`."""
    return [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.JoinedStr)
        and node.values
        and isinstance(node.values[0], ast.Constant)
        and str(node.values[0].value).startswith(start)
    ]


def _render(node: ast.JoinedStr, names: dict[str, Any]) -> str:
    return eval(compile(ast.Expression(node), "<wheel f-string>", "eval"), {}, names)


def test_sglang_decode_log_lines_rendered_from_the_wheel_are_read() -> None:
    source = sglang_source(SGLANG_REPORTER)
    (head,) = [n for n in _joined_strings(source, "Decode batch") if "#running-req" in ast.unparse(n)]
    (spec,) = _joined_strings(source, "accept len: ")
    (tail,) = [
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.JoinedStr) and "gen throughput (token/s)" in ast.unparse(n)
    ]
    scheduler = SimpleNamespace(waiting_queue=[])
    names = {
        "iter_msg": "",
        "num_running_reqs": 8,
        "token_usage_msg": "#token: 4096, token usage: 0.02, ",
        "spec_accept_length": 2.4567,
        "spec_accept_rate": 0.3642,
        "can_run_cuda_graph": True,
        "self": SimpleNamespace(_graph_backend_label="cuda graph", last_gen_throughput=901.25, scheduler=scheduler),
    }
    line = "[2026-05-01 12:00:00 TP0] " + "".join(_render(n, names) for n in (head, spec, tail))
    found = acc.from_log(["unrelated line", line, line.replace("2.46", "2.54")])
    assert found == acc.Acceptance(2.5, 0.36, "log")
    plain = "[2026-05-01 12:00:00] " + _render(head, names) + _render(tail, names)  # not speculating
    assert acc.from_log([plain]) is None


def test_vllm_spec_decoding_log_line_rendered_from_the_wheel_is_read() -> None:
    tree = ast.parse(vllm_source())
    (fmt,) = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("SpecDecoding metrics: ")
    ]
    line = fmt % (2.87, 120.5, 300.0, 1205, 3000, "0.700, 0.500, 0.300", 40.2)
    prefix = "(EngineCore pid=123) INFO 05-01 12:00:00 [metrics.py:136] "
    assert acc.from_log([prefix + line]) == acc.Acceptance(2.87, 0.402, "log")
