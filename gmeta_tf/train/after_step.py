"""What happens after each compiled call, one handler per concern, in the order ``handlers`` lists.

The step loop (``step_loop.py``) runs a call, then hands its ``StepEnd`` to each handler in turn.
The order is the behaviour: the log line of a step comes before its validation line, the
validation before the checkpoint that records it, the checkpoint before the elastic commit, the
fault triggers and the early stop. Each handler's docstring says why it sits where it does;
``tests/test_after_step_order.py`` fails if the order changes. Every handler runs on every rank
(the collectives inside them must meet); what only rank 0 does is inside.
"""
from __future__ import annotations

import signal
import time
from typing import Dict, List, Optional, Protocol

from gmeta_tf.errors import Preempted
from gmeta_tf.train.built import Built
from gmeta_tf.train.failures import injected_failure, raise_injected
from gmeta_tf.train.fault_pause import PausePoint, freeze
from gmeta_tf.train.loop_state import LoopState, RunContext, StepEnd
from gmeta_tf.train.preemption import PreemptionWatch, stopping
from gmeta_tf.train.progress import log_window
from gmeta_tf.train.restarts import Restart, complete, describe
from gmeta_tf.train.run_files import checkpoint_files, data_record
from gmeta_tf.train.runtime import Runtime
from gmeta_tf.train.validation import OnValidation, validation_point


class AfterStep(Protocol):
    def after_step(self, end: StepEnd) -> None: ...


class Committer(Protocol):  # loop_strategy.Strategy, as the commit handler sees it
    def commit(self, step: int) -> None: ...


class StatusHandler:
    """First: this rank's status record says the step is done (written through at log steps)
    before any collective after it can fail or hang, so a peer that blames this rank
    (``failures.step_failure``) reads the step it got to."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def after_step(self, end: StepEnd) -> None:
        train = self.ctx.cfg.train
        self.ctx.watch.status.update(step=end.step, write_now=end.step % train.log_every == 0 or end.last)


class EvictHandler:
    """``model.max_rows``: the tables are bounded before anything after the step reads them
    (validation scores them, a checkpoint saves them)."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def after_step(self, end: StepEnd) -> None:
        if self.ctx.cfg.model.max_rows:
            evict(self.ctx.built, self.ctx.rt, self.ctx.cfg.model.max_rows)


class LogHandler:
    """The call's losses go into the log window, a restarted run's first call completes the
    restart's record (``restarts.py``), and at a log step the line is written: before validation,
    so a step's loss line comes before its valid line and the window's time holds no scoring."""

    def __init__(self, ctx: RunContext, at: LoopState, start: int, restarts: List[Restart],
                 marks: Optional[Dict[str, float]]):
        self.ctx, self.at, self.start, self.restarts, self.marks = ctx, at, start, restarts, marks

    def after_step(self, end: StepEnd) -> None:
        cfg, rt, at = self.ctx.cfg, self.ctx.rt, self.at
        at.window.add_call(end.losses)
        if end.first == at.start + 1 and self.restarts:
            rt.log(describe(complete(self.restarts, self.start, marks=self.marks)))
        if end.step % cfg.train.log_every == 0 or end.last:
            log_window(cfg, rt, at.window, end.step, at.history, at.writer)


class ValidateHandler:
    """At a validation step rank 0 scores the valid split and every rank learns whether it
    improved and whether to stop early: before the checkpoint, which records the tracker's state,
    is forced by either, and marks an improved step best."""

    def __init__(self, ctx: RunContext, at: LoopState, on_validation: Optional[OnValidation]):
        self.ctx, self.at, self.on_validation = ctx, at, on_validation

    def after_step(self, end: StepEnd) -> None:
        cfg, rt, tracker = self.ctx.cfg, self.ctx.rt, self.ctx.tracker
        if cfg.train.eval_every > 0 and (end.step % cfg.train.eval_every == 0 or end.last):
            end.improved = validation_point(cfg, self.ctx.built.model, rt, tracker, end.step, self.at.writer,
                                            self.on_validation)
            self.at.stopped = bool(rt.sync.broadcast_int(int(tracker.should_stop) if rt.rank == 0 else 0))


class CheckpointHandler:
    """A checkpoint at ``checkpoint_every``, the last step, an improved or early-stopped step and
    the step a stop request is acted on (its status says STOPPING first). After validation (see
    there); before the preemption's exit, the elastic commit and the fault triggers, so a rank
    stopped or frozen at a step has that step's checkpoint."""

    def __init__(self, ctx: RunContext, at: LoopState):
        self.ctx, self.at = ctx, at

    def after_step(self, end: StepEnd) -> None:
        cfg, rt, tracker, watch = self.ctx.cfg, self.ctx.rt, self.ctx.tracker, self.ctx.watch
        if not (end.improved or self.at.stopped or end.preempted or end.step % cfg.train.checkpoint_every == 0
                or end.last):
            return
        meta = {"algo": cfg.meta.algo, "ranks": rt.size, "ps": rt.ps_tasks,
                "data": data_record(cfg.data.path, self.ctx.schema), "validation": tracker.state()}
        if end.preempted:
            stopping(watch)
        end.save_t0 = time.perf_counter()
        end.checkpoint = save_checkpoint(self.ctx.built, rt, end.step, meta, checkpoint_files(cfg))
        watch.status.update(checkpoint=end.step)
        if end.improved and rt.rank == 0:
            self.ctx.built.ckpt.mark_best(end.checkpoint, tracker.summary())


