"""What a smoke run was asked to do, checked, and turned into a command line.

A SmokeRequest is typed (the task layer, bwstack.cli.requests, turns flags into one) and checks its fields,
raising SmokeError (exit 2) that names the flag. `resolve_command` builds the server command: `--command`
as given (already split, no shell), or the recipe's `serve_command(model_path, host=..., port=...)` with the
recipe's port and engine, extended by advice (`advice_args`, from `invoke advise`) when given;
advice and `--command` do not mix.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from bwstack.errors import SmokeError

DEFAULT_STARTUP_TIMEOUT_S = 1800.0  # a cold 1T-parameter start can take many minutes; a hang is found sooner
DEFAULT_STALL_TIMEOUT_S = 120.0
DEFAULT_GRACE_S = 10.0
_GPUS = re.compile(r"^(auto|all|none|\d+(,\d+)*)$")
_SHM_SIZE = re.compile(r"^\d+[bkmg]?$", re.IGNORECASE | re.ASCII)  # Docker's --shm-size: bytes, or a b/k/m/g suffix


_TIMING_FLAGS = {
    "startup_timeout_s": "--startup-timeout",
    "stall_timeout_s": "--stall-timeout",
    "grace_s": "--grace",
    "poll_s": "poll interval",
}


@dataclass(frozen=True)
class SmokeRequest:
    command: tuple[str, ...] | None = None
    model: Path | None = None
    image: str | None = None
    recipe: str = "sglang"
    port: int | None = None
    host: str = "127.0.0.1"
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S
    engine: str | None = None  # None: the recipe's engine, or sglang for --command
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    gpus: str = "auto"  # containers: auto (all GPUs NVML sees), all, none, or ids "0,1"
    shm_size: str | None = None  # containers: None means host IPC
    grace_s: float = DEFAULT_GRACE_S
    poll_s: float = 0.25
    advice_args: tuple[str, ...] = ()  # options `invoke advise` adds to the recipe's command
    advised: bool = False  # advice was given (even advice that adds no option)

    def __post_init__(self) -> None:
        if not self.command and self.model is None:
            raise SmokeError("nothing to start: give --command CMD or --model DIR")
        if self.command and (self.advised or self.advice_args):
            raise SmokeError(
                "advice extends the recipe's command, not --command",
                remedy="drop --command, or put the advised flags into your command yourself",
            )
        if self.command is not None and not self.command:
            raise SmokeError("--command is empty")
        if self.model is not None and not self.model.is_dir():
            what = "is a file, not a folder" if self.model.exists() else "does not exist"
            raise SmokeError(f"model folder {self.model} {what}", remedy="pass the checkpoint folder to --model")
        if self.port is not None and not 0 < self.port < 65536:
            raise SmokeError(f"--port {self.port} is not in 1..65535")
        for name, flag in _TIMING_FLAGS.items():  # errors name the flag the user typed, not the field
            value = getattr(self, name)
            if not math.isfinite(value):  # nan <= 0 is False: a nan timeout would never end
                raise SmokeError(f"{flag} must be a finite number, not {value}")
            if value <= 0:
                raise SmokeError(f"{flag} must be positive, not {value}")
        if not _GPUS.match(self.gpus):
            raise SmokeError(f"--gpus {self.gpus!r}: use auto, all, none or device ids such as 0,1")
        if self.shm_size is not None and not (
            _SHM_SIZE.match(self.shm_size) and int(self.shm_size.rstrip("bkmgBKMG")) > 0
        ):
            raise SmokeError(
                f"--shm-size {self.shm_size!r} is not a size", remedy="give a whole number with b, k, m or g, e.g. 32g"
            )


@dataclass(frozen=True)
class ServerCommand:
    argv: tuple[str, ...]  # empty: the image's own command
    port: int
    engine: str
    source: str  # "--command" or "recipe <name>"


def resolve_command(request: SmokeRequest) -> ServerCommand:
    """The command to run, the port it will serve on and the engine whose log it writes."""
    if request.command:
        if request.port is None:
            raise SmokeError("--port is required with --command (smoke must know where to probe)")
        return ServerCommand(request.command, request.port, request.engine or "sglang", "--command")
    assert request.model is not None
    from bwstack.recipes import load_recipe

    recipe = load_recipe(request.recipe)
    port = request.port if request.port is not None else recipe.serve.port
    argv = recipe.serve_command(str(request.model), host=request.host, port=port) + list(request.advice_args)
    source = f"recipe {request.recipe}" + (" with advice" if request.advised else "")
    return ServerCommand(tuple(argv), port, request.engine or recipe.serve.engine, source)
