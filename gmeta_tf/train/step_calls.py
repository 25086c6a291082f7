"""How many steps each compiled call trains (``train.steps_per_call``).

A call of k steps returns to Python once, so whatever the trainer does between steps can only
happen at a call's end. Logging, validation, checkpoints, the last step and a fault test's
pause (``GMETA_PAUSE_AT_STEP``) must still land on their own steps, so a call ends at the first
of them. The lengths are a pure function of the config, the run's end and the pause step, so
every rank computes the same ones: each call length is a different traced graph, and ranks that
ran different graphs would not meet in the same all-reduces. The pause step bounds the calls of
every rank, including with ``N:RANK``, for that reason.

What stays per step inside a call: the loss of each step (the log's window mean is over the
same steps), the stop vote (it rides in each step's all-reduce; it is set before the call, so a
stop request is acted on at the call's end, whose step is checkpointed on every rank). Eviction
(``model.max_rows``) runs between steps, so bounded tables train one step per call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from gmeta_tf.config.schema import Config
from gmeta_tf.train.fault_pause import PausePoint


@dataclass(frozen=True)
class CallPlan:
    """``steps_per_call``: the most steps in a call; ``every``: the periods whose multiples end a
    call (log, validation, checkpoint); ``marks``: single steps that end a call (the last step,
    the pause step)."""

    steps_per_call: int
    every: Tuple[int, ...]
    marks: Tuple[int, ...]

    def length(self, first: int) -> int:
        """Steps in the call that starts at step ``first`` (>= 1)."""
        last = first + self.steps_per_call - 1
        for n in self.every:
            last = min(last, -(-first // n) * n)  # the first multiple of n at or after ``first``
        for mark in self.marks:
            if mark >= first:
                last = min(last, mark)
        return last - first + 1


def call_plan(cfg: Config, end: int, pause: Optional[PausePoint] = None) -> CallPlan:
    """The run's call plan: ``end`` is the step the run trains to."""
    t = cfg.train
    k = 1 if cfg.model.max_rows else t.steps_per_call
    every = tuple(n for n in (t.log_every, t.eval_every, t.checkpoint_every) if n > 0)
    marks = (end, t.steps) + ((pause.step,) if pause is not None else ())
    return CallPlan(k, every, marks)
