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
in checkpoint file names. A checkpoint written under another split of a table (or whole)
is re-cut on restore (``load_resplit``), so a run can be re-planned between restarts and
evaluation (whole local tables) reads a column-split run.
"""
from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from gmeta_tf import storage
from gmeta_tf.errors import CheckpointError, UserError
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


_BLOCK = re.compile(r"^\.c(\d+)of(\d+)")


def parse_saved_key(key: str, tables: Sequence[str]) -> Optional[Tuple[str, Optional[Tuple[int, int]], str]]:
    """``item.c1of2.m`` -> ``("item", (1, 2), ".m")``; ``item.v`` -> ``("item", None, ".v")``."""
    for t in sorted(tables, key=len, reverse=True):
        if key == t or key.startswith(t + "."):
            rest = key[len(t):]
            m = _BLOCK.match(rest)
            block = (int(m.group(1)), int(m.group(2))) if m else None
            rest = rest[m.end():] if m else rest
            if rest == "" or re.fullmatch(r"\.[^.]+", rest):
                return t, block, rest
    return None


def _load(f: str) -> Tuple[np.ndarray, np.ndarray]:
    data = storage.load_npz(f)
    return data["keys"], data["values"]


def _whole_from_blocks(tables_dir: str, table: str, slot: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    pat = re.compile(rf"^{re.escape(table)}\.c(\d+)of(\d+){re.escape(slot)}\.npz$")
    found = {}
    for name in storage.listdir(tables_dir):
        m = pat.match(name)
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = storage.join(tables_dir, name)
    for n, blocks in sorted(found.items()):
        if sorted(blocks) != list(range(n)):
            continue
        keys0, vals0 = _load(blocks[0])
        order = np.argsort(keys0)
        keys, parts = keys0[order], [vals0[order]]
        for i in range(1, n):
            k, v = _load(blocks[i])
            o = np.argsort(k)
            if not np.array_equal(k[o], keys):
                raise CheckpointError(f"{blocks[i]}: its ids differ from {storage.basename(blocks[0])}'s; the column blocks "
                                      f"of table {table!r} cannot be joined")
            parts.append(v[o])
        return keys, np.concatenate(parts, axis=1)
    return None


def load_resplit(tables_dir: str, key: str, tables: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """Rows for ``key`` from a checkpoint saved with another column split of the same table.

    Lets a run be re-planned between restarts (whole <-> column blocks, or n -> m blocks) and
    lets evaluation, which always builds whole local tables, read a column-split run.
    ``None`` when the checkpoint holds the table in no usable form.
    """
    parsed = parse_saved_key(key, tables)
    if parsed is None:
        return None
    table, block, slot = parsed
    whole = storage.join(tables_dir, f"{table}{slot}.npz")
    full = _load(whole) if storage.exists(whole) else _whole_from_blocks(tables_dir, table, slot)
    if full is None or block is None:
        return full
    keys, values = full
    i, n = block
    if values.shape[1] % n:
        return None
    w = values.shape[1] // n
    return keys, np.ascontiguousarray(values[:, i * w:(i + 1) * w])


def table_iterations(model, emb_opt) -> dict:
    """Optimizer step counters to checkpoint, one per *model* table (a split table's first block's).

    Every block of a table is updated once per step, so its blocks' counters are equal; keying
    the checkpoint by table keeps it readable under another split (``sync_block_iterations``
    copies the counter to the other blocks after a restore).
    """
    by_storage = emb_opt.iterations()
    return {t.name: by_storage[t.parts[0].name if isinstance(t, ColumnSplitTable) else t.name] for t in model.tables}


def sync_block_iterations(model, emb_opt) -> None:
    by_storage = emb_opt.iterations()
    for t in model.tables:
        if isinstance(t, ColumnSplitTable):
            for p in t.parts[1:]:
                by_storage[p.name].assign(by_storage[t.parts[0].name])
