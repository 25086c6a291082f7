"""Outer-loop optimizers: a Keras optimizer for dense weights, TFRA-wrapped ones for tables.

Embeddings get their own optimizers because they must be wrapped by
``de.DynamicEmbeddingOptimizer`` (their slots become TFRA tables that live next to their rows
on the PS) and usually want a larger learning rate than the tower.

There is one wrapped optimizer *per table*, not one for all: TFRA's wrapper, when it applies a
gradient to one table, re-reads and re-writes the slot buffers of *every* table the optimizer
has seen (``_distributed_apply_gradients_fn``), so one shared optimizer costs O(tables²) slot
lookups and upserts per step and lets one table's apply touch another's slot buffers. One
optimizer per table keeps that O(tables) and each apply to its own table.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

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


class TableOptimizers:
    """One ``DynamicEmbeddingOptimizer`` per TFRA shadow variable, created by ``build``."""

    def __init__(self, kind: str, lr: float):
        self.kind = kind
        self.lr = lr
        self.by_shadow: Dict[str, object] = {}
        self.by_table: Dict[str, object] = {}

    def build(self, shadows_by_table: Dict[str, tf.Variable]) -> None:
        """``{table name: shadow}``; the table name keys the checkpointed step counters."""
        for table, shadow in shadows_by_table.items():
            if shadow.name not in self.by_shadow:
                opt = tfra.dynamic_embedding.DynamicEmbeddingOptimizer(_keras_optimizer(self.kind, self.lr))
                opt.build([shadow])
                self.by_shadow[shadow.name] = opt
                self.by_table[table] = opt

    def for_shadow(self, shadow):
        return self.by_shadow[shadow.name]

    def apply_gradients(self, grads_and_vars: Iterable[Tuple[tf.Tensor, tf.Variable]]) -> None:
        for grad, shadow in grads_and_vars:
            self.by_shadow[shadow.name].apply_gradients([(grad, shadow)])

    def iterations(self) -> Dict[str, tf.Variable]:
        """Step counters by table (Adam's bias correction needs them after a restore)."""
        return {table: opt.iterations for table, opt in self.by_table.items()}

    @property
    def variables(self) -> List[tf.Variable]:
        return [v for opt in self.by_shadow.values() for v in opt.variables if isinstance(v, tf.Variable)]


def make_optimizers(cfg: TrainConfig, world_size: int = 1):
    scale = world_size if cfg.scale_lr else 1
    dense = _keras_optimizer(cfg.optimizer, cfg.learning_rate * scale)
    return dense, TableOptimizers(cfg.embedding_optimizer, cfg.embedding_learning_rate * scale)
