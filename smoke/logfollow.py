"""Follow a server's log as it is written: bytes in, lines out, carriage returns treated as line breaks.

A tqdm bar rewrites itself with '\\r'; several TP ranks write their bars into the same stream, so one
physical line holds many updates from several processes. The splitter cuts at '\\n', '\\r\\n' and '\\r'
alike and marks '\\r'-terminated pieces as transient (a bar update a terminal would overwrite). Lines
carry the rank named in SGLang's `[YYYY-MM-DD HH:MM:SS TPn] ` prefix when there is one, and what ended
them. An empty piece ended by '\\n' is kept as a blank line: it is a tqdm bar's closing newline that
another rank's write separated from its bar (bars.py counts them).

The server writes into a file (a process's stdout, or a container's stream copied by `StreamPump`);
`FileFollower` reads what is new on each call and never blocks, so a silent server cannot stall us.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# `[2026-01-02 03:04:05 TP3] `, `[2026-01-02 03:04:05 DP0 TP3 EP3] ` or `[2026-01-02 03:04:05] `
_PREFIX = re.compile(r"^\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?P<tags>(?: [A-Z]{2,3}\d+)*)\] ?")
_EMBEDDED_PREFIX = re.compile(r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?: [A-Z]{2,3}\d+)*\] ")
_TP_TAG = re.compile(r"\bTP(\d+)\b")


@dataclass(frozen=True)
class LogLine:
    """One line of server output, as a terminal would break it."""

    seq: int  # position in the stream, from 0
    raw: str  # the whole line, prefix included, ANSI escapes removed
    message: str  # the line without its `[timestamp TPn] ` prefix
    rank: int | None  # the TP rank from the prefix, None when the line has none
    transient: bool  # ended by '\r' (a progress-bar update), not '\n'
    ending: str = "\n"  # what ended it: '\n', '\r', or '' (cut before a glued line, or the end of the stream)

    @property
    def blank(self) -> bool:
        return not self.raw


def parse_prefix(raw: str) -> tuple[str | None, int | None, str]:
    """(timestamp, TP rank, message) of one line; (None, None, line) when it has no SGLang prefix."""
    match = _PREFIX.match(raw)
    if not match:
        return None, None, raw
    tp = _TP_TAG.search(match["tags"] or "")
    return match["ts"], int(tp.group(1)) if tp else None, raw[match.end() :]


class LineSplitter:
    """Incremental bytes -> lines. Keeps an unfinished last piece until its terminator arrives."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._seq = 0

    @property
    def pending(self) -> str:
        """The unterminated tail (e.g. a bar being drawn), without ANSI escapes."""
        return _ANSI.sub("", self._pending).strip("\r")

    def feed(self, data: bytes) -> list[LogLine]:
        buffer = self._pending + self._decoder.decode(data)
        lines: list[LogLine] = []
        start = 0
        index = 0
        length = len(buffer)
        while index < length:
            char = buffer[index]
            if char == "\r" and index + 1 == length:
                break  # maybe the first half of a '\r\n': decide when the next bytes come
            if char in "\r\n":
                crlf = char == "\r" and buffer[index + 1] == "\n"
                self._emit(buffer[start:index], "\r" if char == "\r" and not crlf else "\n", lines)
                index += 2 if crlf else 1
                start = index
                continue
            index += 1
        self._pending = buffer[start:]
        return lines

    def flush(self) -> list[LogLine]:
        """End of stream: the unterminated tail becomes a line."""
        lines: list[LogLine] = []
        tail = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        self._emit(tail, "", lines)
        return lines

    def _emit(self, piece: str, ending: str, out: list[LogLine]) -> None:
        text = _ANSI.sub("", piece)
        # A rank's log line written right after another rank's '\r' bar update lands on the same physical
        # line: "...| 8/64 [00:03<00:21]" + "[2026-01-02 03:04:05 TP0] Load weight begin." Cut before the prefix.
        cuts = [m.start() for m in _EMBEDDED_PREFIX.finditer(text) if m.start() > 0]
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        if not text.strip():
            if ending == "\n" and piece == text:  # a bare newline (an escape sequence alone is no newline of a bar)
                out.append(LogLine(seq=self._seq, raw="", message="", rank=None, transient=False, ending="\n"))
                self._seq += 1
            return
        for index, part in enumerate(pieces):
            raw = part.rstrip()
            if not raw.strip():
                continue
            _, rank, message = parse_prefix(raw)
            end = ending if index == len(pieces) - 1 else ""
            out.append(LogLine(self._seq, raw, message, rank, transient=end != "\n", ending=end))
            self._seq += 1


class LogTail:
    """The last lines as a person would see them: bar updates overwritten, each bar's final state kept."""

    def __init__(self, limit: int = 50, live_bars: int = 16) -> None:
        self._lines: deque[str] = deque(maxlen=limit)
        self._live: deque[str] = deque(maxlen=live_bars)  # transient lines since the last permanent one
        self._limit = limit

    def add(self, line: LogLine) -> None:
        if line.blank:  # a newline alone ends what a terminal shows on that line: the last bar update
            if self._live:
                self._lines.append(self._live[-1])
                self._live.clear()
            return
        if line.transient:
            self._live.append(line.raw)
        else:
            self._live.clear()
            self._lines.append(line.raw)

    def lines(self, pending: str = "") -> list[str]:
        tail = list(self._lines) + list(self._live)
        if pending.strip():
            tail.append(pending.rstrip())
        return tail[-self._limit :]


class FileFollower:
    """Reads what was appended to a file since the last call; a missing file reads as empty."""

    def __init__(self, path: Path, *, tail_lines: int = 50, chunk: int = 1 << 20) -> None:
        self.path = path
        self.bytes_read = 0
        self._offset = 0
        self._chunk = chunk
        self._splitter = LineSplitter()
        self._tail = LogTail(tail_lines)

    def read_new(self) -> list[LogLine]:
        """Every complete line appended since the last call (never blocks)."""
        try:  # never block (a FIFO put in its place) and never read a device (/dev/full never ends)
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return []
            data = os.pread(descriptor, self._chunk, self._offset)
        finally:
            os.close(descriptor)
        if not data:
            return []
        self._offset += len(data)
        self.bytes_read += len(data)
        lines = self._splitter.feed(data)
        for line in lines:
            self._tail.add(line)
        return lines

    def read_all_new(self) -> list[LogLine]:
        """Everything appended so far, however large (used once the writer has stopped)."""
        lines: list[LogLine] = []
        while True:
            batch_start = self.bytes_read
            lines += self.read_new()
            if self.bytes_read == batch_start:
                return lines

    @property
    def pending(self) -> str:
        return self._splitter.pending

    def tail(self) -> list[str]:
        return self._tail.lines(self.pending)


class StreamPump:
    """Copies a byte stream (a container's log stream) into a file on a daemon thread."""

    def __init__(self, chunks: Iterable[bytes], sink: BinaryIO, *, name: str = "smoke-log-pump") -> None:
        self._chunks = chunks
        self._sink = sink
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> StreamPump:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for chunk in self._chunks:
                if chunk:
                    self._sink.write(chunk)
                    self._sink.flush()
        except Exception as error:  # a closed stream at shutdown ends the copy; keep the reason
            self.error = error
        finally:
            self._sink.close()

    def join(self, timeout: float) -> bool:
        """Wait for the copy to end; True when it did."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
