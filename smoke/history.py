"""Phase history: every smoke (and bench) run's start-up timings, kept in one local SQLite file.

A run is filed under its key: recipe, image id, model folder digest (config and safetensors headers, not
the weights), engine and version, and the node's GPU names and count. Two runs with the same key should
start alike, so a phase that takes more than max(2 x median, median + 60 s) of the last 5 runs with that
key (at least 3 needed) is a regression: "loading-weights 1500 s, median 22 s".

SQLite in WAL mode with a busy timeout: several smoke runs on one node may write at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import sqlite3
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bwstack.errors import SmokeError

WINDOW = 5  # runs compared against
MINIMUM = 3  # runs needed before anything is judged
FACTOR = 2.0
SLACK_S = 60.0
_HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is not one
_WEIGHTS_LINE = re.compile(r"elapsed=(?P<s>[0-9.]+) s.*?mem usage=(?P<gb>[0-9.]+) GB")


def default_path() -> Path:
    """$BWSTACK_HISTORY, else the user's data folder (XDG): ~/.local/share/bwstack/history.sqlite."""
    given = os.environ.get("BWSTACK_HISTORY")
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "bwstack" / "history.sqlite"


@dataclass(frozen=True)
class RunKey:
    recipe: str
    image: str  # the image id (sha256:...) when the run used one, else ""
    model: str  # model folder digest, or ""
    engine: str  # "sglang 0.5.23", or just the engine when its version is not known
    gpus: str  # "2x NVIDIA RTX PRO 6000 Blackwell", or "none"

    @property
    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        parts = [self.recipe, self.engine, self.gpus]
        if self.image:
            parts.append(self.image[:19])
        if self.model:
            parts.append(f"model {self.model[:12]}")
        return ", ".join(p for p in parts if p)


def model_digest(folder: Path | None) -> str:
    """sha256 over config.json and every safetensors header: the checkpoint's shape, read in milliseconds."""
    if folder is None or not folder.is_dir():
        return ""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*.safetensors")):
        digest.update(path.name.encode())
        try:
            with path.open("rb") as handle:
                if path.suffix == ".json":
                    digest.update(handle.read(_HEADER_LIMIT))
                    continue
                head = handle.read(8)
                size = int.from_bytes(head, "little") if len(head) == 8 else 0
                digest.update(head + handle.read(min(size, _HEADER_LIMIT)))
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()


def gpu_label(names: list[str]) -> str:
    if not names:
        return "none"
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n}x {name}" for name, n in sorted(counts.items()))


