"""The restarts a job went through, handed from the launcher to the run it restarts.

``gmeta launch local --max-restarts N`` knows why a cluster died (which process, its exit code,
the last step it saw) but not when training is back: that is the first step the restarted
trainer completes. So the launcher passes what it knows in one environment variable and rank 0
of the restarted run completes each record (the step it resumed from, steps redone, seconds from
the failure to that first step), logs it and writes the list into ``train_summary.json``. No
file is shared, so a run directory on an object store works the same.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import List, Optional

RESTARTS_ENV = "GMETA_RESTARTS"


@dataclass
class Restart:
    """One restart. ``failed_at_step`` is the newest step the ranks' status records reported
    (``rank_status.py``: written at each logged step, each checkpoint and at a rank's exit, so a
    lower bound only for a rank killed between two logged steps)."""

    attempt: int
    cause: str
    exit_code: Optional[int]
    failed_at_step: Optional[int]
    failed_at_unix: float
    resumed_from_step: Optional[int] = None
    steps_redone: Optional[int] = None
    recovery_s: Optional[float] = None


def encode(history: List[Restart]) -> str:
    return json.dumps([asdict(r) for r in history])


def from_env(env=None) -> List[Restart]:
    raw = (os.environ if env is None else env).get(RESTARTS_ENV, "")
    if not raw:
        return []
    try:
        return [Restart(**r) for r in json.loads(raw)]
    except (ValueError, TypeError) as e:  # written by our own launcher: a broken one is a bug, not fatal
        return [Restart(0, f"unreadable {RESTARTS_ENV}: {e}", None, None, time.time())]


def complete(history: List[Restart], start: int, now: Optional[float] = None) -> Optional[Restart]:
    """Fill in the newest record once this run completed its first step after ``start``."""
    if not history:
        return None
    last = history[-1]
    last.resumed_from_step = start
    if last.failed_at_step is not None:
        last.steps_redone = max(last.failed_at_step - start, 0)
    last.recovery_s = round((time.time() if now is None else now) - last.failed_at_unix, 3)
    return last


def describe(r: Restart) -> str:
    redone = f", {r.steps_redone} step(s) redone" if r.steps_redone is not None else ""
    return (f"restart {r.attempt}: resumed at step {r.resumed_from_step} after {r.cause}{redone}; "
            f"{r.recovery_s:.1f} s from the failure to this step")
