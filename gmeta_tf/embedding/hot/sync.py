"""Hot-row gradients: aggregated over all ranks every step, so every replica applies the same update.

Each rank's gradient for a hot table is an ``IndexedSlices`` over the slots its batch touched
(at most ``U = T·(S+Q)·ids per sample`` rows, usually far fewer than the ``K`` hot rows). Two
ways to combine them, chosen **per table, once, from the sizes** (every rank computes the same
choice from the same config, so the collective calls match):

* **dense all-reduce** of a ``[K, dim + 1]`` tensor (the scattered gradient plus a "touched"
  column): a ring all-reduce moves about ``2·(N-1)/N · K·(dim+1)·4`` bytes per rank whatever
  the batch. Cheap when the table's hot set is small (device, hour, segment, city, category).
* **sparse all-gather** of the touched slots and their gradient rows: about
  ``(N-1) · U·(dim + 1)·4`` bytes per rank. Cheap when ``K`` is much larger than what one step
  touches (item ids, tags): a dense all-reduce of a 100k-row table would move megabytes per
  step for a few hundred touched rows.

The result is the same either way: the touched slots (union over ranks, in a rank-independent
order) and the *mean* gradient over ranks, like the dense weights (``dense_sync``). Rows a rank
did not touch count as a zero gradient in the mean, as they do for a dense weight. The slots
come out unique, so the lazy optimizer (``embedding/optimizers.py``) scatters without collisions.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import tensorflow as tf


def dense_cost(k: int, dim: int, n: int) -> float:
    return 2.0 * (n - 1) / n * k * (dim + 1) * 4


def sparse_cost(touched_bound: int, dim: int, n: int) -> float:
    return float((n - 1) * touched_bound * (dim + 1) * 4)


def choose_mode(k: int, dim: int, touched_bound: int, n: int) -> str:
    if n <= 1:
        return "local"
    bound = min(k, touched_bound)
    return "dense" if dense_cost(k, dim, n) <= sparse_cost(bound, dim, n) else "sparse"


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

    def __init__(self, sync, sizes: Dict[str, int], dim: Dict[str, int], touched_bound: Dict[str, int]):
        self.sync = sync
        self.size = int(sync.size)
        self.sizes = sizes
        self.modes = {t: choose_mode(sizes[t], dim[t], touched_bound[t], self.size) for t in sizes}
        for t, k in sizes.items():  # slots travel as float32 in the sparse exchange
            if k >= 1 << 24 and self.modes[t] == "sparse":
                self.modes[t] = "dense"

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
            # One [U, dim + 1] tensor per table (the slot rides along as a float: exact below
            # 2^24 rows, checked in __init__), all tables in one grouped all-gather: one
            # negotiation round per step however many tables, which matters on busy hosts.
            packed = [tf.concat([local[i][1], tf.cast(local[i][0], tf.float32)[:, None]], 1) for i in sparse_i]
            for i, full in zip(sparse_i, self.sync.allgather_group(packed)):
                all_slots = tf.cast(full[:, -1], tf.int64)
                uniq, pos = tf.unique(all_slots)  # first appearance in rank order: same everywhere
                summed = tf.math.unsorted_segment_sum(full[:, :-1], pos, tf.size(uniq))
                out[i] = (uniq, summed / float(self.size))
        for i, t in enumerate(names):
            if self.modes[t] == "local":
                out[i] = local[i]
        return out