def phase_durations(phase_history: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds spent in each phase: from its first line to the next phase's (the last phase has none)."""
    durations: dict[str, float] = {}
    for this, following in itertools.pairwise(phase_history):
        durations[this["phase"]] = round(float(following["at_s"]) - float(this["at_s"]), 3)
    return durations


def weights_gb_s(phase_history: list[dict[str, Any]]) -> float | None:
    """GB/s from SGLang's `Load weight end. elapsed=X s, ... mem usage=Y GB` when the log says so."""
    for entry in phase_history:
        match = _WEIGHTS_LINE.search(entry.get("line", ""))
        if entry["phase"] == "weights-loaded" and match and float(match["s"]) > 0:
            return round(float(match["gb"]) / float(match["s"]), 3)
    return None


@dataclass(frozen=True)
class Regression:
    phase: str
    seconds: float
    median_s: float
    runs: int

    @property
    def finding(self) -> str:
        return f"{self.phase} {self.seconds:g} s, median {self.median_s:g} s of the last {self.runs} runs"


def regressions(
    current: dict[str, float], previous: list[dict[str, float]], *, slack_s: float = SLACK_S
) -> list[Regression]:
    """Phases of `current` over max(2 x median, median + slack) of the last WINDOW `previous` runs."""
    window = previous[-WINDOW:]
    found = []
    for phase, seconds in current.items():
        past = [run[phase] for run in window if phase in run]
        if len(past) < MINIMUM:
            continue
        median = statistics.median(past)
        if seconds > max(FACTOR * median, median + slack_s):
            found.append(Regression(phase, round(seconds, 3), round(median, 3), len(past)))
    return found


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    key_digest TEXT NOT NULL,
    key TEXT NOT NULL,
    verdict TEXT NOT NULL,
    timings TEXT NOT NULL,
    extra TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_key ON runs (key_digest, id);
"""


@dataclass(frozen=True)
class Run:
    id: int
    at: float
    kind: str
    key: RunKey
    verdict: str
    timings: dict[str, float]  # phase durations, plus to-listening / to-ready
    extra: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "kind": self.kind,
            "key": asdict(self.key),
            "key_digest": self.key.digest,
            "verdict": self.verdict,
            "timings": self.timings,
            **self.extra,
        }


class HistoryStore:
    """One SQLite file; each call opens and closes its own connection (no state shared across threads)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as error:
            raise SmokeError(
                f"cannot open the history {self.path}: {error}", remedy="pass --history a writable file path"
            ) from None
        return conn

    def record(
        self, kind: str, key: RunKey, verdict: str, timings: dict[str, float], extra: dict[str, Any] | None = None
    ) -> int:
        conn = self._connect()
        try:
            with conn:
                cursor = conn.execute(
                    "INSERT INTO runs (at, kind, key_digest, key, verdict, timings, extra) VALUES (?,?,?,?,?,?,?)",
                    (
                        time.time(),
                        kind,
                        key.digest,
                        json.dumps(asdict(key), sort_keys=True),
                        verdict,
                        json.dumps(timings),
                        json.dumps(extra or {}),
                    ),
                )
            return int(cursor.lastrowid or 0)
        except sqlite3.Error as error:
            raise SmokeError(f"cannot write the history {self.path}: {error}") from None
        finally:
            conn.close()

    def runs(self, *, key: RunKey | None = None, last: int = 20, before_id: int | None = None) -> list[Run]:
        """The newest `last` runs (of one key, older than `before_id` when given), oldest first."""
        if not self.path.exists():
            return []
        clauses, params = [], []
        if key is not None:
            clauses.append("key_digest = ?")
            params.append(key.digest)
        if before_id is not None:
            clauses.append("id < ?")
            params.append(before_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        conn = self._connect()
        try:
            rows = conn.execute(
                f"SELECT id, at, kind, key, verdict, timings, extra FROM runs {where} ORDER BY id DESC LIMIT ?",
                (*params, max(0, last)),
            ).fetchall()
        except sqlite3.Error as error:
            raise SmokeError(f"cannot read the history {self.path}: {error}") from None
        finally:
            conn.close()
        return [
            Run(row[0], row[1], row[2], RunKey(**json.loads(row[3])), row[4], json.loads(row[5]), json.loads(row[6]))
            for row in reversed(rows)
        ]


def timings_of(data: dict[str, Any]) -> dict[str, float]:
    """A smoke report's phase durations and its times to listening and to ready."""
    timings = phase_durations(data.get("phase_history") or [])
    for name, field_name in (("to-listening", "listening_after_s"), ("to-ready", "ready_after_s")):
        if data.get(field_name) is not None:
            timings[name] = round(float(data[field_name]), 3)
    return timings


def image_id(client: Any, reference: str | None) -> str:
    """The local image's id for the key (a tag can move; the id cannot); "" when it cannot be read."""
    if client is None or not reference:
        return ""
    with contextlib.suppress(Exception):  # the SDK raises several types; the key then carries no image
        return str(client.images.get(reference).id)
    return ""


@dataclass(frozen=True)
class HistoryOptions:
    """Where a run is recorded, and whether a regression fails it (else it is a warning)."""

    path: Path
    fail_on_regression: bool = False
    kind: str = "smoke"


def run_key(
    *,
    recipe: str,
    engine: str,
    model: Path | None,
    gpu_names: list[str],
    image: str = "",
    command: tuple[str, ...] = (),
) -> RunKey:
    """The key a run is filed under; the engine's version comes from the recipe's pin when it has one.
    A run given `command` (smoke --command) is filed under that command line's digest instead of a recipe:
    two different servers started by hand must not be compared with each other."""
    from_recipe = not command
    version = ""
    if from_recipe:
        from bwstack.errors import RecipeError
        from bwstack.recipes import load_recipe

        with contextlib.suppress(RecipeError):
            pinned = load_recipe(recipe)
            version = pinned.sglang.version if engine == "sglang" and pinned.sglang else ""
    return RunKey(
        recipe=recipe if from_recipe else "--command " + hashlib.sha256("\0".join(command).encode()).hexdigest()[:8],
        image=image,
        model=model_digest(model),
        engine=f"{engine} {version}".strip(),
        gpus=gpu_label(gpu_names),
    )


def file_run(options: HistoryOptions, key: RunKey, report: Any) -> list[Regression]:
    """Record a finished smoke report's timings, compare them with the key's last runs, and add a
    `regression` check (a warning, or a failure under fail_on_regression) and a `history` entry."""
    from bwstack.report import Check, Status

    store = HistoryStore(options.path)
    timings = timings_of(report.data)
    extra = {"subject": report.subject, "weights_gb_s": weights_gb_s(report.data.get("phase_history") or [])}
    run_id = store.record(options.kind, key, str(report.data.get("verdict", "")), timings, extra)
    previous = [run.timings for run in store.runs(key=key, last=WINDOW, before_id=run_id) if run.verdict == "ready"]
    found = regressions(timings, previous)
    if found:
        report.add(
            Check(
                "regression",
                Status.FAIL if options.fail_on_regression else Status.WARN,
                "; ".join(r.finding for r in found),
                evidence={"regressions": [asdict(r) for r in found], "key": asdict(key), "history": str(store.path)},
                remedy="compare the slow phase's log lines with an earlier run's (disk, network storage, page cache)",
            )
        )
    elif len(previous) < MINIMUM:
        report.add(Check("regression", Status.SKIP, f"{len(previous)} earlier runs with this key, {MINIMUM} needed"))
    else:
        runs = len(previous[-WINDOW:])
        finding = f"no phase over max(2 x median, median + 60 s) of the last {runs} runs"
        report.add(Check("regression", Status.PASS, finding))
    report.data["history"] = {
        "path": str(store.path),
        "run_id": run_id,
        "key": asdict(key),
        "key_digest": key.digest,
        "timings": timings,
        "regressions": [asdict(r) for r in found],
        **extra,
    }
    return found
