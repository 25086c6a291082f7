"""Vectorized meta step against per-task loops, same model, same batches, all compiled.

The per-task loops (``meta.task_loop``) are the same MAML objective with tasks handled one at
a time inside one ``tf.function``; every variant runs the full step (one lookup per table,
inner loop, second-order outer gradient, dense + TFRA optimizer updates):

* ``task_loop`` (the headline): a run-time ``tf.while_loop`` over tasks — what
  ``for t in tf.range(T)`` compiles to, i.e. a port of single-task MAML code;
* ``unrolled_loop``: a Python ``for`` over tasks, unrolled into the graph. The runtime can then
  execute several tasks' ops side by side (inter-op parallelism), which is a partial
  vectorization done by TensorFlow, at the price of a graph that grows with T.

Measured one after another in one process; the first call of each (tracing) is excluded.
"""
from __future__ import annotations

import time
from typing import Dict

import gmeta_tf  # noqa: F401
from gmeta_tf.config.schema import Config
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.meta.task_loop import maml_loss_task_loop, maml_loss_task_while_loop
from gmeta_tf.metaio.reader import load_schema, make_dataset
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync


class TaskLoopStep(TrainStep):
    """``TrainStep`` whose loss is a per-task loop instead of the vectorized inner loop."""

    def __init__(self, model, meta, dense_opt, emb_opt, sync, num_tasks: int, unrolled: bool):
        super().__init__(model, meta, dense_opt, emb_opt, sync)
        if unrolled:
            self._loss = lambda batch: maml_loss_task_loop(model, meta, batch, num_tasks)
        else:
            self._loss = lambda batch: maml_loss_task_while_loop(model, meta, batch)


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
    for name in ("vectorized", "task_loop", "unrolled_loop"):
        model = DLRM(cfg.model, schema)
        d, e = make_optimizers(cfg.train)
        step = (TrainStep(model, cfg.meta, d, e, LocalSync()) if name == "vectorized"
                else TaskLoopStep(model, cfg.meta, d, e, LocalSync(), T, unrolled=name == "unrolled_loop"))
        rates[name] = _rate(step, batches, seconds, T)
    return {
        "tasks_per_s_vectorized": rates["vectorized"],
        "tasks_per_s_task_loop": rates["task_loop"],
        "samples_per_s_vectorized": rates["vectorized"] * samples,
        "samples_per_s_task_loop": rates["task_loop"] * samples,
        "tasks_per_s_unrolled_loop": rates["unrolled_loop"],
        "speedup_vs_task_loop": rates["vectorized"] / rates["task_loop"],
        "speedup_vs_unrolled_loop": rates["vectorized"] / rates["unrolled_loop"],
        "tasks_per_batch": T,
        "algo": cfg.meta.algo,
        "adapt": cfg.meta.adapt,
        "inner_steps": cfg.meta.inner_steps,
    }
