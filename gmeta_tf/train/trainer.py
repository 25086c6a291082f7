"""The training loop shared by the embedded default and the distributed worker.

``train`` takes a ``Runtime`` describing where it runs (rank / size / dense-gradient sync / PS
tasks); nothing else differs between one process and N Horovod workers with M PS: the same
model, the same compiled step, the same checkpoint format. Rank 0 alone writes checkpoints,
summaries and the run's files.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import tensorflow as tf

import gmeta_tf  # noqa: F401
from gmeta_tf.config.loader import dump_config
from gmeta_tf.config.schema import Config
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.metaio.reader import load_schema, make_dataset
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.checkpoint import CheckpointManager
from gmeta_tf.train.dense_sync import LocalSync

CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "train_summary.json"


@dataclass
class Runtime:
    """Where this process trains. The default is the embedded single process."""

    sync: object = field(default_factory=LocalSync)
    ps_tasks: int = 0
    namespace: Optional[str] = None  # TFRA table namespace; shared by all workers of one job
    placement: Optional[Dict[str, List[int]]] = None
    bp_v2: bool = False
    log: Callable[[str], None] = print

    @property
    def rank(self) -> int:
        return self.sync.rank

    @property
    def size(self) -> int:
        return self.sync.size


def build_model(cfg: Config, schema: dict, rt: Runtime) -> DLRM:
    return DLRM(cfg.model, schema, namespace=rt.namespace, ps_tasks=rt.ps_tasks,
                placement=rt.placement, bp_v2=rt.bp_v2)


def train(cfg: Config, run_dir: str | Path, rt: Optional[Runtime] = None, resume: bool = True) -> dict:
    rt = rt or Runtime()
    run_dir = Path(run_dir)
    tf.random.set_seed(cfg.train.seed + rt.rank)
    schema = load_schema(cfg.data.path)
    model = build_model(cfg, schema, rt)
    dense_opt, emb_opt = make_optimizers(cfg.train, rt.size)
    step_fn = TrainStep(model, cfg.meta, dense_opt, emb_opt, rt.sync)
    ckpt = CheckpointManager(run_dir / "checkpoints", model, dense_opt, emb_opt,
                             keep=cfg.train.keep_checkpoints)
    start = 0
    if rt.rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, run_dir / CONFIG_FILE)
    if resume and (rt.rank == 0 or rt.ps_tasks == 0):
        start = ckpt.restore()
        if start:
            rt.log(f"resumed from {ckpt.latest()} at step {start}")
    rt.sync.barrier()  # tables restored on the PS before any rank trains
    start = int(round(rt.sync.allreduce_scalar(float(start)) / rt.size))
    rt.sync.broadcast_variables(list(model.dense_variables.values()) + list(dense_opt.variables))

    history = [h for h in _previous_history(run_dir) if h["step"] <= start] if start else []
    writer = tf.summary.create_file_writer(str(run_dir / "tb")) if rt.rank == 0 else None
    ds = make_dataset(cfg.data.path, "train", cfg.data, rank=rt.rank, size=rt.size, training=True)
    it = iter(ds)
    T = cfg.data.tasks_per_batch
    window_t0, window_steps = None, 0
    loss_sum, loss_n = 0.0, 0
    tasks_per_s = float("nan")
    total_time, total_steps = 0.0, 0
    for step in range(start + 1, cfg.train.steps + 1):
        batch = next(it)
        out = step_fn.step(batch)
        loss = float(out["loss"])
        if not math.isfinite(loss):
            raise FloatingPointError(f"rank {rt.rank}: loss is {loss} at step {step}; lower the learning rates")
        loss_sum, loss_n = loss_sum + loss, loss_n + 1
        if window_t0 is None:  # the first step traces and compiles: keep it out of throughput
            window_t0, window_steps = time.perf_counter(), 0
            loss_sum, loss_n = loss, 1
        else:
            window_steps += 1
        last = step == cfg.train.steps
        if step % cfg.train.log_every == 0 or last:
            elapsed = time.perf_counter() - window_t0
            if window_steps:
                tasks_per_s = window_steps * T / elapsed
                total_time, total_steps = total_time + elapsed, total_steps + window_steps
            mean_loss = loss_sum / max(loss_n, 1)
            history.append({"step": step, "loss": mean_loss, "tasks_per_s": tasks_per_s})
            line = (f"step {step}/{cfg.train.steps} loss {mean_loss:.4f} "
                    f"tasks/s {tasks_per_s:,.0f} (rank {rt.rank})")
            if rt.size > 1:
                agg = rt.sync.allreduce_scalar(tasks_per_s if math.isfinite(tasks_per_s) else 0.0)
                line += f" aggregate tasks/s {agg:,.0f}"
            rt.log(line)
            if writer is not None:
                with writer.as_default():
                    tf.summary.scalar("loss", mean_loss, step=step)
                    tf.summary.scalar("tasks_per_s", tasks_per_s, step=step)
            window_t0, window_steps, loss_sum, loss_n = time.perf_counter(), 0, 0.0, 0
        if step % cfg.train.checkpoint_every == 0 or last:
            rt.sync.barrier()
            if rt.rank == 0:
                ckpt.save(step, {"algo": cfg.meta.algo})
    summary = {
        "algo": cfg.meta.algo, "steps": cfg.train.steps, "start_step": start,
        "tasks_per_s": (total_steps * T / total_time) if total_time else float("nan"),
        "ranks": rt.size, "history": history,
    }
    if rt.rank == 0:
        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
        if writer is not None:
            writer.flush()
    return summary


def load_trained(run_dir: str | Path, overrides=()) -> tuple[Config, DLRM, CheckpointManager]:
    """Rebuild a run's model with local tables from its config and latest checkpoint."""
    from gmeta_tf.config.loader import load_config
    from gmeta_tf.errors import CheckpointError

    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise CheckpointError(f"{run_dir}: not a run directory (no {CONFIG_FILE}); run 'gmeta train --out {run_dir}' first")
    cfg = load_config(run_dir / CONFIG_FILE, overrides)
    model = build_model(cfg, load_schema(cfg.data.path), Runtime())
    dense_opt, emb_opt = make_optimizers(cfg.train)
    ckpt = CheckpointManager(run_dir / "checkpoints", model, dense_opt, emb_opt)
    if ckpt.latest() is None:
        raise CheckpointError(f"{run_dir}: no complete checkpoint in {run_dir / 'checkpoints'}")
    ckpt.restore()
    return cfg, model, ckpt


def _previous_history(run_dir: Path) -> list:
    f = run_dir / SUMMARY_FILE
    if f.is_file():
        try:
            return json.loads(f.read_text()).get("history", [])
        except ValueError:
            return []
    return []
