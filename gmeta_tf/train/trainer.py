"""The training loop shared by the embedded default and the distributed worker.

``train`` takes a ``Runtime`` describing where it runs (rank / size / dense-gradient sync / PS
tasks); nothing else differs between one process and N Horovod workers with M PS: the same
model, the same compiled step, the same checkpoint format. Rank 0 alone writes checkpoints,
summaries and the run's files.

``train`` is its phases, in order: ``_prepare`` (config, schema, metric), ``build_tables_once``
(model, optimizers, embedding tables and slots, compiled step, checkpoint manager),
``_restore`` (rank 0 reads the newest checkpoint, every rank learns its step),
``_start_tracker`` (validation state and an early stop already reached), ``_share_start_state``
(every replica starts from rank 0's weights and hot rows), ``_loop`` (steps, logging,
validation, checkpoints) and ``_finish`` (summary and per-rank files).
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from gmeta_tf import storage
from gmeta_tf.config.loader import dump_config
from gmeta_tf.config.schema import Config
from gmeta_tf.errors import Preempted
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.metaio.reader import load_schema, make_dataset
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.process import process_start_unix
from gmeta_tf.train.checkpoint import CheckpointManager
from gmeta_tf.train.failures import injected_failure, raise_injected, step_failure
from gmeta_tf.train.fault_pause import freeze, pause_point
from gmeta_tf.train.model_build import CONFIG_FILE, build_model
from gmeta_tf.train.preemption import PreemptionWatch, stopping
from gmeta_tf.train.progress import Window, log_window, previous_history
from gmeta_tf.train.rank_life import rank_life
from gmeta_tf.train.rank_status import Phase
from gmeta_tf.train.restarts import complete, describe, from_env
from gmeta_tf.train.run_files import absolute_data_path, check_data, check_steps, checkpoint_files, data_record
from gmeta_tf.train.run_summary import RunResult, write_summary
from gmeta_tf.train.runtime import Runtime
from gmeta_tf.train.step_calls import call_plan
from gmeta_tf.train.validation import BestTracker, OnValidation, resolve_metric, validation_point
from gmeta_tf.train.warm_start import WARM_START_FILE, WarmStartSource, check_compatible, record, resolve


@dataclass
class Built:
    """What ``build_tables_once`` builds: everything a run trains, restores and saves."""

    model: DLRM
    dense_opt: object
    emb_opt: object
    step_fn: TrainStep
    ckpt: CheckpointManager

    def __iter__(self):  # model, dense_opt, emb_opt, step_fn, ckpt = build_tables_once(...)
        return iter((self.model, self.dense_opt, self.emb_opt, self.step_fn, self.ckpt))


def _build(cfg: Config, schema: dict, rt: Runtime, run_dir: str) -> Built:
    model = build_model(cfg, schema, rt)  # creates the embedding tables
    dense_opt, emb_opt = make_optimizers(cfg.train, rt.size)
    # The hot tier (hot.budget > 0), then every table's optimizer and slot tables, then the
    # prefetch that reads them: the order is Embeddings.assemble's.
    model.embeddings.assemble(cfg, emb_opt, rt.sync, log=rt.log)
    step_fn = TrainStep(model, cfg.meta, dense_opt, emb_opt, rt.sync)
    ckpt = CheckpointManager(storage.join(run_dir, "checkpoints"), model, dense_opt, emb_opt,
                             keep=cfg.train.keep_checkpoints)
    return Built(model, dense_opt, emb_opt, step_fn, ckpt)


def build_tables_once(cfg: Config, schema: dict, rt: Runtime, run_dir: str) -> Built:
    """Rank 0 creates the PS tables and their optimizer slot tables; the others then bind to them.

    Every table has a deterministic shared name (``embedding/naming.py``), so a rank that builds
    the model after rank 0 finds each resource on the PS and binds to it instead of creating it:
    the tables exist once, whatever the number of workers, and start-up costs two builds' time,
    not one per rank. The other ranks build at the same time; that is safe because the PS crash
    once blamed on concurrent creation was the eager-context race that
    ``worker.connect_rank0_first`` avoids (docs/startup.md). With local tables (no PS) there is
    nothing to share. In an elastic ring (``rt.start_gate``) rank 0 goes first through a gate file,
    not a barrier: a worker joining a running ring must do no collective before ``run_fn``
    (``elastic.py``), and it finds the tables there.
    """
    if rt.ps_tasks == 0:
        return _build(cfg, schema, rt, run_dir)
    if rt.start_gate is not None:
        def build() -> Built:
            out = _build(cfg, schema, rt, run_dir)
            if rt.rank == 0:
                out.model.embeddings.wait_until_created()
            return out
        return rt.start_gate.rank0_first(rt.rank, "tables-created", build)
    built = None
    if rt.rank == 0:
        built = _build(cfg, schema, rt, run_dir)
        built.model.embeddings.wait_until_created()
    rt.sync.barrier()
    if rt.rank != 0:
        built = _build(cfg, schema, rt, run_dir)
    return built


def train(cfg: Config, run_dir: str | Path, rt: Optional[Runtime] = None, resume: bool = True,
          on_validation: Optional[OnValidation] = None, warm_start: Optional[str] = None) -> dict:
    """Train to ``train.steps`` (or an early stop). ``on_validation(step, metrics)`` is called
    on rank 0 after each validation (``gmeta tune`` reports to Optuna there); what it raises
    propagates. ``warm_start`` names another run's checkpoint to start from (``warm_start.py``)."""
    rt = rt or Runtime()
    run_dir = str(run_dir)
    schema, metric = _prepare(cfg, rt)
    warm = resolve(warm_start) if warm_start else None
    if warm is not None:  # every rank refuses alike, before anything is built or written
        check_compatible(warm, cfg, schema)
    # From here a stop signal asks for a checkpoint at the next agreed step (preemption.py); the
    # CLI entered rank_life before Horovod started, an in-process caller gets one here.
    with rank_life(cfg, run_dir, rt.log, rt.rank) as watch:
        marks = {"rank_started": process_start_unix(), "rank_joined": time.time()}  # a restart's timeline
        built = build_tables_once(cfg, schema, rt, run_dir)
        built.ckpt.log = rt.log
        start = _restore(cfg, rt, run_dir, schema, built.ckpt, resume, warm)
        tracker, stopped = _start_tracker(cfg, rt, built.ckpt, metric, start)
        _share_start_state(rt, built, cfg.cluster.elastic)
        watch.status.update(phase=Phase.TRAINING, start_step=start, step=start, checkpoint=start or None)
        marks["rank_restored"] = time.time()
        run = _loop(cfg, rt, run_dir, schema, built, tracker, start, stopped, on_validation, watch, marks)
        return write_summary(cfg, rt, run_dir, built.model, tracker, run)


