"""Meta-IO: task-major Parquet (``gmeta_tf.data.task_format``) → ``tf.data`` batches of T padded tasks.

Design, and why:

* **Fixed shapes.** Every batch is exactly ``[T, S|Q, ...]`` so the meta step is traced once;
  short tasks are padded and masked, long ones truncated (support keeps its *last* S samples,
  the ones closest in time to the query; query keeps its first Q).
* **Blocks, not rows, cross the Python boundary.** A generator per Parquet file yields whole
  decoded record batches (``decode.decode_block``: vectorized over Arrow offsets). The per-task
  work left to TensorFlow (unbatch → shuffle → batch) runs in C++ off the GIL.
* **Parallel files.** ``interleave(num_parallel_calls=parallel_reads)`` reads several files at
  once; pyarrow decompression releases the GIL, so this overlaps I/O with decoding.
* **Exact epochs.** Training is an endless sequence of *epochs* (``flat_map`` over an epoch
  counter); each epoch reads every shard file once in a fresh order with fresh seeds, and the
  shuffle buffer drains at the epoch end. So every epoch is exactly the shard's multiset of
  tasks, yet the order differs from epoch to epoch, and everything is reproducible from
  ``cfg.seed + rank``. Batching happens after the epochs are chained, so no task is dropped
  at an epoch boundary.
* **Sharding by file.** Rank ``r`` of ``n`` reads ``task_format.shard_files(files, r, n)``: disjoint
  tasks per rank without any coordination.
* **Evaluation** is one deterministic pass; the last partial batch is filled with padding tasks
  (``task_mask`` 0) so evaluation runs the same fixed-shape function as everything else.

Errors a user can fix (missing ``schema.json``, wrong version, empty split, missing column,
schema/Parquet mismatch) are raised as ``DataError`` from ``make_dataset`` itself, before any
iteration. Problems only visible in the data (e.g. a row with the wrong number of dense values)
surface while iterating, as a ``tf.errors.OpError`` whose message names the file and column.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from gmeta_tf.config.schema import DataConfig
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.task_format import load_schema, split_files  # noqa: F401  (part of this module's API)
from gmeta_tf.errors import DataError
from gmeta_tf.metaio import decode, episodes, rare_ids

# Rows per record batch handed to the decoder. Large enough that per-block Python overhead
# (~tens of numpy calls) is amortized over many tasks, small enough that a block of long tasks
# stays a few MB and the first batch arrives quickly.
BLOCK_ROWS = 1024

__all__ = ["load_schema", "make_dataset", "batch_signature", "split_files", "BLOCK_ROWS"]


# --------------------------------------------------------------------------------------------
# schema and files
# --------------------------------------------------------------------------------------------
def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _check_file(file: str, layout: decode.BlockLayout) -> int:
    """Columns and Arrow types of one file against schema.json (footer only, plus one block of
    the dense columns, whose width the Arrow type does not tell). Returns its number of tasks."""
    try:
        pf = pq.ParquetFile(file)
    except Exception as e:  # pyarrow raises several types for a bad / truncated file
        raise DataError(f"{file}: not a readable Parquet file: {e}") from None
    arrow = pf.schema_arrow
    names = set(arrow.names)
    for col in layout.columns():
        if col not in names:
            raise DataError(f"{file}: required column '{col}' is missing (schema.json expects it)")
    depth = {fmt.TASK_ID: 0}
    for which in fmt.SETS:
        depth[fmt.label_col(which)] = 1
        depth[fmt.dense_col(which)] = 2
        for n in layout.categorical:
            depth[fmt.cat_col(which, n)] = 1
        for n in layout.multi_hot:
            depth[fmt.multi_col(which, n)] = 2
    for col in layout.columns():
        t = arrow.field(col).type
        for _ in range(depth[col]):
            if not _is_list(t):
                raise DataError(f"{file}: column '{col}' has Arrow type {arrow.field(col).type}, expected {depth[col]} level(s) of list")
            t = t.value_type
        if col == fmt.TASK_ID:
            ok = pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
        elif ".cat." in col or ".multi." in col:
            ok = pa.types.is_integer(t)
        else:
            ok = pa.types.is_floating(t) or pa.types.is_integer(t)
        if not ok:
            raise DataError(f"{file}: column '{col}' has Arrow type {arrow.field(col).type}, which the reader cannot use")
    known = set(layout.columns())
    for col in arrow.names:
        if (".cat." in col or ".multi." in col) and col not in known:
            raise DataError(f"{file}: column '{col}' is not described by schema.json (schema from another prepare run?)")
    if layout.dense_dim:
        for rb in pf.iter_batches(batch_size=16, columns=[fmt.dense_col(w) for w in fmt.SETS]):
            for which in fmt.SETS:
                col = fmt.dense_col(which)
                _, rows = decode._offsets_values(rb.column(col), f"{file}: column '{col}'")
                inner, _ = decode._offsets_values(rows, f"{file}: column '{col}'")
                widths = np.diff(inner)
                if widths.size and np.any(widths != layout.dense_dim):
                    raise DataError(
                        f"{file}: column '{col}' has {int(widths[widths != layout.dense_dim][0])} dense "
                        f"values per sample but schema.json lists {layout.dense_dim} dense features"
                    )
            break
    return pf.metadata.num_rows


# --------------------------------------------------------------------------------------------
# signatures
# --------------------------------------------------------------------------------------------
def _signature(layout: decode.BlockLayout, t) -> Dict[str, object]:
    def one(width: int) -> Dict[str, object]:
        out = {
            "label": tf.TensorSpec([t, width], tf.float32),
            "mask": tf.TensorSpec([t, width], tf.float32),
            "dense": tf.TensorSpec([t, width, layout.dense_dim], tf.float32),
            "cat": {n: tf.TensorSpec([t, width], tf.int64) for n in layout.categorical},
            "multi": {n: tf.TensorSpec([t, width, layout.max_multi_hot], tf.int64) for n in layout.multi_hot},
        }
        if layout.raw_ids:
            out["raw_cat"] = dict(out["cat"])
        return out

    return {
        "task_id": tf.TensorSpec([t], tf.string),
        "task_mask": tf.TensorSpec([t], tf.float32),
        "support": one(layout.support),
        "query": one(layout.query),
    }


def _layout(schema: dict, cfg: DataConfig, path: Optional[str] = None, raw_ids: bool = False) -> decode.BlockLayout:
    """``path`` (the prepared dir) is needed only to read the id counts of ``data.min_id_count``;
    the signature does not depend on them."""
    frequent = rare_ids.frequent_ids(path, schema, cfg.min_id_count) if path is not None and cfg.min_id_count else None
    return decode.layout_from_schema(schema, cfg.support, cfg.query, cfg.max_multi_hot, frequent, raw_ids)


def batch_signature(schema: dict, cfg: DataConfig) -> Dict[str, object]:
    """The ``tf.TensorSpec`` structure of one batch (for ``tf.function(input_signature=...)``).

    Dict key order follows schema order; note ``tf.nest`` flattens dicts by sorted key.
    """
    return _signature(_layout(schema, cfg), cfg.tasks_per_batch)


# --------------------------------------------------------------------------------------------
# the pipeline
# --------------------------------------------------------------------------------------------
def _file_dataset(layout: decode.BlockLayout, shuffle: bool, base_seed: int, resample: bool = False,
                  draw_support: Optional[int] = None):
    """``(file, epoch, index) -> Dataset`` of decoded blocks of one Parquet file; ``resample``
    re-deals every task's support / query each epoch (``episodes.resample``), keeping a drawn
    number of support samples per task when ``draw_support`` is set."""
    columns = layout.columns()
    block_spec = _signature(layout, None)
    no_dense = layout.dense_dim == 0
    if no_dense:  # see _add_empty_dense
        for which in fmt.SETS:
            del block_spec[which]["dense"]

    def blocks(file: bytes, epoch: int, index: int):
        path = file.decode("utf-8")
        pf = pq.ParquetFile(path)
        groups = list(range(pf.num_row_groups))
        rng = None
        if shuffle or resample:
            # Fresh, reproducible randomness per (seed, epoch, file): row groups in a new order and
            # tasks permuted within each block, so mixing does not rest on the buffer alone.
            rng = np.random.default_rng([base_seed % 2**32, int(epoch), int(index)])
            if shuffle:
                rng.shuffle(groups)
        if not groups:
            return
        for rb in pf.iter_batches(batch_size=BLOCK_ROWS, row_groups=groups, columns=columns, use_threads=False):
            if rb.num_rows == 0:
                continue
            if resample:
                rb = episodes.resample(rb, rng, draw_support)
            block = decode.decode_block(rb, layout, path)
            if shuffle:
                block = decode.take(block, rng.permutation(rb.num_rows))
            if no_dense:
                for which in fmt.SETS:
                    del block[which]["dense"]
            yield block

    def make(file, epoch, index):
        return tf.data.Dataset.from_generator(blocks, output_signature=block_spec, args=(file, epoch, index))

    return make


def _add_empty_dense(batch, layout: decode.BlockLayout, n):
    """Give a batch its ``[n, W, 0]`` dense tensors after batching.

    With no dense features they are zero-sized, and ``unbatch`` of a zero-sized component
    crashes the process in TF 2.16 (segfault), so they are kept out of the per-task pipeline.
    """
    for which in fmt.SETS:
        batch[which]["dense"] = tf.zeros([n, layout.width(which), 0], tf.float32)
    return batch


def make_dataset(
    path: str,
    split: str,
    cfg: DataConfig,
    *,
    rank: int = 0,
    size: int = 1,
    training: bool = True,
    schema: Optional[dict] = None,
    raw_ids: bool = False,
) -> tf.data.Dataset:
    """Batches of ``cfg.tasks_per_batch`` padded tasks from this rank's shard of ``split``.

    ``training``: endless, shuffled (seed ``cfg.seed + rank``; ``shuffle_buffer`` 0 turns all
    shuffling off), full batches only. Otherwise: one pass in a deterministic order, the last
    batch padded with ``task_mask`` 0 tasks. ``cfg.min_id_count`` pools rare ids into
    ``RARE_ID`` (``rare_ids.py``); ``raw_ids`` adds each set's ids as written under ``raw_cat``.
    """
    if schema is None:
        schema = load_schema(path)
    layout = _layout(schema, cfg, path, raw_ids)
    files = split_files(path, split, schema)
    try:
        mine = fmt.shard_files(files, rank, size)
    except ValueError as e:
        raise DataError(f"split '{split}': {e}") from None
    if sum(_check_file(f, layout) for f in mine) == 0:
        # Caught here because an endless training pipeline over no tasks would hang, not fail.
        raise DataError(f"split '{split}': the files of rank {rank} of {size} hold no tasks ({', '.join(mine)})")

    T = cfg.tasks_per_batch
    cycle = max(1, min(cfg.parallel_reads, len(mine)))
    seed = int(cfg.seed) + int(rank)
    shuffle = training and cfg.shuffle_buffer > 0
    resample = training and cfg.episodes == "resample"
    make = _file_dataset(layout, shuffle, seed, resample=resample,
                         draw_support=cfg.support if resample and cfg.support_size_draw == "uniform" else None)
    n_files = len(mine)
    files_t = tf.constant(mine)

    def epoch_tasks(epoch):
        order = tf.range(n_files, dtype=tf.int64)
        if shuffle:
            # A stateless permutation keyed by (seed, epoch): ``Dataset.shuffle`` cannot take a
            # tensor seed once a global seed is set (the trainer sets one).
            keys = tf.random.stateless_uniform([n_files], seed=tf.stack([tf.cast(seed, tf.int64), epoch]))
            order = tf.gather(order, tf.argsort(keys))
        ds = tf.data.Dataset.from_tensor_slices((tf.gather(files_t, order), order))
        ds = ds.map(lambda f, i: (f, epoch, i))
        ds = ds.interleave(make, cycle_length=cycle, block_length=1, num_parallel_calls=cycle, deterministic=True)
        ds = ds.unbatch()
        if shuffle:
            # Python-int seed (see above); epochs still differ because the files and the
            # blocks within them arrive in a per-epoch order.
            ds = ds.shuffle(cfg.shuffle_buffer, seed=seed + 1)
        return ds

    if training:
        ds = tf.data.Dataset.range(np.iinfo(np.int64).max).flat_map(epoch_tasks)
        ds = ds.batch(T, drop_remainder=True)
        if layout.dense_dim == 0:
            ds = ds.map(lambda b: _add_empty_dense(b, layout, T))
    else:
        ds = epoch_tasks(tf.constant(0, tf.int64)).batch(T, drop_remainder=False)
        if layout.dense_dim == 0:
            ds = ds.map(lambda b: _add_empty_dense(b, layout, tf.shape(b["task_id"])[0]))
        pad = tf.nest.map_structure(tf.constant, decode.empty_block(layout, T))
        spec = _signature(layout, T)

        def fill(batch):
            # Append T padding tasks and cut back to T: a no-op for full batches, fills the last
            # one; ensure_shape restores the static [T, ...] shape the slice loses.
            return tf.nest.map_structure(
                lambda x, p, s: tf.ensure_shape(tf.concat([x, p], 0)[:T], s.shape), batch, pad, spec
            )

        ds = ds.map(fill)
    return ds.prefetch(cfg.prefetch if cfg.prefetch > 0 else tf.data.AUTOTUNE)
