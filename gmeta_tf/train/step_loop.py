"""The step loop: data, the stop vote and the compiled call; everything after a call is a handler.

``StepLoop.train_from`` reads the training data from a step on, and per call (``step_calls.py``:
up to ``train.steps_per_call`` steps, ending at each step something is due) sets the stop vote
(``preemption.py``), runs the call and hands its end to the after-step handlers
(``after_step.py``, in their order: status, eviction, log, validation, checkpoint, preemption,
elastic commit, fault triggers, early stop). ``StepLoop.run`` runs it under the run's strategy
(``loop_strategy.py``: once, or under Horovod Elastic) and turns a failed step or collective into
the error that names who is at fault (``failures.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import tensorflow as tf

from gmeta_tf import storage
from gmeta_tf.metaio.reader import make_dataset
from gmeta_tf.train import after_step
from gmeta_tf.train.built import Built
from gmeta_tf.train.failures import step_failure
from gmeta_tf.train.fault_pause import PausePoint, pause_point
from gmeta_tf.train.loop_state import LoopState, RunContext, StepEnd
from gmeta_tf.train.loop_strategy import Strategy
from gmeta_tf.train.restarts import Restart, from_env
from gmeta_tf.train.run_summary import RunResult
from gmeta_tf.train.runtime import Runtime
from gmeta_tf.train.step_calls import call_plan
from gmeta_tf.train.validation import OnValidation


@dataclass
class StepLoop:
    """Steps ``start+1 .. end`` of one run on this rank, and what it carries between them."""

    ctx: RunContext
    at: LoopState
    strategy: Strategy
    handlers: List[after_step.AfterStep]
    restarts: List[Restart]  # rank 0: this job's earlier attempts (``gmeta launch local --max-restarts``)
    pause: Optional[PausePoint]  # a fault test's trigger (GMETA_PAUSE_AT_STEP); None in a real job

    @classmethod
    def for_run(cls, ctx: RunContext, start: int, stopped: bool, on_validation: Optional[OnValidation],
                marks: Optional[Dict[str, float]], strategy: Strategy) -> "StepLoop":
        """The loop of a run restored at ``start`` (``stopped``: it already stopped early);
        ``marks``: this rank's start-up timeline, for a restart's record."""
        at = LoopState.at_start(ctx.cfg, ctx.run_dir, start, stopped)
        restarts = from_env() if ctx.rt.rank == 0 else []
        pause = pause_point()
        handlers = after_step.handlers(ctx, at, strategy, on_validation, start, restarts, marks, pause)
        return cls(ctx, at, strategy, handlers, restarts, pause)

    def run(self) -> RunResult:
        """Train under the strategy; a failed step or collective (log, validation, checkpoint) is
        raised as what the PS and the peers say it is, or as it is when it is this rank's own."""
        ctx, at = self.ctx, self.at
        try:
            self.strategy.run(ctx, at, self.train_from)
        except Exception as e:
            failure = step_failure(e, ctx.rt, at.step, ctx.watch.status.directory, ctx.watch.status.status,
                                   at.since_unix, at.ring_step)
            if failure is None:  # nothing elsewhere is at fault: this rank's own error
                raise
            raise failure from None
        return RunResult(at.start, at.end, at.step if at.start < at.end else at.start, at.stopped, at.window,
                         at.history, at.writer, self.restarts, ring=at.ring, joined=self.strategy.joined(ctx))

    def train_from(self, begin: int) -> None:
        """Steps ``begin+1 .. end``, each call's end handed to the handlers in order."""
        cfg, rt, at = self.ctx.cfg, self.ctx.rt, self.at
        if rt.rank == 0 and at.writer is None:
            at.writer = tf.summary.create_file_writer(storage.join(self.ctx.run_dir, "tb"))
        # train.steps_per_call: each call ends where a handler has work (step_calls.py); the end is
        # read here, as an elastic ring's rank 0 said it (DenseCommit.sync).
        plan = call_plan(cfg, at.end, self.pause)
        # The pipeline is deterministic (seeded shuffles, ordered interleave), so skipping the
        # batches already trained on makes a resumed run see exactly the data it would have seen.
        # Rank and size are read here: an elastic ring re-forms smaller and re-shards the files.
        it = iter(make_dataset(cfg.data.path, "train", cfg.data, rank=rt.rank, size=rt.size,
                               training=True).skip(begin))
        upcoming = next(it) if begin < at.end else None
        at.step = begin
        while at.step < at.end:
            first = at.step + 1
            last_of_call = first + plan.length(first) - 1
            # One batch ahead: a call reads the next call's first batch's cold rows (hot.prefetch).
            batches = [upcoming] + [next(it) for _ in range(last_of_call - first)]
            upcoming = next(it) if last_of_call < at.end else None
            self.ctx.built.step_fn.vote_stop(self.ctx.watch.poll())
            at.step = first  # a failed call is reported at its first step
            losses, preempted = train_call(rt, self.ctx.built, first, batches, upcoming)
            at.step = last_of_call
            end = StepEnd(first, last_of_call, losses, preempted, last=last_of_call == cfg.train.steps)
            for handler in self.handlers:
                handler.after_step(end)
            if end.stop:
                break


def train_call(rt: Runtime, built: Built, first: int, batches: List[dict],
               upcoming: Optional[dict]) -> tuple[List[float], bool]:
    """One compiled call: steps ``first ..`` on ``batches`` (``train.steps_per_call``; one batch
    is the single step, as without the key). Returns each step's loss and whether every rank
    stops after the call (some rank was asked to: the vote rides in each step's all-reduce). An
    embedding-side failure is typed by ``Embeddings.step_errors``, a non-finite loss is one line
    naming its step; a lost PS or peer worker is translated by ``StepLoop.run`` (``failures.py``),
    which also covers the collectives after the call."""
    last = first + len(batches) - 1
    where = f"rank {rt.rank}, step {first}" if last == first else f"rank {rt.rank}, steps {first}-{last}"
    with built.model.embeddings.step_errors(where):
        if len(batches) == 1:
            out = built.step_fn.step(batches[0], upcoming, step=first)
            losses, stop = [float(out["loss"])], bool(out["stop"])
        else:
            out = built.step_fn.steps(batches, upcoming, first_step=first)
            losses, stop = [float(x) for x in out["loss"].numpy()], bool(out["stop"].numpy()[-1])
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            raise FloatingPointError(f"rank {rt.rank}: loss is {loss} at step {first + i}; lower the learning rates")
    return losses, stop