def _prepare(cfg: Config, rt: Runtime) -> tuple[dict, str]:
    """The prepared data's schema and the metric validation reports (checked before anything is
    built: a metric validation can't report fails here)."""
    absolute_data_path(cfg)
    if cfg.cluster.elastic:
        from gmeta_tf.train.elastic import require_elastic_ring

        require_elastic_ring(os.environ)
    tf.random.set_seed(cfg.train.seed + rt.rank)
    schema = load_schema(cfg.data.path)
    return schema, resolve_metric(cfg, schema["label"]["kind"])


def _restore(cfg: Config, rt: Runtime, run_dir: str, schema: dict, ckpt: CheckpointManager,
             resume: bool, warm: Optional[WarmStartSource] = None) -> int:
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
    if cfg.cluster.elastic:  # no collective before run_fn: DenseCommit.sync hands out rank 0's step
        return start
    return rt.sync.broadcast_int(start)


def _start_tracker(cfg: Config, rt: Runtime, ckpt: CheckpointManager, metric: str,
                   start: int) -> tuple[BestTracker, bool]:
    """The validation tracker as the restored checkpoint left it, and whether that run already
    stopped early (then there is nothing more to train)."""
    tracker = BestTracker.from_state((ckpt.restored_meta or {}).get("validation") if start else None,
                                     metric, cfg.train.early_stop_patience)
    stopped = int(cfg.train.eval_every > 0 and tracker.should_stop)
    if not cfg.cluster.elastic:  # elastic: rank 0's end (its start when stopped) rides in DenseCommit.sync
        stopped = rt.sync.broadcast_int(stopped)
    if stopped and rt.rank == 0:
        rt.log(f"this run stopped early at step {start} (best {tracker.metric} {tracker.best_value:.4f} "
               f"at step {tracker.best_step}); nothing more to train")
    return tracker, bool(stopped)


