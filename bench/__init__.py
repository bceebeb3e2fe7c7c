"""bench: does it serve well. Streamed completions at several concurrency levels (throughput, TTFT, ITL,
speculative acceptance read from the server) and spec-check, which benches a server with and without
its drafter and judges the speed-up.

    from bwstack.bench import BenchSettings, run_bench
    levels, model = run_bench("http://127.0.0.1:30000", BenchSettings(requests=32, concurrency=(1, 8)))

Modules: prompts (seeded prompts), client (SSE streaming over http.client), acceptance (/metrics and
decode log lines), levels (one bench against a URL), session (a bench against a URL or a server smoke
starts), speccheck (base against speculative, and the verdict).
"""

from bwstack.bench.levels import BenchSettings, LevelResult, run_bench

__all__ = ["BenchSettings", "LevelResult", "run_bench"]
