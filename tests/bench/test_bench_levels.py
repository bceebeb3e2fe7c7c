"""bench against the serving emulator over real HTTP: counts, latencies, acceptance and a drafter's effect.

The emulator sets the pace; tests compare ratios far apart, never absolute times."""

from __future__ import annotations

from bwstack.bench import BenchSettings, run_bench
from bwstack.bench.levels import percentiles
from tests.bench.conftest import Serve

SMALL = BenchSettings(requests=12, concurrency=(1, 4), input_len=16, output_len=24, seed=3)


def test_a_plain_server_streams_every_token_and_does_not_speculate(serve: Serve) -> None:
    with serve("--enable-metrics") as server:
        levels, model = run_bench(server.url, SMALL, log_path=server.log)
    assert model == "/models/Kimi-K2.5"  # from /v1/models
    assert [lv.concurrency for lv in levels] == [1, 4]
    for level in levels:
        assert (level.requests, level.errors, level.output_tokens) == (12, 0, 12 * 24)
        assert level.output_tok_s > 0 and level.ttft_ms["p50"] is not None and level.itl_ms["p99"] is not None
        assert level.ttft_ms["p50"] <= level.ttft_ms["p90"] <= level.ttft_ms["p99"]
        assert level.acceptance.accept_length is None  # exported as 0 by a server that does not speculate
    # four streams at once: the aggregate rate grows with concurrency (far from 1x on any machine)
    assert levels[1].output_tok_s > 2 * levels[0].output_tok_s


def test_tokens_are_counted_from_chunks_when_the_server_sends_no_usage(serve: Serve) -> None:
    settings = BenchSettings(requests=4, concurrency=(2,), input_len=8, output_len=10)
    with serve("--no-usage", "--spec-accept", "0.9") as server:
        (level,), _ = run_bench(server.url, settings)
    # a speculative chunk carries several tokens, so counting chunks undercounts: fewer than 4 x 10
    assert level.errors == 0 and 4 <= level.output_tokens < 40
    with serve() as server:
        (level,), _ = run_bench(server.url, settings)
    assert level.output_tokens == 40


def test_acceptance_comes_from_metrics_and_else_from_the_decode_log(serve: Serve) -> None:
    settings = BenchSettings(requests=8, concurrency=(2,), input_len=8, output_len=40)
    with serve("--spec-accept", "0.8", "--enable-metrics", "--decode-log-interval", "10") as server:
        (level,), _ = run_bench(server.url, settings, log_path=server.log)
    assert level.acceptance.source == "metrics" and 2.0 < level.acceptance.accept_length <= 5.0
    with serve("--spec-accept", "0.8", "--decode-log-interval", "10") as server:  # /metrics answers 404
        (level,), _ = run_bench(server.url, settings, log_path=server.log)
    assert level.acceptance.source == "log" and 2.0 < level.acceptance.accept_length <= 5.0
    with serve("--spec-accept", "0.8", "--decode-log-interval", "10") as server:  # neither: unknown, not guessed
        (level,), _ = run_bench(server.url, settings)
    assert (level.acceptance.source, level.acceptance.accept_length) == ("none", None)


def test_a_good_drafter_measures_faster_and_a_bad_one_slower(serve: Serve) -> None:
    settings = BenchSettings(requests=8, concurrency=(2,), input_len=8, output_len=48)
    rates = {}
    for name, extra in (("base", ()), ("good", ("--spec-accept", "0.8")), ("bad", ("--spec-accept", "0.15"))):
        with serve(*extra) as server:
            (level,), _ = run_bench(server.url, settings, log_path=server.log)
        assert level.errors == 0
        rates[name] = level.output_tok_s
    assert rates["good"] / rates["base"] >= 1.5, rates
    assert rates["bad"] / rates["base"] <= 0.75, rates


def test_a_server_that_is_not_there_makes_errors_not_exceptions() -> None:
    from tests.emulator.support import free_port

    settings = BenchSettings(requests=3, concurrency=(1,), model_name="m", request_timeout_s=2)
    (level,), _ = run_bench(f"http://127.0.0.1:{free_port()}", settings)
    assert (level.errors, level.output_tokens) == (3, 0)
    assert "ConnectionRefusedError" in level.error_samples[0]


def test_percentiles_use_the_nearest_rank() -> None:
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentiles(values) == {"p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}
    assert percentiles([0.005]) == {"p50": 5.0, "p90": 5.0, "p99": 5.0}