def _share_start_state(rt: Runtime, built: Built, elastic: bool = False) -> None:
    """Every replica starts from rank 0's dense weights, optimizer state and hot rows. ``elastic``:
    ``DenseCommit.sync`` does it, inside ``run_fn`` (no hot tier there: ``Config._check_elastic``)."""
    embeddings = built.model.embeddings
    if elastic:
        embeddings.start_hot_window()
        return
    if embeddings.hot is not None:
        embeddings.hot.check_same_everywhere(rt.sync)
    if rt.rank == 0:  # from the (restored) PS tables; the broadcast below hands them out
        embeddings.load_hot()
    rt.sync.broadcast_variables(list(built.model.dense_variables.values()) + list(built.dense_opt.variables)
                                + embeddings.replicated_state())
    embeddings.start_hot_window()


def _loop(cfg: Config, rt: Runtime, run_dir: str, schema: dict, built: Built, tracker: BestTracker,
          start: int, stopped: bool, on_validation: Optional[OnValidation],
          watch: Optional[PreemptionWatch] = None, marks: Optional[Dict[str, float]] = None) -> RunResult:
    """Train steps ``start+1 .. train.steps`` (none when already stopped), logging every
    ``log_every``, validating every ``eval_every`` and checkpointing as configured, in calls of
    up to ``train.steps_per_call`` steps that end at each of those steps (``step_calls.py``). The
    last step of a call after which any rank asked to stop (``watch``) is checkpointed, then
    ``Preempted`` is raised on every rank. With ``cluster.elastic`` the steps run under Horovod
    Elastic (``elastic.py``): a lost worker rolls the others back to the last commit and they go on."""
    watch = watch or PreemptionWatch(cfg.train.preemption_grace_s, rt.log, rt.rank)  # not installed: never asks
    at = _Loop(history=[h for h in previous_history(run_dir) if h["step"] <= start] if start else [],
               window=Window(cfg.data.tasks_per_batch), step=start, stopped=stopped,
               end=start if stopped else cfg.train.steps, start=start)
    restarts = from_env() if rt.rank == 0 else []  # gmeta launch local --max-restarts
    pause = pause_point()  # a fault test's trigger (GMETA_PAUSE_AT_STEP); None in a real job
    fail = injected_failure()  # another (GMETA_FAIL_FROM_STEP)
    validating = cfg.train.eval_every > 0

    def train_from(begin: int, commit: Optional[Callable[[int], None]] = None) -> None:
        """Steps ``begin+1 .. end``; ``commit(step)`` after each call (elastic commits)."""
        if rt.rank == 0 and at.writer is None:
            at.writer = tf.summary.create_file_writer(storage.join(run_dir, "tb"))
        # train.steps_per_call: each call ends where the loop below has work (step_calls.py); the
        # end is read here, as an elastic ring's rank 0 said it (DenseCommit.sync).
        plan = call_plan(cfg, at.end, pause)
        # The pipeline is deterministic (seeded shuffles, ordered interleave), so skipping the
        # batches already trained on makes a resumed run see exactly the data it would have seen.
        # Rank and size are read here: an elastic ring re-forms smaller and re-shards the files.
        it = iter(make_dataset(cfg.data.path, "train", cfg.data, rank=rt.rank, size=rt.size,
                               training=True).skip(begin))
        upcoming = next(it) if begin < at.end else None
        step = at.step = begin
        while step < at.end:
            first = step + 1
            last_of_call = first + plan.length(first) - 1
            # One batch ahead: a call reads the next call's first batch's cold rows (hot.prefetch).
            batches = [upcoming] + [next(it) for _ in range(last_of_call - first)]
            upcoming = next(it) if last_of_call < at.end else None
            built.step_fn.vote_stop(watch.poll())
            step = at.step = first  # a failed call is reported at its first step
            losses, preempted = _train_call(rt, built, first, batches, upcoming)
            step = at.step = last_of_call
            last = step == cfg.train.steps
            watch.status.update(step=step, write_now=step % cfg.train.log_every == 0 or last)
            if cfg.model.max_rows:
                _evict(built, rt, cfg.model.max_rows)
            at.window.add_call(losses)
            if first == at.start + 1 and restarts:
                rt.log(describe(complete(restarts, start, marks=marks)))
            if step % cfg.train.log_every == 0 or last:
                log_window(cfg, rt, at.window, step, at.history, at.writer)
            improved = False
            if validating and (step % cfg.train.eval_every == 0 or last):
                improved = validation_point(cfg, built.model, rt, tracker, step, at.writer, on_validation)
                at.stopped = bool(rt.sync.broadcast_int(int(tracker.should_stop) if rt.rank == 0 else 0))
            if improved or at.stopped or preempted or step % cfg.train.checkpoint_every == 0 or last:
                meta = {"algo": cfg.meta.algo, "ranks": rt.size, "ps": rt.ps_tasks,
                        "data": data_record(cfg.data.path, schema), "validation": tracker.state()}
                if preempted:
                    stopping(watch)
                t0 = time.perf_counter()
                path = _save_checkpoint(built, rt, step, meta, checkpoint_files(cfg))
                watch.status.update(checkpoint=step)
                if improved and rt.rank == 0:
                    built.ckpt.mark_best(path, tracker.summary())
                if preempted and not last:
                    raise _preempted(rt, watch, step, path, time.perf_counter() - t0)
            if commit is not None:
                commit(step)
            raise_injected(fail, step, rt.rank)
            if pause is not None and pause.due(step, rt.rank):
                freeze()
            if at.stopped:
                if rt.rank == 0:
                    rt.log(f"early stop at step {step}: {tracker.metric} did not improve in "
                           f"{tracker.since_best} validations; best {tracker.best_value:.4f} at step {tracker.best_step}")
                break

    try:  # the steps and every collective after them (log, validation, checkpoint)
        if cfg.cluster.elastic:
            _train_elastic(cfg, rt, built, at, train_from, watch)
        else:
            train_from(start)
    except Exception as e:
        failure = step_failure(e, rt, at.step, watch.status.directory, watch.status.status, at.since_unix,
                               at.ring[-1][0] if cfg.cluster.elastic and at.ring else None)
        if failure is None:  # nothing elsewhere is at fault: this rank's own error
            raise
        raise failure from None
    return RunResult(at.start, at.end, at.step if at.start < at.end else at.start, at.stopped, at.window, at.history,
                     at.writer, restarts, ring=at.ring, joined=_joined(watch) if cfg.cluster.elastic and rt.rank == 0 else [])


