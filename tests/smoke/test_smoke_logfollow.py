"""smoke's log follower: carriage returns as line breaks, ranks, partial writes, growing files."""

from __future__ import annotations

import threading
from pathlib import Path

from bwstack.smoke.logfollow import FileFollower, LineSplitter, LogTail, StreamPump, parse_prefix


def texts(lines: list) -> list[str]:
    return [line.raw for line in lines if not line.blank]


def test_carriage_returns_break_lines_and_mark_bar_updates_transient() -> None:
    splitter = LineSplitter()
    lines = splitter.feed(b"\rbar 0/4\rbar 1/4\rbar 4/4\n[2026-01-02 03:04:05 TP1] Load weight end.\n")
    assert texts(lines) == ["bar 0/4", "bar 1/4", "bar 4/4", "[2026-01-02 03:04:05 TP1] Load weight end."]
    assert [line.transient for line in lines] == [True, True, False, False]
    assert lines[3].rank == 1 and lines[3].message == "Load weight end."


def test_crlf_split_across_reads_is_one_break_and_partial_lines_wait() -> None:
    splitter = LineSplitter()
    assert texts(splitter.feed(b"first\r")) == []  # maybe half of a CRLF
    assert texts(splitter.feed(b"\nsecond par")) == ["first"]
    assert splitter.pending == "second par"
    assert texts(splitter.feed(b"t\n")) == ["second part"]
    assert texts(splitter.feed("naïve ".encode()[:3])) == []  # a UTF-8 character cut in two
    assert texts(splitter.feed("naïve ".encode()[3:] + b"\n")) == ["naïve"]


def test_a_rank_line_glued_to_another_ranks_bar_is_cut_at_its_prefix() -> None:
    splitter = LineSplitter()
    data = b"\rLoading safetensors checkpoint shards:  12% Completed | 8/64 [00:03<00:21]"
    data += b"[2026-01-02 03:04:05 DP0 TP3 EP3] Load weight begin. avail mem=93.72 GB\n"
    lines = splitter.feed(data)
    assert texts(lines) == [
        "Loading safetensors checkpoint shards:  12% Completed | 8/64 [00:03<00:21]",
        "[2026-01-02 03:04:05 DP0 TP3 EP3] Load weight begin. avail mem=93.72 GB",
    ]
    assert lines[0].transient and lines[0].rank is None
    assert lines[1].rank == 3 and lines[1].message.startswith("Load weight begin")


def test_ansi_escapes_and_blank_pieces_are_dropped() -> None:
    lines = LineSplitter().feed(b"\x1b[A\x1b[2K\rCapturing batches: 50%\r\r\n\x1b[32mgreen\x1b[0m\n")
    assert texts(lines) == ["Capturing batches: 50%", "green"]


def test_a_bare_newline_is_a_blank_line_and_each_line_says_what_ended_it() -> None:
    # a bar's closing newline that another rank's line separated from its bar
    data = b"\rbar 4/4[2026-01-02 03:04:05 TP1] Load weight end.\n\n\rnext 0/2\rnext 1/2"
    lines = LineSplitter().feed(data)
    assert [(line.raw[:8], line.ending, line.blank) for line in lines] == [
        ("bar 4/4", "", False),
        ("[2026-01", "\n", False),
        ("", "\n", True),
        ("next 0/2", "\r", False),
    ]


def test_prefix_parsing() -> None:
    assert parse_prefix("[2026-01-02 03:04:05 TP7] x") == ("2026-01-02 03:04:05", 7, "x")
    assert parse_prefix("[2026-01-02 03:04:05] The server is fired up") == (
        "2026-01-02 03:04:05",
        None,
        "The server is fired up",
    )
    assert parse_prefix("INFO:     Uvicorn running on http://127.0.0.1:1") == (
        None,
        None,
        "INFO:     Uvicorn running on http://127.0.0.1:1",
    )


def test_tail_keeps_each_bars_final_state_not_every_update() -> None:
    splitter = LineSplitter()
    tail = LogTail(limit=5)
    data = b"[2026-01-02 03:04:05 TP0] Load weight begin.\n"
    for done in range(65):
        data += f"\rLoading safetensors checkpoint shards: 50% Completed | {done}/64".encode()
    data += b"\rLoading safetensors checkpoint shards: 100% Completed | 64/64 [00:22<00:00, 2.55it/s]\n"
    for line in splitter.feed(data):
        tail.add(line)
    assert tail.lines() == [
        "[2026-01-02 03:04:05 TP0] Load weight begin.",
        "Loading safetensors checkpoint shards: 100% Completed | 64/64 [00:22<00:00, 2.55it/s]",
    ]
    tail.add(splitter.feed(b"\rlive bar 3/9\rlive bar 4/9")[0])
    assert tail.lines(pending=splitter.pending)[-3:] == [
        "Loading safetensors checkpoint shards: 100% Completed | 64/64 [00:22<00:00, 2.55it/s]",
        "live bar 3/9",
        "live bar 4/9",
    ]


def test_file_follower_reads_only_what_is_new_and_tolerates_a_missing_file(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    follower = FileFollower(log)
    assert follower.read_new() == []
    log.write_bytes(b"one\ntw")
    assert texts(follower.read_new()) == ["one"]
    assert follower.read_new() == []
    with log.open("ab") as handle:
        handle.write(b"o\nthree\n")
    assert texts(follower.read_new()) == ["two", "three"]
    assert follower.bytes_read == len(b"one\ntwo\nthree\n")
    assert follower.tail() == ["one", "two", "three"]


def test_stream_pump_copies_a_stream_into_the_file(tmp_path: Path) -> None:
    gate = threading.Event()

    def chunks():
        yield b"[2026-01-02 03:04:05 TP0] Init parallel begin.\n"
        gate.wait(5)
        yield b"\rbar 1/2\rbar 2/2\n"

    log = tmp_path / "container.log"
    pump = StreamPump(chunks(), log.open("ab")).start()
    follower = FileFollower(log)
    for _ in range(100):
        if follower.read_new() or follower.bytes_read:
            break
        threading.Event().wait(0.01)
    assert follower.bytes_read > 0
    gate.set()
    assert pump.join(5)
    assert texts(follower.read_all_new()) == ["bar 1/2", "bar 2/2"]
    assert pump.error is None
