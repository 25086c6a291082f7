"""Hot-row gradients: aggregated over all ranks every step, so every replica applies the same update.

(With ``model.hot_sync_every: k > 1`` the same exchange carries a window's accumulated
gradients once every k steps instead, sized by the rows a window touches: ``hot/stale.py``.)

Each rank's gradient for a hot table is an ``IndexedSlices`` over the slots its batch touched
(at most ``U = T·(S+Q)·ids per sample`` rows, usually far fewer than the ``K`` hot rows). Two
ways to combine them, chosen **per table, once, from the bytes each would move** (every rank
computes the same choice from the same config and profile, so the collective calls match),
``b`` bytes a value on the wire (4; 2 with ``cluster.wire_dtype: bfloat16``):

* **dense all-reduce** of a ``[K, dim + 1]`` tensor (the scattered gradient plus a "touched"
  column): a ring all-reduce moves about ``2·(N-1)/N · K·(dim+1)·b`` bytes per rank whatever
  the batch.
* **sparse all-gather** of the touched slots and their gradient rows: about
  ``(N-1) · U·(dim·b + 4)`` bytes per rank (the slot rides as 4 bytes, ``wire.pack``). Cheap
  when ``K`` is much larger than what one step touches (item ids, tags): a dense all-reduce of
  a 100k-row table would move megabytes per step for a few hundred touched rows.

``U`` is the number of distinct hot rows a step is *expected* to touch under the id profile
(``auto.hot_touched``, the figure the split's cost model uses), not the most it could touch:
with the bound (``samples x ids per sample``, at least ``K`` for a small table) a small table
always looked as dear to gather as to all-reduce, and went dense even where a step touches a
few of its rows.

The result is the same either way: the touched slots (union over ranks, in a rank-independent
order) and the *mean* gradient over ranks, like the dense weights (``dense_sync``). Rows a rank
did not touch count as a zero gradient in the mean, as they do for a dense weight. The slots
come out unique, so the lazy optimizer (``embedding/optimizers.py``) scatters without collisions.
Gradient values cross in the wire dtype (the dense all-reduce through ``sync.allreduce``, the
gather packed by ``wire.pack``); the slots cross exact.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import tensorflow as tf

from gmeta_tf.embedding.wire import ID_BYTES


def dense_cost(k: int, dim: int, n: int, value_bytes: int = 4) -> float:
    return 2.0 * (n - 1) / n * k * (dim + 1) * value_bytes


def sparse_cost(touched: float, dim: int, n: int, value_bytes: int = 4) -> float:
    return float((n - 1) * touched * (dim * value_bytes + ID_BYTES))


def choose_mode(k: int, dim: int, touched: float, n: int, value_bytes: int = 4) -> str:
    """``touched``: the distinct rows of the table one step is expected to touch (at most ``k``)."""
    if n <= 1:
        return "local"
    u = min(k, touched)
    return "dense" if dense_cost(k, dim, n, value_bytes) <= sparse_cost(u, dim, n, value_bytes) else "sparse"


def touched_slots(grad, k: int) -> Tuple[tf.Tensor, tf.Tensor]:
    """(slots int64 [U], rows [U, dim]) of one rank's gradient, de-duplicated."""
    if isinstance(grad, tf.IndexedSlices):
        idx, vals = tf.cast(grad.indices, tf.int64), grad.values
    else:  # a dense gradient (only when the table was not looked up: all zeros)
        idx = tf.reshape(tf.where(tf.reduce_any(tf.not_equal(grad, 0.0), axis=1)), [-1])
        vals = tf.gather(grad, idx)
    uniq, pos = tf.unique(idx)
    return uniq, tf.math.unsorted_segment_sum(vals, pos, tf.size(uniq))


class HotGradSync:
    """Turns per-rank hot-row gradients into identical (slots, mean gradient) on every rank."""

    def __init__(self, sync, sizes: Dict[str, int], dim: Dict[str, int], touched: Dict[str, float]):
        """``touched``: the distinct hot rows of each table one step is expected to touch."""
        self.sync = sync
        self.size = int(sync.size)
        self.sizes = sizes
        self.dims = dim
        self.wire = sync.wire
        self.modes = {t: choose_mode(sizes[t], dim[t], touched[t], self.size, self.wire.value_bytes) for t in sizes}

    def aggregate(self, names: List[str], grads: List) -> List[Tuple[tf.Tensor, tf.Tensor]]:
        local = [touched_slots(g, self.sizes[t]) for t, g in zip(names, grads)]
        out: List = [None] * len(names)
        dense_i = [i for i, t in enumerate(names) if self.modes[t] == "dense"]
        if dense_i:
            packed = []
            for i in dense_i:
                slots, rows = local[i]
                k = self.sizes[names[i]]
                full = tf.scatter_nd(slots[:, None], tf.concat([rows, tf.ones_like(rows[:, :1])], 1),
                                     [k, rows.shape[-1] + 1])
                packed.append(full)
            reduced = self.sync.allreduce(packed)  # mean over ranks
            for i, full in zip(dense_i, reduced):
                slots = tf.reshape(tf.where(full[:, -1] > 0.0), [-1])
                out[i] = (slots, tf.gather(full[:, :-1], slots))
        sparse_i = [i for i, t in enumerate(names) if self.modes[t] == "sparse"]
        if sparse_i:
            # One tensor per table (each row with its slot, ``wire.pack``), all tables in one
            # grouped all-gather: one negotiation round per step however many tables, which
            # matters on busy hosts.
            packed = [self.wire.pack(local[i][1], local[i][0]) for i in sparse_i]
            for i, full in zip(sparse_i, self.sync.allgather_group(packed)):
                rows, all_slots = self.wire.unpack(full, self.dims[names[i]])
                uniq, pos = tf.unique(tf.cast(all_slots, tf.int64))  # first appearance in rank order: same everywhere
                summed = tf.math.unsorted_segment_sum(rows, pos, tf.size(uniq))
                out[i] = (uniq, summed / float(self.size))
        for i, t in enumerate(names):
            if self.modes[t] == "local":
                out[i] = local[i]
        return out