@dataclass
class _Loop:
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


def _train_elastic(cfg: Config, rt: Runtime, built: Built, at: _Loop, train_from: Callable[..., None],
                   watch: PreemptionWatch) -> None:
    """``train_from`` under Horovod Elastic (``elastic.py``): the dense weights, their optimizer
    state and the step are committed every ``train.elastic_commit_every`` steps (at the first call
    end at or past each multiple); a lost worker rolls the survivors back to the last commit and
    they go on as a smaller ring, reading their new shards of the data from that step on. A worker
    started on a returned host joins at a commit (``HostsUpdatedInterrupt`` on the others): it takes
    rank 0's state, step, start and end from the first sync and reads its shard from that step on.
    Each (re-)entry goes into this rank's status record (``ring``, ``joined_step``)."""
    from gmeta_tf.train.elastic import DenseCommit, run_elastic
    from gmeta_tf.train.failures import lost_peer

    every = cfg.train.elastic_commit_every
    state = DenseCommit(rt.sync, list(built.model.dense_variables.values()) + list(built.dense_opt.variables),
                        at.step, start=at.start, end=at.end)
    entries = []

    def commit(step: int) -> None:
        if step // every > state.step // every:
            state.commit_step(step)

    def attempt(s: DenseCommit) -> None:
        joined = not entries and s.step > s.start  # this process's first ring was already training
        if entries:  # the ring re-formed: rank 0's commit is everyone's now
            at.history[:] = [h for h in at.history if h["step"] <= s.step]
            rt.log(f"elastic: the ring re-formed; {rt.size} worker(s) go on from the commit of step {s.step} "
                   f"(rank {rt.rank} of {rt.size}; global meta-batch {cfg.data.tasks_per_batch * rt.size} tasks); "
                   f"PS rows keep the updates that landed since")
        elif joined:
            rt.log(f"elastic: joined the running ring at the commit of step {s.step} as rank {rt.rank} of {rt.size} "
                   f"(global meta-batch {cfg.data.tasks_per_batch * rt.size} tasks); reading shard {rt.rank} of "
                   f"{rt.size} from there")
        at.start, at.end = s.start, s.end
        at.stopped = at.stopped or s.end < cfg.train.steps  # rank 0 had stopped early before this run
        entries.append(s.step)
        at.since_unix = time.time()
        at.ring.append([s.step, rt.rank, rt.size])
        watch.status.update(phase=Phase.TRAINING, step=s.step, start_step=s.start, ring=[list(r) for r in at.ring],
                            ring_rank=rt.rank,
                            **({"joined_step": s.step} if joined else {}))
        train_from(s.step, commit)

    def reset() -> None:
        rt.sync.reset()
        if rt.start_gate is not None:  # rank 0 of the new ring re-publishes the job's nonce (elastic.JobNonce)
            rt.start_gate.after_reset(rt.rank)

    run_elastic(state, attempt, lambda e: lost_peer(e, rt, at.step, watch.status.directory, watch.status.status,
                                                    at.since_unix, at.ring[-1][0] if at.ring else None),
                reset, cfg.cluster.elastic_reset_limit)


