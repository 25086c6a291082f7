"""The trained model rebuilt from checkpoint files for export: the tower and static tables.

It offers what adaptation and scoring read of a model (``model.adaptable.AdaptableModel``), so
the signatures run evaluation's and the inner loop's own functions on it. It is a ``tf.Module``:
every weight and table it holds is saved with the SavedModel.
"""
from __future__ import annotations

from typing import List

import numpy as np
import tensorflow as tf

from gmeta_tf.config.schema import Config
from gmeta_tf.errors import CheckpointError
from gmeta_tf.export.checkpoint_reader import read_dense, read_table
from gmeta_tf.export.input_transforms import InputTransforms
from gmeta_tf.export.static_table import StaticTable
from gmeta_tf.meta import neighbourhood
from gmeta_tf.meta.inner_loop import RIDGE_PRIOR, SUPPORT_HALF_LIFE, add_ridge_prior, add_support_recency
from gmeta_tf.metaio.decode import layout_from_schema
from gmeta_tf.model.adaptable import TowerModel, label_scaling
from gmeta_tf.model.dense_tower import DenseTower


class FrozenModel(tf.Module, TowerModel):
    def __init__(self, cfg: Config, schema: dict, ckpt_dir: str):
        super().__init__(name="gmeta_model")
        self.kind: str = schema["label"]["kind"]
        self.cat_names = [c["name"] for c in schema["categorical"]]
        self.multi_names = [c["name"] for c in schema["multi_hot"]]
        self.n_dense = len(schema["dense"])
        # data.min_id_count and prepare.target_encoding, as Meta-IO applies them to test data.
        self.inputs = InputTransforms(cfg.data.path, schema, cfg.data.min_id_count)
        self.n_input_dense = len(self.inputs.input_dense)
        # Clients send dense features as the input data has them; Meta-IO standardised them with
        # the train split's statistics before the model saw them, so the graph does the same.
        layout = layout_from_schema(schema, 1, 1, 1)
        self.dense_mean = tf.constant(layout.dense_mean)
        self.dense_inv_std = tf.constant(layout.dense_inv_std)
        self.label_mean, self.label_std = label_scaling(schema)
        self.label_stats = dict(schema.get("label_stats") or {})  # its min/max: the labels trained on
        self.tables: List[StaticTable] = []
        for name in self.cat_names + self.multi_names:
            ids, rows = read_table(ckpt_dir, name)
            if rows.shape[1] != cfg.model.embedding_dim:
                raise CheckpointError(f"{ckpt_dir}: table {name!r} has rows of dim {rows.shape[1]}, but the run's "
                                      f"config has model.embedding_dim {cfg.model.embedding_dim}")
            self.tables.append(StaticTable(name, ids, rows))
        self.tower = DenseTower(cfg.model, self.n_dense, len(self.tables))
        self._load_dense(ckpt_dir)
        # Tracked, so saved (DenseTower is no tf.Module); after the load, which may add λ.
        self.weights = dict(self.tower.variables)

    def standardize(self, dense: tf.Tensor) -> tf.Tensor:
        """Raw dense features ``[..., n_dense]`` → what the tower was trained on (Meta-IO's rule)."""
        return (dense - self.dense_mean) * self.dense_inv_std

    def _load_dense(self, ckpt_dir: str) -> None:
        got = read_dense(ckpt_dir, [*self.tower.variables, RIDGE_PRIOR, SUPPORT_HALF_LIFE, *neighbourhood.NAMES])
        if RIDGE_PRIOR in got:  # the run learned its Newton head's λ (meta.learn_ridge_lambda)
            add_ridge_prior(self, 1.0)
        if SUPPORT_HALF_LIFE in got:  # and its support recency (meta.support_half_life)
            add_support_recency(self, 1.0)
        if neighbourhood.KEY in got:  # and its neighbourhood head (model.neighbourhood)
            neighbourhood.add_neighbourhood(self, int(got[neighbourhood.KEY].shape[1]))
        for name, var in self.tower.variables.items():
            value = got.get(name)
            if value is None or tuple(value.shape) != tuple(var.shape):
                found = "missing" if value is None else f"of shape {list(value.shape)}"
                raise CheckpointError(
                    f"{ckpt_dir}: dense weight {name!r} is {found}, but the run's config builds "
                    f"{list(var.shape)}; was the checkpoint written with another model config?")
            var.assign(value.astype(np.float32))
