"""How fast Meta-IO can feed the trainer, measured without a model in the way.

The reader has to stay well ahead of the meta step (target: >= 3x what a step consumes), so
this iterates the training pipeline as fast as possible and reports tasks and real (unpadded)
samples per second. The first batch is excluded: it pays for file opening, pipeline start-up
and filling the shuffle buffer, which a long training run pays once.
"""
from __future__ import annotations

import time

import gmeta_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from gmeta_tf.config.schema import DataConfig
from gmeta_tf.metaio.reader import make_dataset


def measure_read_rate(path: str, cfg: DataConfig, split: str = "train", seconds: float = 5.0) -> dict:
    ds = make_dataset(path, split, cfg, training=True)
    it = iter(ds)
    next(it)  # warm-up
    batches = 0
    samples = 0.0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        b = next(it)
        batches += 1
        # masks are tiny; summing them costs far less than producing the batch
        samples += float(b["support"]["mask"].numpy().sum() + b["query"]["mask"].numpy().sum())
        now = time.perf_counter()
        if now >= deadline:
            break
    elapsed = now - start
    return {
        "tasks_per_s": batches * cfg.tasks_per_batch / elapsed,
        "samples_per_s": samples / elapsed,
        "batches": batches,
    }
