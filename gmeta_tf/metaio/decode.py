"""Arrow record batch of tasks → fixed-shape, padded numpy block (no TensorFlow here).

The reader must outrun a training step by a wide margin on very few cores, so nothing in this
module loops over tasks or samples in Python: every list column is turned into padded arrays
with one gather driven by the Arrow list offsets (``start + arange(width)`` broadcast over the
tasks, masked where a task is shorter). Python work is per *column*, not per row.

Kept separate from ``reader`` so the exact padding / truncation rules can be unit-tested and
benchmarked without building a ``tf.data`` pipeline.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import pyarrow as pa

from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError
from gmeta_tf.metaio.rare_ids import remap


@dataclass(frozen=True)
class BlockLayout:
    """What a block looks like: widths from the config, feature names and statistics from the schema.

    Built once per dataset so the per-block code does no schema parsing.
    """

    support: int
    query: int
    max_multi_hot: int
    categorical: Tuple[str, ...]
    multi_hot: Tuple[str, ...]
    dense_mean: np.ndarray  # [D] float32
    dense_inv_std: np.ndarray  # [D] float32, 1/std with std 0 (constant feature) treated as 1
    # data.min_id_count: per feature, the sorted ids kept; any other id is read as RARE_ID.
    frequent: Mapping[str, np.ndarray] = field(default_factory=dict)
    # Also emit each set's categorical ids as written (``raw_cat``), for the eval baselines,
    # which are keyed by the real ids whatever the model sees.
    raw_ids: bool = False

    @property
    def dense_dim(self) -> int:
        return int(self.dense_mean.shape[0])

    def width(self, which: str) -> int:
        return self.support if which == "support" else self.query

    def columns(self) -> List[str]:
        """The Parquet columns the reader needs (others, e.g. ``sample_index``, are never read)."""
        cols = [fmt.TASK_ID]
        for which in fmt.SETS:
            cols.append(fmt.label_col(which))
            if self.dense_dim:
                cols.append(fmt.dense_col(which))
            cols += [fmt.cat_col(which, n) for n in self.categorical]
            cols += [fmt.multi_col(which, n) for n in self.multi_hot]
        return cols


def layout_from_schema(schema: dict, support: int, query: int, max_multi_hot: int,
                       frequent: Optional[Mapping[str, np.ndarray]] = None, raw_ids: bool = False) -> BlockLayout:
    dense = schema.get("dense") or []
    mean = np.asarray([float(d.get("mean", 0.0)) for d in dense], dtype=np.float64)
    std = np.asarray([float(d.get("std", 1.0)) for d in dense], dtype=np.float64)
    # A constant (std 0) or broken (NaN) statistic must not turn a feature into inf/NaN.
    std = np.where(np.isfinite(std) & (std > 0), std, 1.0)
    mean = np.where(np.isfinite(mean), mean, 0.0)
    return BlockLayout(
        support=int(support),
        query=int(query),
        max_multi_hot=int(max_multi_hot),
        categorical=tuple(c["name"] for c in schema.get("categorical") or []),
        multi_hot=tuple(m["name"] for m in schema.get("multi_hot") or []),
        dense_mean=mean.astype(np.float32),
        dense_inv_std=(1.0 / std).astype(np.float32),
        frequent=dict(frequent or {}),
        raw_ids=bool(raw_ids),
    )


# --------------------------------------------------------------------------------------------
# Arrow list plumbing
# --------------------------------------------------------------------------------------------
_NUMPY = {
    getattr(pa, n)(): np.dtype(n)
    for n in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
}


def _primitive(arr: pa.Array) -> np.ndarray:
    """Zero-copy numpy view of a null-free fixed-width Arrow array.

    ``Array.to_numpy`` would do, but it attempts an (absent) optional import on every call,
    which costs more than the decoding of a small column.
    """
    dtype = _NUMPY[arr.type]
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.empty(0, dtype)
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _offsets_values(arr: pa.Array, where: str) -> Tuple[np.ndarray, pa.Array]:
    """(offsets [n+1] int64 into ``values``, values) for list / large_list / fixed_size_list.

    ``offsets`` already accounts for a sliced array, and ``values`` is the *unsliced* child, so
    the pair is always consistent (``flatten()`` would slice the child and break nesting).
    """
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if arr.null_count:
            raise DataError(f"{where}: {arr.null_count} null list value(s); the reader needs empty lists, not nulls")
        width = np.int64 if pa.types.is_large_list(t) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width, count=len(arr) + 1, offset=arr.offset * np.dtype(width).itemsize)
        return offsets.astype(np.int64), arr.values
    if pa.types.is_fixed_size_list(t):
        if arr.null_count:
            raise DataError(f"{where}: {arr.null_count} null list value(s)")
        n = t.list_size
        return (np.arange(len(arr) + 1, dtype=np.int64) + arr.offset) * n, arr.values
    raise DataError(f"{where}: expected a list column, got Arrow type {t}")


def _flat_numpy(values: pa.Array, dtype, where: str) -> np.ndarray:
    if values.null_count:
        raise DataError(f"{where}: {values.null_count} null value(s) inside the lists")
    t = values.type
    if t not in _NUMPY:
        raise DataError(f"{where}: expected numeric values, got Arrow type {t}")
    return _primitive(values).astype(dtype, copy=False)


def _slots(offsets: np.ndarray, width: int, keep_last: bool) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per task: the child index of each of ``width`` output slots, its validity, and the lengths.

    ``keep_last`` keeps the last ``width`` items of a long list (support: the samples closest in
    time to the query); otherwise the first ``width``. Kept items always start at slot 0.
    """
    lengths = np.diff(offsets)
    kept = np.minimum(lengths, width)
    start = offsets[:-1] + (lengths - kept if keep_last else 0)
    pos = np.arange(width, dtype=np.int64)
    idx = start[:, None] + pos[None, :]
    valid = pos[None, :] < kept[:, None]
    return idx, valid, lengths


