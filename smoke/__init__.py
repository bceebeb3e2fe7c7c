"""smoke: start an inference server, follow it through its start-up phases, prove it serves, and name a hang.

    from bwstack.smoke import SmokeRequest, run_smoke
    report = run_smoke(SmokeRequest(command=("python3", "server.py"), port=8000, stall_timeout_s=60))
    report.data["verdict"]  # ready | crash | hang | timeout | unhealthy

Modules: launch (process group / container), logfollow (incremental lines, '\\r' as a break, ranks),
phases (each engine's vocabulary), probe (TCP, /health, /v1/models, completion), activity (CPU in the
process tree, GPU via the gpu seam), watch (the verdict state machine), diagnose (evidence, py-spy,
causes and remedies), cleanup (SIGTERM, SIGKILL, container removal), interrupt (a SIGTERM to smoke
stops the server first), session (one run), reporting.
"""

from bwstack.smoke.interrupt import SmokeInterrupted
from bwstack.smoke.request import SmokeRequest
from bwstack.smoke.session import run_smoke
from bwstack.smoke.watch import Verdict

__all__ = ["SmokeInterrupted", "SmokeRequest", "Verdict", "run_smoke"]
