"""Outer-loop optimizers: a Keras optimizer for dense weights, a TFRA-wrapped one for tables.

They are separate objects because the embedding optimizer must be wrapped by
``de.DynamicEmbeddingOptimizer`` (its slots become TFRA tables that live next to their rows on
the PS), and because embeddings usually want a larger learning rate than the tower.
"""
from __future__ import annotations

import tensorflow as tf
import tensorflow_recommenders_addons as tfra

import gmeta_tf  # noqa: F401
from gmeta_tf.config.schema import TrainConfig


def _keras_optimizer(kind: str, lr: float):
    if kind == "adam":
        return tf.keras.optimizers.Adam(learning_rate=lr)
    if kind == "adagrad":
        return tf.keras.optimizers.Adagrad(learning_rate=lr)
    raise ValueError(f"unknown optimizer {kind!r}")


def make_optimizers(cfg: TrainConfig, world_size: int = 1):
    scale = world_size if cfg.scale_lr else 1
    dense = _keras_optimizer(cfg.optimizer, cfg.learning_rate * scale)
    emb = tfra.dynamic_embedding.DynamicEmbeddingOptimizer(
        _keras_optimizer(cfg.embedding_optimizer, cfg.embedding_learning_rate * scale))
    return dense, emb
