"""The training run shared by the embedded default and the distributed worker.

``train`` takes a ``Runtime`` describing where it runs (rank / size / dense-gradient sync / PS
tasks); nothing else differs between one process and N Horovod workers with M PS: the same
model, the same compiled step, the same checkpoint format. Rank 0 alone writes checkpoints,
summaries and the run's files.

``train`` is its phases, in order: ``_prepare`` (config, schema, metric), ``build_tables_once``
(``built.py``: model, optimizers, embedding tables and slots, compiled step, checkpoint manager),
``_restore`` (rank 0 reads the newest checkpoint, every rank learns its step),
``_start_tracker`` (validation state and an early stop already reached), the strategy's
``share_start_state`` (every replica starts from rank 0's weights and hot rows), ``_loop``
(``step_loop.py``: the steps; ``after_step.py``: status, log, validation, checkpoint, ... after
each call) and ``write_summary`` (summary and per-rank files). ``cluster.elastic`` is one
``loop_strategy.Strategy``, chosen here once and asked by each phase that differs under it.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, Optional

import tensorflow as tf

from gmeta_tf import storage
from gmeta_tf.config.loader import dump_config
from gmeta_tf.config.schema import Config
from gmeta_tf.metaio.reader import load_schema
from gmeta_tf.process import process_start_unix
from gmeta_tf.train.built import Built, build_tables_once
from gmeta_tf.train.checkpoint import CheckpointManager
from gmeta_tf.train.loop_state import RunContext
from gmeta_tf.train.loop_strategy import Strategy, strategy_for
from gmeta_tf.train.model_build import CONFIG_FILE
from gmeta_tf.train.preemption import PreemptionWatch
from gmeta_tf.train.rank_life import rank_life
from gmeta_tf.train.rank_status import Phase
from gmeta_tf.train.run_files import absolute_data_path, check_data, check_steps
from gmeta_tf.train.run_summary import RunResult, write_summary
from gmeta_tf.train.runtime import Runtime
from gmeta_tf.train.step_loop import StepLoop
from gmeta_tf.train.validation import BestTracker, OnValidation, resolve_metric
from gmeta_tf.train.warm_start import WARM_START_FILE, WarmStartSource, check_compatible, record, resolve

__all__ = ["Built", "Runtime", "build_tables_once", "train"]  # what other modules import from here


def train(cfg: Config, run_dir: str | Path, rt: Optional[Runtime] = None, resume: bool = True,
          on_validation: Optional[OnValidation] = None, warm_start: Optional[str] = None) -> dict:
    """Train to ``train.steps`` (or an early stop). ``on_validation(step, metrics)`` is called
    on rank 0 after each validation (``gmeta tune`` reports to Optuna there); what it raises
    propagates. ``warm_start`` names another run's checkpoint to start from (``warm_start.py``)."""
    rt = rt or Runtime()
    run_dir = str(run_dir)
    strategy = strategy_for(cfg)
    schema, metric = _prepare(cfg, rt, strategy)
    warm = resolve(warm_start) if warm_start else None
    if warm is not None:  # every rank refuses alike, before anything is built or written
        check_compatible(warm, cfg, schema)
    # From here a stop signal asks for a checkpoint at the next agreed step (preemption.py); the
    # CLI entered rank_life before Horovod started, an in-process caller gets one here.
    with rank_life(cfg, run_dir, rt.log, rt.rank) as watch:
        marks = {"rank_started": process_start_unix(), "rank_joined": time.time()}  # a restart's timeline
        built = build_tables_once(cfg, schema, rt, run_dir)
        built.ckpt.log = rt.log
        start = _restore(cfg, rt, run_dir, schema, built.ckpt, resume, warm, strategy)
        tracker, stopped = _start_tracker(cfg, rt, built.ckpt, metric, start, strategy)
        strategy.share_start_state(rt, built)  # every replica starts from rank 0's weights and hot rows
        watch.status.update(phase=Phase.TRAINING, start_step=start, step=start, checkpoint=start or None)
        marks["rank_restored"] = time.time()
        run = _loop(cfg, rt, run_dir, schema, built, tracker, start, stopped, on_validation, watch, marks, strategy)
        return write_summary(cfg, rt, run_dir, built.model, tracker, run)


def _prepare(cfg: Config, rt: Runtime, strategy: Optional[Strategy] = None) -> tuple[dict, str]:
    """The prepared data's schema and the metric validation reports (checked before anything is
    built: a metric validation can't report fails here; nor can an elastic run outside an
    elastic horovodrun)."""
    absolute_data_path(cfg)
    (strategy or strategy_for(cfg)).check_environment()
    tf.random.set_seed(cfg.train.seed + rt.rank)
    schema = load_schema(cfg.data.path)
    return schema, resolve_metric(cfg, schema["label"]["kind"])


