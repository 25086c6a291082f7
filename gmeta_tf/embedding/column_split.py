"""A column-split embedding table: n TFRA tables of dim d/n, possibly on different PS.

The sharding planner may cut a dim-d table into column blocks (``placement.yaml``
``{columns: [[0], [1]]}``) so that its memory and the bytes each lookup moves are spread
over several PS. ``ColumnSplitTable`` offers what the model uses of one table (``name``,
``dim``, ``lookup_unique``) and keeps the blocks as ordinary ``EmbeddingTable`` s, so each
block gets the same deterministic shared names, its own optimizer and slot tables, and is
checkpointed like any other table.

One lookup per block per step, each for the same de-duplicated ids (the shadow-variable rule
of ``table.py``); the rows are concatenated along the embedding axis. ``tf.unique`` returns
ids in first-occurrence order, so every block's ``index`` is the same and the result is
exactly the d-dim table's lookup; gradients flow back to each block's slice.

Blocks are named ``<table>.c<i>of<n>``: valid in TFRA variable and shared resource names and
in checkpoint file names. A checkpoint written under another split of a table (or whole)
is re-cut on restore (``table_files.load_resplit``), so a run can be re-planned between restarts and
evaluation (whole local tables) reads a column-split run.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import tensorflow as tf

from gmeta_tf.embedding.devices import table_devices
from gmeta_tf.embedding.table import EmbeddingTable, UniqueLookup
from gmeta_tf.errors import UserError


def block_name(table: str, i: int, n: int) -> str:
    return f"{table}.c{i}of{n}"


class ColumnSplitTable:
    def __init__(self, name: str, dim: int, blocks: Sequence[Sequence[int]], ps_tasks: int, namespace: str,
                 init_stddev: float, seed: int, bp_v2: bool = False, expected_rows: int = 0,
                 init_rows: str = "missing"):
        n = len(blocks)
        if n < 2 or dim % n:
            raise UserError(f"cluster.placement: table {name!r} has dim {dim}, which cannot be cut into {n} "
                            "equal column blocks")
        self.name = name
        self.dim = dim
        self.parts: List[EmbeddingTable] = [
            EmbeddingTable(block_name(name, i, n), dim // n, table_devices(ps_tasks, list(ps)), namespace,
                           init_stddev, seed=seed * 1009 + i, bp_v2=bp_v2, expected_rows=expected_rows,
                           init_rows=init_rows)
            for i, ps in enumerate(blocks)
        ]

    def lookup_unique(self, ids: Sequence[tf.Tensor], trainable: bool = True) -> UniqueLookup:
        looked = [p.lookup_unique(ids, trainable=trainable) for p in self.parts]
        return UniqueLookup(rows=tf.concat([x.rows for x in looked], axis=-1), index=looked[0].index)

    def size(self) -> int:
        return self.parts[0].size()

    def storage(self) -> List[EmbeddingTable]:
        return list(self.parts)


def table_iterations(tables, emb_opt) -> Dict[str, tf.Variable]:
    """Optimizer step counters to checkpoint, one per *model* table (a table's first TFRA table's).

    Every block of a split table is updated once per step, so its blocks' counters are equal;
    keying the checkpoint by table keeps it readable under another split
    (``sync_block_iterations`` copies the counter to the other blocks after a restore).
    """
    by_storage = emb_opt.iterations()
    return {t.name: by_storage[t.storage()[0].name] for t in tables}


def sync_block_iterations(tables, emb_opt) -> None:
    by_storage = emb_opt.iterations()
    for t in tables:
        first, *rest = t.storage()
        for p in rest:
            by_storage[p.name].assign(by_storage[first.name])