class PreemptionHandler:
    """Right after the agreed step's checkpoint every rank raises ``Preempted`` (the last step
    needs none: the run ends there anyway), before a commit or a fault trigger could run."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def after_step(self, end: StepEnd) -> None:
        if end.preempted and not end.last:
            raise preempted_error(self.ctx.rt, self.ctx.watch, end.step, end.checkpoint,
                                  time.perf_counter() - end.save_t0)


class CommitHandler:
    """The elastic commit (``loop_strategy.ElasticStrategy.commit``; nothing in a static ring):
    after the checkpoint, so a ring that a commit re-forms (``HostsUpdatedInterrupt``) has it; before
    the fault triggers, so a fault at a commit step rolls the ring back to that step."""

    def __init__(self, strategy: Committer):
        self.strategy = strategy

    def after_step(self, end: StepEnd) -> None:
        self.strategy.commit(end.step)


class FaultHandler:
    """A fault test's triggers (``GMETA_FAIL_FROM_STEP``, ``GMETA_PAUSE_AT_STEP``): after everything
    the step owes (its checkpoint, its commit), so the fault lands exactly after step N whatever the
    load (``fault_pause.py``); before the early stop, which would end the loop first."""

    def __init__(self, ctx: RunContext, fail: Optional[PausePoint], pause: Optional[PausePoint]):
        self.ctx, self.fail, self.pause = ctx, fail, pause

    def after_step(self, end: StepEnd) -> None:
        raise_injected(self.fail, end.step, self.ctx.rt.rank)
        if self.pause is not None and self.pause.due(end.step, self.ctx.rt.rank):
            freeze()


class EarlyStopHandler:
    """Last: a run that stops early ends after its stopping step was logged, validated,
    checkpointed and committed like any other."""

    def __init__(self, ctx: RunContext, at: LoopState):
        self.ctx, self.at = ctx, at

    def after_step(self, end: StepEnd) -> None:
        if not self.at.stopped:
            return
        rt, tracker = self.ctx.rt, self.ctx.tracker
        if rt.rank == 0:
            rt.log(f"early stop at step {end.step}: {tracker.metric} did not improve in "
                   f"{tracker.since_best} validations; best {tracker.best_value:.4f} at step {tracker.best_step}")
        end.stop = True


def handlers(ctx: RunContext, at: LoopState, strategy: Committer, on_validation: Optional[OnValidation],
             start: int, restarts: List[Restart], marks: Optional[Dict[str, float]],
             pause: Optional[PausePoint]) -> List[AfterStep]:
    """The after-step handlers in their order (each one's docstring says why it sits there)."""
    return [StatusHandler(ctx), EvictHandler(ctx), LogHandler(ctx, at, start, restarts, marks),
            ValidateHandler(ctx, at, on_validation), CheckpointHandler(ctx, at), PreemptionHandler(ctx),
            CommitHandler(strategy), FaultHandler(ctx, injected_failure(), pause), EarlyStopHandler(ctx, at)]


def preempted_error(rt: Runtime, watch: PreemptionWatch, step: int, path: Optional[str], save_s: float) -> Preempted:
    """Every rank raises this after the agreed step's checkpoint is complete."""
    asked = (f"{signal.Signals(watch.signum).name} {watch.elapsed_s:.1f} s ago" if watch.requested
             else "a peer rank was asked to stop")
    where = f" ({path})" if path else ""
    return Preempted(f"rank {rt.rank}: preempted ({asked}): every rank checkpointed step {step}{where} "
                     f"in {save_s:.2f} s; "
                     f"re-run with the same --out to resume there, nothing to redo", step, watch.exit_signal(), save_s)


def save_checkpoint(built: Built, rt: Runtime, step: int, meta: dict, files: Dict[str, str]) -> Optional[str]:
    """Every rank pauses while rank 0 exports the PS tables, so the checkpoint is one consistent
    state and not a mix of before and after other ranks' updates. Each rank first writes its
    pending (write-behind) cold-row updates, after closing an open hot window
    (``model.hot_sync_every``): what is saved is the synced replica. Returns the path on rank 0."""
    embeddings = built.model.embeddings
    embeddings.sync_hot()
    embeddings.quiesce()
    rt.sync.barrier()
    path = None
    if rt.rank == 0:
        embeddings.step_boundary()
        path = built.ckpt.save(step, meta, files=files)
    rt.sync.barrier()
    return path


def evict(built: Built, rt: Runtime, max_rows: Dict[str, int]) -> None:
    """Bound the tables of ``model.max_rows`` between steps: every rank's updates are on the PS
    (an open hot window closed, quiesce, barrier) before rank 0 removes rows, and nobody steps
    until it is done."""
    built.model.embeddings.sync_hot()
    built.model.embeddings.quiesce()
    rt.sync.barrier()
    if rt.rank == 0:
        built.model.embeddings.evict(max_rows)
    rt.sync.barrier()
