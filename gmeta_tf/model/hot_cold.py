"""A table whose hottest rows live in a worker-local variable: the same lookup, split underneath.

``HotColdTable`` wraps an ``EmbeddingTable`` and keeps its interface (``name``, ``dim``,
``variable``, ``shadow``, ``slot_variables``, ... are the wrapped table's), so the model, the
meta step, the checkpoint and the evaluation code do not know about the split. Only
``lookup_unique`` differs:

* ids found in the static id → slot map (``tf.lookup.StaticHashTable``, built once from the hot
  set) are gathered from ``values`` (a ``tf.Variable [K, dim]`` on this worker);
* every other real id goes to the PS in **one** lookup through the wrapped table's own
  ``lookup_unique`` (hazard 3 in docs/architecture.md: one shadow lookup per table per step);
* the two parts are stitched back into the order of the batch's unique ids, so callers get
  one ``UniqueLookup`` exactly as from the plain table, and gradients flow to the hot
  variable (as ``IndexedSlices`` on the touched slots) and to the shadow (cold rows).

With ``local_only`` (the hot set holds every id of the train split, see ``hot/select.py``) the
table never talks to the PS during training: no cold lookup, and the meta step leaves its
shadow out of the TFRA apply. An id outside the hot set then fails the step with an error
naming the table instead of being served a wrong row (it can only come from a profile of other
data).

Hot ids never reach the PS during training, so the PS copy of a hot row is stale until
``HotRows.write_back`` copies it there (checkpoint time).

With ``prefetch`` set (``hot/prefetch.py``, done by ``HotRows.attach``), a trainable lookup takes
its cold rows from the rows read one step ahead instead of a shadow lookup; the gradient then
flows to that buffer and ``HotRows.apply`` updates the cold rows too.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

import gmeta_tf  # noqa: F401
from gmeta_tf.model.tables import EmbeddingTable, UniqueLookup


class HotColdTable:
    def __init__(self, base: EmbeddingTable, hot_ids: np.ndarray, local_only: bool = False):
        self.base = base
        self.local_only = bool(local_only)
        self.hot_ids = np.asarray(hot_ids, np.int64)
        k = len(self.hot_ids)
        self.slot_of = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(self.hot_ids, tf.int64),
                                                tf.range(k, dtype=tf.int64)),
            default_value=-1)
        # Filled from the PS by ``HotRows.load`` before training; zeros until then.
        self.values = tf.Variable(tf.zeros([k, base.dim], tf.float32), name=f"hot-{base.name}")
        self.prefetch = None  # a hot.prefetch.ColdPrefetch once HotRows.attach gives it one

    def __getattr__(self, item):  # everything but the lookup is the wrapped table's
        return getattr(self.base, item)

    @property
    def num_hot(self) -> int:
        return len(self.hot_ids)

    def split(self, ids):
        """(unique ids, index, slot, cold / hot / pad positions among the unique ids)."""
        flat = tf.concat([tf.reshape(x, [-1]) for x in ids], axis=0)
        uniq, index = tf.unique(flat, out_idx=tf.int32)
        slot = self.slot_of.lookup(uniq)
        valid = uniq >= 0
        hot = slot >= 0
        cold_pos = tf.cast(tf.reshape(tf.where(valid & ~hot), [-1]), tf.int32)
        hot_pos = tf.cast(tf.reshape(tf.where(hot), [-1]), tf.int32)
        pad_pos = tf.cast(tf.reshape(tf.where(~valid), [-1]), tf.int32)
        return uniq, index, slot, cold_pos, hot_pos, pad_pos

    def cold_ids(self, ids) -> tf.Tensor:
        """The distinct cold ids of a batch, in the order ``lookup_unique`` looks them up."""
        uniq, _, _, cold_pos, _, _ = self.split(ids)
        return tf.gather(uniq, cold_pos)

    def lookup_unique(self, ids, trainable: bool = True) -> UniqueLookup:
        uniq, index, slot, cold_pos, hot_pos, pad_pos = self.split(ids)
        hot = slot >= 0
        if self.local_only:
            tf.debugging.assert_equal(
                tf.size(hot_pos) + tf.size(pad_pos), tf.size(uniq),
                message=f"hot table {self.base.name}: an id outside the hot set, which the id profile "
                        f"said holds every train id; re-run gmeta data profile on this data")
            rows = tf.gather(self.values, tf.maximum(slot, 0)) * tf.cast(hot, tf.float32)[:, None]
            return UniqueLookup(rows=rows, index=index)
        if trainable and self.prefetch is not None:
            cold_rows = self.prefetch.rows(tf.gather(uniq, cold_pos))
        else:
            cold = self.base.lookup_unique([tf.gather(uniq, cold_pos)], trainable=trainable)
            cold_rows = tf.gather(cold.rows, cold.index)
        hot_rows = tf.gather(self.values, tf.gather(slot, hot_pos))
        pad_rows = tf.zeros([tf.size(pad_pos), self.base.dim], tf.float32)
        rows = tf.dynamic_stitch([cold_pos, hot_pos, pad_pos], [cold_rows, hot_rows, pad_rows])
        return UniqueLookup(rows=tf.reshape(rows, [-1, self.base.dim]), index=index)

    def hot_mask(self, ids: tf.Tensor) -> tf.Tensor:
        """True where an id is served locally (for the benchmark's local-share figure)."""
        return self.slot_of.lookup(ids) >= 0
