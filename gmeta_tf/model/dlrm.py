"""The meta-DLRM: one TFRA table per categorical / multi-hot feature plus the dense tower.

The label is standardised for rating data (``label_stats`` from ``schema.json``) so the same
learning rates work for clicks and ratings; ``predict`` maps scores back to the label scale.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import tensorflow as tf

from gmeta_tf.config.schema import ConfigError, ModelConfig
from gmeta_tf.embedding.collection import Embeddings, create_tables
from gmeta_tf.embedding.fused import resolve as fuse_tables
from gmeta_tf.embedding.naming import local_namespace
from gmeta_tf.embedding.table import EmbeddingTable, Table, expected_table_rows
from gmeta_tf.errors import ClusterError
from gmeta_tf.model.adaptable import TowerModel, label_scaling
from gmeta_tf.model.dense_tower import DenseTower
from gmeta_tf.plan.placement_file import TablePlacement


class DLRM(TowerModel):
    def __init__(self, cfg: ModelConfig, schema: dict, *, namespace: Optional[str] = None,
                 ps_tasks: int = 0, placement: Optional[Dict[str, TablePlacement]] = None,
                 bp_v2: bool = False):
        self.cfg = cfg
        self.schema = schema
        self.kind: str = schema["label"]["kind"]
        self.cat_names = [c["name"] for c in schema["categorical"]]
        self.multi_names = [c["name"] for c in schema["multi_hot"]]
        self.n_dense = len(schema["dense"])
        self.namespace = namespace or local_namespace()
        placement = placement or {}
        unknown = sorted(set(placement) - set(self.table_names))
        if unknown:  # a typo would otherwise silently leave the table row-sharded over every PS
            raise ClusterError(f"cluster.placement names table(s) {unknown} that the data does not have "
                               f"(tables: {', '.join(self.table_names)})")
        unknown = sorted(set(cfg.max_rows) - set(self.table_names))
        if unknown:
            raise ConfigError(f"config key 'model.max_rows': no table {unknown} in the data "
                              f"(tables: {', '.join(self.table_names)})")
        rows = {c["name"]: expected_table_rows(int(c.get("cardinality", 0)), cfg.max_rows.get(c["name"], 0))
                for c in schema["categorical"] + schema["multi_hot"]}
        # Every table of the model, for its whole life (gmeta_tf/embedding/collection.py).
        self.embeddings = Embeddings(
            create_tables(self.table_names, cfg.embedding_dim, namespace=self.namespace, ps_tasks=ps_tasks,
                          placement=placement, init_stddev=cfg.init_stddev, seed=cfg.seed, bp_v2=bp_v2,
                          expected_rows=rows, counted=list(cfg.max_rows),
                          init_rows=cfg.init_rows, fuse=fuse_tables(cfg.fuse_tables)),
            self.cat_names, self.multi_names, ps_requests=cfg.ps_requests)
        self.tower = DenseTower(cfg, self.n_dense, len(self.tables))
        self.label_mean, self.label_std = label_scaling(schema)
        # The training objective's loss on query (MAML) or all (ERM) samples; see heads.py.
        self.outer_loss: str = cfg.rating_loss
        # A term on each task's query order added to the meta objective (heads.per_task_ranking_loss).
        self.ranking_loss = (cfg.ranking_loss, float(cfg.ranking_loss_weight))

    @property
    def tables(self) -> List[Table]:
        """The feature-level tables (``embeddings.tables``): plain, column-split or hot/cold."""
        return self.embeddings.tables

    def storage_tables(self) -> List[EmbeddingTable]:
        """The TFRA tables themselves (a column-split table is several): train, save, size these."""
        return self.embeddings.storage()

    def trainable_shadows(self) -> List[tf.Variable]:
        return self.embeddings.shadows()
