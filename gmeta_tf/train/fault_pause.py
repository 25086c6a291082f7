"""A fault test's trigger: a rank freezes itself (SIGSTOP) once a given step is done.

A fault test must land its fault mid-run. Watching the log for "step 20" and then killing races
the run itself: a few milliseconds per step, so on a loaded box the run can end before the test
acts, and the test pays for hundreds of steps of margin. A rank that stops itself after step N
(and after that step's checkpoint, if one is due) is exactly at N whatever the load, costs no
margin, and the test can then kill it, kill its PS, or signal it and let it go on (SIGCONT).
Like ``--network-fault HOST:KIND=VALUE@STEP``, the trigger is a step, never a time.

``GMETA_PAUSE_AT_STEP=N`` freezes every rank after step N; ``N:R`` only rank R. Unset: nothing.
The trigger fires in a job's first attempt only: a rank that ``gmeta launch local`` restarted
(``GMETA_RESTARTS`` set, train/restarts.py) inherits the launcher's environment, and a fault
placed past the last checkpoint would otherwise freeze the resumed rank again when it redoes
that step, which reads as a hang of the restarted job.
With ``train.steps_per_call`` > 1, step N ends a call on every rank (``train/step_calls.py``), so
the freeze is still exactly after step N.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Mapping, Optional

from gmeta_tf.errors import UserError
from gmeta_tf.train.restarts import from_env

PAUSE_ENV = "GMETA_PAUSE_AT_STEP"


@dataclass(frozen=True)
class PausePoint:
    step: int
    rank: Optional[int] = None  # None: every rank

    def due(self, step: int, rank: int) -> bool:
        return step == self.step and self.rank in (None, rank)


def pause_point(env: Mapping[str, str] = os.environ) -> Optional[PausePoint]:
    """The pause ``GMETA_PAUSE_AT_STEP`` asks for; a malformed value is an error naming it."""
    raw = env.get(PAUSE_ENV, "").strip()
    if not raw or from_env(env):
        return None
    step, colon, rank = raw.partition(":")
    try:
        point = PausePoint(int(step), int(rank) if colon else None)
    except ValueError:
        raise UserError(f"{PAUSE_ENV}={raw!r}: expected STEP or STEP:RANK (integers)") from None
    if point.step < 1 or (point.rank is not None and point.rank < 0):
        raise UserError(f"{PAUSE_ENV}={raw!r}: the step must be >= 1 and the rank >= 0")
    return point


def freeze() -> None:
    """Stop this process where it is; it resumes on SIGCONT (or dies on SIGKILL)."""
    os.kill(os.getpid(), signal.SIGSTOP)
