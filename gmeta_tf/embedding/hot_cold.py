"""A table whose hottest rows live in a worker-local variable: the same lookup, split underneath.

``HotColdTable`` holds an ``EmbeddingTable`` (``base``, the canonical PS table) and offers the
``Table`` surface of ``table.py`` (``name``, ``dim``, ``lookup_unique``, ``size``, ``storage``:
the base table, which optimizers train and checkpoints save), so the model and the meta step do
not know about the split. Nothing else is forwarded: the hot tier (``hot/rows.py``) reaches the
base table's variable and slots as ``table.base``. The lookup:

* ids found in the static id → slot map (``tf.lookup.StaticHashTable``, built once from the hot
  set) are gathered from ``values`` (a ``tf.Variable [K, dim]`` on this worker);
* every other real id goes to the PS in **one** lookup through the wrapped table's own
  ``lookup_unique`` (hazard 3 in docs/architecture.md: one shadow lookup per table per step);
* the two parts are stitched back into the order of the batch's unique ids, so callers get
  one ``UniqueLookup`` exactly as from the plain table, and gradients flow to the hot
  variable (as ``IndexedSlices`` on the touched slots) and to the shadow (cold rows).

With ``local_only`` (the hot set holds every id of the train split, see ``hot/select.py``) the
table never talks to the PS during training: no cold lookup, and the meta step leaves its
shadow out of the TFRA apply. An id outside the hot set in a *trainable* lookup then fails the
step with an error naming the table instead of being served a wrong row (it can only come from
a profile of other data): an initial row would score, but its gradient would have nowhere to go
(no TFRA apply, no hot slot), so the id would silently never train where the PS path trains it.
The step's graph records how many such ids it met (``misses``) before it fails, so the
embedding package turns the failure into a typed ``HotSetMissError`` naming the table
(``collection.Embeddings.step_errors``) without reading TensorFlow's error text.

A *read-only* lookup (validation, which scores new users, the point of cold start) meets ids
outside the train split by design. It reads them from the PS exactly like a table that is not
local-only: hot ids from ``values``, the others through the base table's read-only lookup, which
gives the PS row where the table holds one (a warm start's) and zeros otherwise, never drawing
or inserting a row. So validation scores what ``gmeta eval`` and an export score on the
checkpoint's PS tables, which have no hot tier. The one PS find per table and validation batch
is the price; training steps still send nothing.

Hot ids never reach the PS during training, so the PS copy of a hot row is stale until
``HotRows.write_back`` copies it there (checkpoint time).

With ``prefetch`` set (``hot/prefetch.py``, done by ``HotRows.attach``), a trainable lookup takes
its cold rows from the rows read one step ahead instead of a shadow lookup; the gradient then
flows to that buffer and ``HotRows.apply`` updates the cold rows too.

``hot_apart`` (``meta.hot_in_program``): the lookup leaves the hot rows out (zeros in their
place) and gives each row's hot slot instead, so the compiled step can gather them from
``values`` itself, differentiate them and apply their optimizer in the same XLA program; the
cold rows and the PS work stay here, outside it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import tensorflow as tf

from gmeta_tf.embedding.table import EmbeddingTable, UniqueLookup

MISS_TEXT = ("an id outside the hot set, which the id profile said holds every train id; "
             "re-run gmeta data profile on this data")


@dataclass
class HotSplit:
    """A batch's unique ids (``index``: each input position's), their hot ``slot`` (-1: cold or
    the pad), and the positions among them of the cold, hot and pad ids."""

    uniq: tf.Tensor
    index: tf.Tensor
    slot: tf.Tensor
    cold_pos: tf.Tensor
    hot_pos: tf.Tensor
    pad_pos: tf.Tensor

    @property
    def cold(self) -> tf.Tensor:
        """The distinct cold ids: what the PS serves."""
        return tf.gather(self.uniq, self.cold_pos)


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
        # Ids outside the hot set met by the last local-only lookup (0 unless a step failed).
        self.misses = tf.Variable(tf.zeros([], tf.int64), trainable=False, name=f"hot-{base.name}-misses")

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def dim(self) -> int:
        return self.base.dim

    def size(self) -> int:
        return self.base.size()

    def storage(self) -> List[EmbeddingTable]:
        return self.base.storage()

    @property
    def num_hot(self) -> int:
        return len(self.hot_ids)

    def split(self, ids) -> "HotSplit":
        """The batch's unique ids, each one's hot slot, and which are cold, hot or the pad."""
        flat = tf.concat([tf.reshape(x, [-1]) for x in ids], axis=0)
        uniq, index = tf.unique(flat, out_idx=tf.int32)
        slot = self.slot_of.lookup(uniq)
        valid = uniq >= 0
        hot = slot >= 0
        cold_pos = tf.cast(tf.reshape(tf.where(valid & ~hot), [-1]), tf.int32)
        hot_pos = tf.cast(tf.reshape(tf.where(hot), [-1]), tf.int32)
        pad_pos = tf.cast(tf.reshape(tf.where(~valid), [-1]), tf.int32)
        return HotSplit(uniq, index, slot, cold_pos, hot_pos, pad_pos)

    def cold_ids(self, ids) -> tf.Tensor:
        """The distinct cold ids of a batch, in the order ``lookup_unique`` looks them up."""
        return self.split(ids).cold

    def cold_together(self, trainable: bool) -> bool:
        """Whether this table's cold rows can be read with other tables' rows (its base's
        fused table, a PS request: ``lookup.lookup_batch``): not when every train id is hot and
        the lookup trains (no PS work), nor when the cold rows of a trainable lookup were read
        ahead (``prefetch``). A read-only lookup of a local-only table reads its cold ids (new
        users' ids) like any other hot/cold table's."""
        if trainable:
            return not self.local_only and self.prefetch is None
        return True

    def lookup_unique(self, ids, trainable: bool = True, hot_apart: bool = False) -> UniqueLookup:
        """``hot_apart``: zeros in place of the hot rows, and ``hot_slot`` set (module doc)."""
        split = self.split(ids)
        if self.local_only and trainable:
            hot = split.slot >= 0
            served = tf.size(split.hot_pos) + tf.size(split.pad_pos)
            record = self.misses.assign(tf.cast(tf.size(split.uniq) - served, tf.int64))
            with tf.control_dependencies([record]):
                check = tf.debugging.assert_equal(served, tf.size(split.uniq),
                                                  message=f"hot table {self.base.name}: {MISS_TEXT}")
            if hot_apart:
                with tf.control_dependencies([check]):
                    slot = tf.identity(tf.cast(split.slot, tf.int32))
                return UniqueLookup(rows=tf.zeros([tf.size(split.uniq), self.base.dim], tf.float32),
                                    index=split.index, hot_slot=slot)
            rows = tf.gather(self.values, tf.maximum(split.slot, 0)) * tf.cast(hot, tf.float32)[:, None]
            return UniqueLookup(rows=rows, index=split.index)
        if trainable and self.prefetch is not None:
            cold_rows = self.prefetch.rows(split.cold)
        else:
            cold = self.base.lookup_unique([split.cold], trainable=trainable)
            cold_rows = tf.gather(cold.rows, cold.index)
        return self.join(split, cold_rows, hot_apart)

    def join(self, split: "HotSplit", cold_rows: tf.Tensor, hot_apart: bool = False) -> UniqueLookup:
        """The batch's rows: ``cold_rows`` (one per ``split.cold`` id), the hot rows (zeros, and
        each row's slot in ``hot_slot``, with ``hot_apart``), the pad."""
        n_hot = tf.size(split.hot_pos)
        if hot_apart:
            hot_rows = tf.zeros([n_hot, self.base.dim], tf.float32)
        else:
            hot_rows = tf.gather(self.values, tf.gather(split.slot, split.hot_pos))
        pad_rows = tf.zeros([tf.size(split.pad_pos), self.base.dim], tf.float32)
        rows = tf.dynamic_stitch([split.cold_pos, split.hot_pos, split.pad_pos], [cold_rows, hot_rows, pad_rows])
        slot = tf.cast(split.slot, tf.int32) if hot_apart else None  # -1 for the cold ids and the pad
        return UniqueLookup(rows=tf.reshape(rows, [-1, self.base.dim]), index=split.index, hot_slot=slot)

    def hot_mask(self, ids: tf.Tensor) -> tf.Tensor:
        """True where an id is served locally (for the benchmark's local-share figure)."""
        return self.slot_of.lookup(ids) >= 0
