"""A column-split embedding table: n TFRA tables of dim d/n, possibly on different PS.

The sharding planner may cut a dim-d table into column blocks (``placement.yaml``
``{columns: [[0], [1]]}``) so that its memory and the bytes each lookup moves are spread
over several PS. ``ColumnSplitTable`` offers what the model uses of one table (``name``,
``dim``, ``lookup_unique``) and keeps the blocks as ordinary ``EmbeddingTable`` s, so each
block gets the same deterministic shared names, its own optimizer and slot tables, and is
checkpointed like any other table.

One lookup per block per step, each for the same de-duplicated ids (the shadow-variable rule
of ``tables.py``); the rows are concatenated along the embedding axis. ``tf.unique`` returns
ids in first-occurrence order, so every block's ``index`` is the same and the result is
exactly the d-dim table's lookup; gradients flow back to each block's slice.

Blocks are named ``<table>.c<i>of<n>``: valid in TFRA variable and shared resource names and
in checkpoint file names, and a checkpoint of a differently split table does not match.
"""
from __future__ import annotations

from typing import List, Sequence

import tensorflow as tf

from gmeta_tf.errors import UserError
from gmeta_tf.model.tables import EmbeddingTable, UniqueLookup, table_devices


def block_name(table: str, i: int, n: int) -> str:
    return f"{table}.c{i}of{n}"


class ColumnSplitTable:
    def __init__(self, name: str, dim: int, blocks: Sequence[Sequence[int]], ps_tasks: int, namespace: str,
                 init_stddev: float, seed: int, bp_v2: bool = False, expected_rows: int = 0):
        n = len(blocks)
        if n < 2 or dim % n:
            raise UserError(f"cluster.placement: table {name!r} has dim {dim}, which cannot be cut into {n} "
                            "equal column blocks")
        self.name = name
        self.dim = dim
        self.parts: List[EmbeddingTable] = [
            EmbeddingTable(block_name(name, i, n), dim // n, table_devices(ps_tasks, list(ps)), namespace,
                           init_stddev, seed=seed * 1009 + i, bp_v2=bp_v2, expected_rows=expected_rows)
            for i, ps in enumerate(blocks)
        ]

    def lookup_unique(self, ids: Sequence[tf.Tensor], trainable: bool = True) -> UniqueLookup:
        looked = [p.lookup_unique(ids, trainable=trainable) for p in self.parts]
        return UniqueLookup(rows=tf.concat([x.rows for x in looked], axis=-1), index=looked[0].index)

    def size(self) -> int:
        return self.parts[0].size()


def storage_tables(tables) -> List[EmbeddingTable]:
    """The TFRA tables behind the model's tables: what optimizers train and checkpoints save."""
    out: List[EmbeddingTable] = []
    for t in tables:
        out.extend(t.parts if isinstance(t, ColumnSplitTable) else [t])
    return out