def _gather(flat: np.ndarray, idx: np.ndarray, valid: np.ndarray, fill) -> np.ndarray:
    if flat.size == 0:
        return np.full(idx.shape, fill, dtype=flat.dtype)
    return np.where(valid, flat[np.where(valid, idx, 0)], np.asarray(fill, dtype=flat.dtype))


# --------------------------------------------------------------------------------------------
# one block
# --------------------------------------------------------------------------------------------
def decode_block(batch: pa.RecordBatch, layout: BlockLayout, source: str = "<batch>") -> Dict[str, object]:
    """Decode a record batch of N tasks into the reader's element structure with leading dim N.

    Errors name ``source`` (the Parquet file) and the column, since a mismatch here means the
    file was not written by ``prepare`` for this ``schema.json``.
    """
    names = batch.schema.names

    def column(name: str) -> pa.Array:
        try:
            return batch.column(names.index(name))
        except ValueError:
            raise DataError(f"{source}: required column '{name}' is missing") from None

    n = batch.num_rows
    task_ids = column(fmt.TASK_ID)
    if task_ids.null_count:
        raise DataError(f"{source}: column '{fmt.TASK_ID}' has {task_ids.null_count} null value(s)")
    out: Dict[str, object] = {
        "task_id": np.asarray(task_ids.cast(pa.string()).to_numpy(zero_copy_only=False), dtype=object),
        "task_mask": np.ones(n, dtype=np.float32),
    }
    for which in fmt.SETS:
        out[which] = _decode_set(column, which, layout, n, source)
    return out


