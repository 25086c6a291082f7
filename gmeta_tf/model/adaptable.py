"""What adaptation and scoring need of a model, as types: the seam between the trainer's DLRM
(TFRA tables) and the export's frozen model (stock ``StaticHashTable`` s).

The inner loop, ``sparse_features.lookup_batch`` and evaluation's ``query_predictions`` only read
a model's tower, label kind and scaling, feature names and table lookups. Naming that here lets
``gmeta export`` run *the same functions* inside a SavedModel signature, so a served score
cannot drift from ``gmeta eval``'s, without building a table that needs TFRA.
"""
from __future__ import annotations

from typing import Dict, List, Protocol, Sequence, Tuple

import tensorflow as tf

from gmeta_tf.model.dense_tower import DenseTower


class LookupTable(Protocol):
    """One feature's rows: ``lookup_unique`` as ``embedding.table.Table`` defines it (the narrower part scoring reads) (pad ids
    < 0 give a zero row; non-trainable lookups give zeros for ids the table does not hold)."""

    name: str
    dim: int

    def lookup_unique(self, ids: Sequence[tf.Tensor], trainable: bool = True): ...


class AdaptableModel(Protocol):
    kind: str  # "click" | "rating"
    tower: DenseTower
    tables: Sequence[LookupTable]  # in table order: categorical, then multi-hot
    cat_names: Sequence[str]
    multi_names: Sequence[str]

    @property
    def dense_variables(self) -> Dict[str, tf.Variable]: ...

    def scale_labels(self, labels: tf.Tensor) -> tf.Tensor: ...

    def unscale(self, scores: tf.Tensor) -> tf.Tensor: ...

    def adapted_names(self, adapt: str) -> Sequence[str]: ...


class TowerModel:
    """What a model derives from its tower, feature names and label scaling; shared by the
    DLRM and the export's frozen model so the two cannot scale or adapt differently."""

    cat_names: List[str]
    multi_names: List[str]
    tower: DenseTower
    label_mean: float
    label_std: float

    @property
    def table_names(self) -> List[str]:
        return self.cat_names + self.multi_names

    @property
    def dense_variables(self) -> Dict[str, tf.Variable]:
        return self.tower.variables

    def scale_labels(self, labels: tf.Tensor) -> tf.Tensor:
        return (labels - self.label_mean) / self.label_std

    def unscale(self, scores: tf.Tensor) -> tf.Tensor:
        return scores * self.label_std + self.label_mean

    def adapted_names(self, adapt: str) -> Sequence[str]:
        return self.tower.names(adapt if adapt in ("head", "top") else "dense")


def label_scaling(schema: dict) -> Tuple[float, float]:
    """``(mean, std)`` the model standardises labels with: the train split's statistics for
    ratings (so one learning rate fits clicks and ratings), the identity for clicks."""
    if schema["label"]["kind"] != "rating":
        return 0.0, 1.0
    stats = schema.get("label_stats") or {}
    return float(stats.get("mean", 0.0)), float(stats.get("std", 1.0)) or 1.0