def _restore(cfg: Config, rt: Runtime, run_dir: str, schema: dict, ckpt: CheckpointManager,
             resume: bool, warm: Optional[WarmStartSource] = None, strategy: Optional[Strategy] = None) -> int:
    """The step to start after, agreed by every rank. Rank 0 alone restores: with PS tables it
    refills them (every rank shares them). The run's config is written only after a resume was
    accepted: a refused resume must leave it as it was. A run with checkpoints of its own resumes
    from them, warm start or not; a warm start writes ``warm_start.json`` (kept across resumes),
    and a run that starts from scratch removes one an earlier, checkpoint-less attempt left."""
    start = 0
    if rt.rank == 0:
        storage.makedirs(run_dir)
        if resume:
            start = ckpt.restore()
            if start:
                check_data(ckpt.restored_meta, schema, cfg.data.path, ckpt.restored, "resume")
                check_steps(start, cfg.train.steps, ckpt.restored)
                rt.log(f"resumed from {ckpt.restored} at step {start}")
        if not start and warm is not None:
            ckpt.restore(warm.checkpoint)  # weights, optimizer state, rows and slots; the step stays 0
            storage.write_text(storage.join(run_dir, WARM_START_FILE), json.dumps(record(warm), indent=1))
            rt.log(f"warm start from {warm.checkpoint} (step {warm.step} of {warm.given})")
        elif start and warm is not None:
            rt.log(f"--warm-start {warm.given} ignored: this run resumes from its own checkpoint")
        elif not start and storage.exists(storage.join(run_dir, WARM_START_FILE)):
            # A warm start cut off before its first checkpoint, re-run without one: this run
            # trains from scratch, and the run directory must not name a source it never used.
            storage.rmtree(storage.join(run_dir, WARM_START_FILE))
            rt.log(f"removed {WARM_START_FILE}: it named the source of an earlier attempt that left no "
                   f"checkpoint; this run starts from scratch")
        dump_config(cfg, storage.join(run_dir, CONFIG_FILE))
    return (strategy or strategy_for(cfg)).agree(rt, start)  # elastic: DenseCommit.sync hands it out


def _start_tracker(cfg: Config, rt: Runtime, ckpt: CheckpointManager, metric: str,
                   start: int, strategy: Optional[Strategy] = None) -> tuple[BestTracker, bool]:
    """The validation tracker as the restored checkpoint left it, and whether that run already
    stopped early (then there is nothing more to train)."""
    tracker = BestTracker.from_state((ckpt.restored_meta or {}).get("validation") if start else None,
                                     metric, cfg.train.early_stop_patience)
    stopped = int(cfg.train.eval_every > 0 and tracker.should_stop)
    # elastic: rank 0's end (its start when stopped) rides in DenseCommit.sync
    stopped = (strategy or strategy_for(cfg)).agree(rt, stopped)
    if stopped and rt.rank == 0:
        rt.log(f"this run stopped early at step {start} (best {tracker.metric} {tracker.best_value:.4f} "
               f"at step {tracker.best_step}); nothing more to train")
    return tracker, bool(stopped)


def _loop(cfg: Config, rt: Runtime, run_dir: str, schema: dict, built: Built, tracker: BestTracker,
          start: int, stopped: bool, on_validation: Optional[OnValidation],
          watch: Optional[PreemptionWatch] = None, marks: Optional[Dict[str, float]] = None,
          strategy: Optional[Strategy] = None) -> RunResult:
    """Train steps ``start+1 .. train.steps`` (none when already stopped), logging every
    ``log_every``, validating every ``eval_every`` and checkpointing as configured, in calls of
    up to ``train.steps_per_call`` steps that end at each of those steps (``step_calls.py``). The
    last step of a call after which any rank asked to stop (``watch``) is checkpointed, then
    ``Preempted`` is raised on every rank. With ``cluster.elastic`` the steps run under Horovod
    Elastic (``loop_strategy.py``): a lost worker rolls the others back to the last commit and they go on."""
    watch = watch or PreemptionWatch(cfg.train.preemption_grace_s, rt.log, rt.rank)  # not installed: never asks
    ctx = RunContext(cfg, rt, run_dir, schema, built, tracker, watch)
    return StepLoop.for_run(ctx, start, stopped, on_validation, marks, strategy or strategy_for(cfg)).run()