def _decode_set(column, which: str, layout: BlockLayout, n: int, source: str) -> Dict[str, object]:
    width = layout.width(which)
    keep_last = which == "support"
    L = layout.max_multi_hot

    name = fmt.label_col(which)
    where = f"{source}: column '{name}'"
    offsets, values = _offsets_values(column(name), where)
    idx, valid, lengths = _slots(offsets, width, keep_last)
    if which == "query" and n and lengths.min() == 0:
        raise DataError(f"{where}: a task has no query samples (task row {int(np.argmin(lengths))})")
    labels = _flat_numpy(values, np.float32, where)
    res: Dict[str, object] = {
        "label": _gather(labels, idx, valid, 0.0),
        "mask": valid.astype(np.float32),
    }

    def same_lengths(col: str, offs: np.ndarray) -> None:
        # Every per-sample column must describe the same samples as the label column, otherwise
        # slot k of one feature would silently belong to a different sample than slot k of another.
        if not np.array_equal(np.diff(offs), lengths):
            bad = int(np.argmax(np.diff(offs) != lengths))
            raise DataError(
                f"{source}: column '{col}' has {int(np.diff(offs)[bad])} samples in task row {bad} "
                f"but '{name}' has {int(lengths[bad])}"
            )

    D = layout.dense_dim
    if D:
        col = fmt.dense_col(which)
        where_d = f"{source}: column '{col}'"
        offs, rows = _offsets_values(column(col), where_d)
        same_lengths(col, offs)
        inner_offs, floats = _offsets_values(rows, where_d)
        used = inner_offs[offs[0] : offs[-1] + 1]
        if used.size > 1 and not np.all(np.diff(used) == D):
            bad = np.diff(used)[np.diff(used) != D][0]
            raise DataError(
                f"{where_d}: a sample has {int(bad)} dense values but schema.json lists {D} dense features"
            )
        flat = _flat_numpy(floats, np.float32, where_d)
        if offs[-1] > offs[0] and flat.size:
            sample = np.where(valid, offs[0] - offsets[0] + idx, offs[0])  # [n, W] row of `rows`
            fidx = np.where(valid[..., None], inner_offs[sample][..., None] + np.arange(D), 0)
            dense = (flat[fidx] - layout.dense_mean) * layout.dense_inv_std
            dense = np.where(valid[..., None], dense, np.float32(0.0)).astype(np.float32, copy=False)
        else:
            dense = np.zeros((n, width, D), dtype=np.float32)
        res["dense"] = dense
    else:
        res["dense"] = np.zeros((n, width, 0), dtype=np.float32)

    cats: Dict[str, np.ndarray] = {}
    for feat in layout.categorical:
        col = fmt.cat_col(which, feat)
        where_c = f"{source}: column '{col}'"
        offs, vals = _offsets_values(column(col), where_c)
        same_lengths(col, offs)
        cats[feat] = _gather(_flat_numpy(vals, np.int64, where_c), offs[0] - offsets[0] + idx, valid, fmt.PAD_ID)
    if layout.raw_ids:
        res["raw_cat"] = dict(cats)
    res["cat"] = {f: remap(v, layout.frequent[f]) if f in layout.frequent else v for f, v in cats.items()}

    multis: Dict[str, np.ndarray] = {}
    pos = np.arange(L, dtype=np.int64)
    for feat in layout.multi_hot:
        col = fmt.multi_col(which, feat)
        where_m = f"{source}: column '{col}'"
        offs, lists = _offsets_values(column(col), where_m)
        same_lengths(col, offs)
        inner_offs, ids = _offsets_values(lists, where_m)
        flat = _flat_numpy(ids, np.int64, where_m)
        if feat in layout.frequent:
            flat = remap(flat, layout.frequent[feat])
        sample = np.where(valid, offs[0] - offsets[0] + idx, 0)
        if offs[-1] == offs[0] or flat.size == 0:
            multis[feat] = np.full((n, width, L), fmt.PAD_ID, dtype=np.int64)
            continue
        start = inner_offs[sample]  # [n, W]
        count = np.minimum(inner_offs[sample + 1] - start, L)
        ok = valid[..., None] & (pos < count[..., None])  # [n, W, L]
        gidx = np.where(ok, start[..., None] + pos, 0)
        multis[feat] = np.where(ok, flat[gidx], np.int64(fmt.PAD_ID))
    res["multi"] = multis
    return res


def empty_block(layout: BlockLayout, n: int) -> Dict[str, object]:
    """``n`` padding tasks: what eval appends to fill its last batch (all masks 0, ids PAD_ID)."""

    def one(width: int) -> Dict[str, object]:
        out = {
            "label": np.zeros((n, width), np.float32),
            "mask": np.zeros((n, width), np.float32),
            "dense": np.zeros((n, width, layout.dense_dim), np.float32),
            "cat": {f: np.full((n, width), fmt.PAD_ID, np.int64) for f in layout.categorical},
            "multi": {f: np.full((n, width, layout.max_multi_hot), fmt.PAD_ID, np.int64) for f in layout.multi_hot},
        }
        if layout.raw_ids:
            out["raw_cat"] = dict(out["cat"])
        return out

    return {
        "task_id": np.asarray([""] * n, dtype=object),
        "task_mask": np.zeros(n, np.float32),
        "support": one(layout.support),
        "query": one(layout.query),
    }


def take(block: Dict[str, object], index: Optional[np.ndarray]) -> Dict[str, object]:
    """Rows ``index`` of every array in a (nested) block; used to permute tasks within a block."""
    if index is None:
        return block
    return {k: take(v, index) if isinstance(v, dict) else v[index] for k, v in block.items()}
