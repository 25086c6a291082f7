"""The values the step loop, its after-step handlers and its strategy share.

Three lifetimes, three records: ``RunContext`` is what the trainer's phases built before the
first step and nobody replaces; ``LoopState`` is what the loop carries from call to call (and
across an elastic ring's re-forming); ``StepEnd`` is one call's end as the handlers pass it
along (each reads what the ones before it found: the validation's ``improved``, the
checkpoint's path). Their own module so that ``step_loop.py``, ``after_step.py`` and
``loop_strategy.py`` import them downward and not each other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from gmeta_tf.config.schema import Config
from gmeta_tf.train.built import Built
from gmeta_tf.train.preemption import PreemptionWatch
from gmeta_tf.train.progress import Window, previous_history
from gmeta_tf.train.runtime import Runtime
from gmeta_tf.train.validation import BestTracker


@dataclass
class RunContext:
    """What every part of the loop reads: the config, where this process runs, the run directory,
    the data's schema (checkpoints record it), what was built, the validation tracker and this
    rank's preemption watch (which holds its status record)."""

    cfg: Config
    rt: Runtime
    run_dir: str
    schema: dict
    built: Built
    tracker: BestTracker
    watch: PreemptionWatch


@dataclass
class LoopState:
    """What the training loop carries across calls, and across an elastic ring's re-forming."""

    history: list
    window: Window
    step: int
    stopped: bool
    end: int
    start: int  # the step the run resumed after (an elastic ring's: rank 0's, from DenseCommit.sync)
    writer: Optional[object] = None  # rank 0's TensorBoard writer
    ring: List[List[int]] = field(default_factory=list)  # elastic: [step, rank, size] at each (re-)entry
    since_unix: Optional[float] = None  # elastic: when the ring last (re-)formed; a peer lost before is not news

    @classmethod
    def at_start(cls, cfg: Config, run_dir: str, start: int, stopped: bool) -> "LoopState":
        """A resumed run continues the log history its earlier attempts wrote up to ``start``; a
        run that already stopped early trains to where it is (no step)."""
        return cls(history=[h for h in previous_history(run_dir) if h["step"] <= start] if start else [],
                   window=Window(cfg.data.tasks_per_batch), step=start, stopped=stopped,
                   end=start if stopped else cfg.train.steps, start=start)

    @property
    def ring_step(self) -> Optional[int]:
        """The commit the ring last (re-)formed at; None outside an elastic ring (no entry)."""
        return self.ring[-1][0] if self.ring else None


@dataclass
class StepEnd:
    """The end of one compiled call (steps ``first .. step``), handed from handler to handler."""

    first: int
    step: int
    losses: List[float]
    preempted: bool  # some rank was asked to stop: every rank checkpoints ``step``, then stops
    last: bool  # ``step`` is ``train.steps``
    improved: bool = False  # validation: this step is the best so far (every rank agrees)
    checkpoint: Optional[str] = None  # the path rank 0 saved this step's checkpoint at
    save_t0: Optional[float] = None  # ``time.perf_counter()`` when this step's checkpoint began
    stop: bool = False  # the loop ends after this call (an early stop)
