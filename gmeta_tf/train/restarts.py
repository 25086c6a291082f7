"""The restarts a job went through, handed from the launcher to the run it restarts.

``gmeta launch local --max-restarts N`` knows why a cluster died (which process, its exit code,
the last step it saw) but not when training is back: that is the first step the restarted
trainer completes. So the launcher passes what it knows in one environment variable and rank 0
of the restarted run completes each record (the step it resumed from, steps redone, seconds from
the failure to that first step), logs it and writes the list into ``train_summary.json``. No
file is shared, so a run directory on an object store works the same.

Each record carries the moments of its recovery (``marks``, Unix times): the launcher's (the
old cluster's workers exited, it was torn down, the new one was started after the back-off,
its PS answered) and rank 0's own (its process started, it joined the cluster, the checkpoint
was restored, the first step was done). ``timeline_s`` is each of them in seconds after the
failure: where a recovery's time goes (docs/fault_tolerance.md, "Recovery timeline").
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

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
    marks: Dict[str, float] = field(default_factory=dict)
    timeline_s: Optional[Dict[str, float]] = None


# The moments of a recovery, in the order they happen (launcher's, then rank 0's).
MOMENTS = ("workers_exited", "cluster_stopped", "relaunched", "ps_ready",
           "rank_started", "rank_joined", "rank_restored", "first_step")


def mark(history: List[Restart], moment: str, at: Optional[float] = None) -> None:
    """Record ``moment`` (one of ``MOMENTS``) of the newest restart."""
    if history:
        history[-1].marks[moment] = time.time() if at is None else at


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


def complete(history: List[Restart], start: int, now: Optional[float] = None,
             marks: Optional[Dict[str, float]] = None) -> Optional[Restart]:
    """Fill in the newest record once this run completed its first step after ``start``;
    ``marks``: rank 0's own moments."""
    if not history:
        return None
    last = history[-1]
    now = time.time() if now is None else now
    last.resumed_from_step = start
    if last.failed_at_step is not None:
        last.steps_redone = max(last.failed_at_step - start, 0)
    last.recovery_s = round(now - last.failed_at_unix, 3)
    last.marks.update(marks or {}, first_step=now)
    last.timeline_s = {m: round(last.marks[m] - last.failed_at_unix, 2) for m in MOMENTS if m in last.marks}
    return last


def describe(r: Restart) -> str:
    redone = f", {r.steps_redone} step(s) redone" if r.steps_redone is not None else ""
    timeline = ", ".join(f"{m.replace('_', ' ')} {s:.1f}" for m, s in (r.timeline_s or {}).items())
    return (f"restart {r.attempt}: resumed at step {r.resumed_from_step} after {r.cause}{redone}; "
            f"{r.recovery_s:.1f} s from the failure to this step" + (f" (s after it: {timeline})" if timeline else ""))
