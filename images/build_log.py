"""What a build's stream said, step by step: read by the progress display and by the failure classifier."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class StepLog:
    """What the build stream said, step by step."""

    total: int = 0
    current: int = 0
    instruction: str = ""
    cached: int = 0
    run: int = 0
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=30))
    image_id: str | None = None
