"""Outer-loop optimizers: a Keras optimizer for the dense weights, per-table ones for embeddings.

The embedding side (TFRA-wrapped, one per table) is ``embedding/optimizers.py``; this picks the
learning rates from the train config for both.
"""
from __future__ import annotations

from gmeta_tf.config.schema import TrainConfig
from gmeta_tf.embedding.optimizers import TableOptimizers, keras_optimizer


def make_optimizers(cfg: TrainConfig, world_size: int = 1):
    scale = world_size if cfg.scale_lr else 1
    dense = keras_optimizer(cfg.optimizer, cfg.learning_rate * scale)
    return dense, TableOptimizers(cfg.embedding_optimizer, cfg.embedding_learning_rate * scale)
