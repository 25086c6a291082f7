"""Vectorized meta step against the per-task loop, same model, same batch, both compiled.

The per-task loop (``meta.task_loop``) is the same MAML objective written as a Python loop over
the T tasks inside one ``tf.function`` — what a straightforward port of single-task MAML code
looks like. Both run the full step: one lookup per table, inner loop, second-order outer
gradient, dense + TFRA optimizer updates. Measured alternately in one process so machine noise
hits both; the first call of each (tracing) is excluded.
"""
from __future__ import annotations

import time
from typing import Dict

import gmeta_tf  # noqa: F401
from gmeta_tf.config.schema import Config
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.meta.task_loop import maml_loss_task_loop
from gmeta_tf.metaio.reader import load_schema, make_dataset
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync


class TaskLoopStep(TrainStep):
    """``TrainStep`` whose loss is the per-task loop instead of the vectorized inner loop."""

    def __init__(self, model, meta, dense_opt, emb_opt, sync, num_tasks: int):
        super().__init__(model, meta, dense_opt, emb_opt, sync)
        self._loss = lambda batch: maml_loss_task_loop(model, meta, batch, num_tasks)


def _rate(step, batches, seconds: float, T: int) -> float:
    step.step(batches[0])  # trace + compile
    n, t0 = 0, time.perf_counter()
    while True:
        step.step(batches[n % len(batches)])
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds and n >= 3:
            return n * T / elapsed


def measure(cfg: Config, seconds: float = 8.0) -> Dict[str, float]:
    schema = load_schema(cfg.data.path)
    T = cfg.data.tasks_per_batch
    batches = list(make_dataset(cfg.data.path, "train", cfg.data, training=True).take(8))
    samples = float(sum(b["support"]["mask"].numpy().sum() + b["query"]["mask"].numpy().sum()
                        for b in batches)) / len(batches) / T
    rates = {}
    for name in ("vectorized", "task_loop"):
        model = DLRM(cfg.model, schema)
        d, e = make_optimizers(cfg.train)
        step = (TrainStep(model, cfg.meta, d, e, LocalSync()) if name == "vectorized"
                else TaskLoopStep(model, cfg.meta, d, e, LocalSync(), T))
        rates[name] = _rate(step, batches, seconds, T)
    return {
        "tasks_per_s_vectorized": rates["vectorized"],
        "tasks_per_s_task_loop": rates["task_loop"],
        "samples_per_s_vectorized": rates["vectorized"] * samples,
        "samples_per_s_task_loop": rates["task_loop"] * samples,
        "speedup_vs_task_loop": rates["vectorized"] / rates["task_loop"],
        "tasks_per_batch": T,
        "algo": cfg.meta.algo,
        "adapt": cfg.meta.adapt,
        "inner_steps": cfg.meta.inner_steps,
    }
