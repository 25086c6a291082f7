"""The meta-DLRM: one TFRA table per categorical / multi-hot feature plus the dense tower.

The label is standardised for rating data (``label_stats`` from ``schema.json``) so the same
learning rates work for clicks and ratings; ``predict`` maps scores back to the label scale.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import tensorflow as tf

import gmeta_tf  # noqa: F401
from gmeta_tf.config.schema import ModelConfig
from gmeta_tf.errors import ClusterError
from gmeta_tf.model.adaptable import TowerModel, label_scaling
from gmeta_tf.model.column_split import ColumnSplitTable, storage_tables
from gmeta_tf.model.dense_tower import DenseTower
from gmeta_tf.model.tables import EmbeddingTable, local_namespace, table_devices
from gmeta_tf.plan.placement_file import ColumnSplit, TablePlacement


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
        self.tables: List[EmbeddingTable | ColumnSplitTable] = []
        rows = {c["name"]: int(c.get("cardinality", 0)) for c in schema["categorical"] + schema["multi_hot"]}
        for i, name in enumerate(self.table_names):
            spec = placement.get(name)
            if isinstance(spec, ColumnSplit):  # planner's column split: n tables of dim d/n
                self.tables.append(ColumnSplitTable(
                    name, cfg.embedding_dim, spec.columns, ps_tasks, self.namespace, cfg.init_stddev,
                    seed=cfg.seed + i, bp_v2=bp_v2, expected_rows=rows.get(name, 0)))
                continue
            self.tables.append(EmbeddingTable(
                name, cfg.embedding_dim, table_devices(ps_tasks, spec),
                self.namespace, cfg.init_stddev, seed=cfg.seed + i, bp_v2=bp_v2,
                expected_rows=rows.get(name, 0)))
        self.tower = DenseTower(cfg, self.n_dense, len(self.tables))
        self.label_mean, self.label_std = label_scaling(schema)

    def storage_tables(self) -> List[EmbeddingTable]:
        """The TFRA tables themselves (a column-split table is several): train, save, size these."""
        return storage_tables(self.tables)

    def trainable_shadows(self) -> List[tf.Variable]:
        return [t.shadow for t in self.storage_tables()]

    def shadows_by_table(self) -> Dict[str, tf.Variable]:
        return {t.name: t.shadow for t in self.storage_tables()}