def _joined(watch: PreemptionWatch) -> List[dict]:
    """The workers that joined this elastic ring while it ran, from the ranks' status records (rank
    0's summary says so): each one's pid, the commit it joined at and its first rank and size."""
    from gmeta_tf.train.rank_status import read_processes

    out = []
    for r in read_processes(watch.status.directory):
        if r.joined_step is not None and r.ring:
            out.append({"pid": r.pid, "step": r.joined_step, "rank": r.ring[0][1], "ranks": r.ring[0][2]})
    return sorted(out, key=lambda j: (j["step"], j["rank"]))


def _train_call(rt: Runtime, built: Built, first: int, batches: List[dict],
                upcoming: Optional[dict]) -> tuple[List[float], bool]:
    """One compiled call: steps ``first ..`` on ``batches`` (``train.steps_per_call``; one batch
    is the single step, as without the key). Returns each step's loss and whether every rank
    stops after the call (some rank was asked to: the vote rides in each step's all-reduce). An
    embedding-side failure is typed by ``Embeddings.step_errors``, a non-finite loss is one line
    naming its step; a lost PS or peer worker is translated by ``_loop`` (``failures.py``), which
    also covers the collectives after the call."""
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


def _preempted(rt: Runtime, watch: PreemptionWatch, step: int, path: Optional[str], save_s: float) -> Preempted:
    """Every rank raises this after the agreed step's checkpoint is complete."""
    import signal

    asked = (f"{signal.Signals(watch.signum).name} {watch.elapsed_s:.1f} s ago" if watch.requested
             else "a peer rank was asked to stop")
    where = f" ({path})" if path else ""
    return Preempted(f"rank {rt.rank}: preempted ({asked}): every rank checkpointed step {step}{where} "
                     f"in {save_s:.2f} s; "
                     f"re-run with the same --out to resume there, nothing to redo", step, watch.exit_signal(), save_s)


def _save_checkpoint(built: Built, rt: Runtime, step: int, meta: dict, files: Dict[str, str]) -> Optional[str]:
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


def _evict(built: Built, rt: Runtime, max_rows: Dict[str, int]) -> None:
    """Bound the tables of ``model.max_rows`` between steps: every rank's updates are on the PS
    (an open hot window closed, quiesce, barrier) before rank 0 removes rows, and nobody steps
    until it is done."""
    built.model.embeddings.sync_hot()
    built.model.embeddings.quiesce()
    rt.sync.barrier()
    if rt.rank == 0:
        built.model.embeddings.evict(max_rows)
    rt.sync.barrier()


