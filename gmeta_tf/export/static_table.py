"""One embedding table in stock TensorFlow: a ``StaticHashTable`` from id to row, and the rows.

TFRA's own SavedModel needs TFRA's kernels to load (``TFRA>CuckooHashTable*`` ops), which stock
TensorFlow and TF Serving do not have. A trained table is frozen, so a static hash table
(``HashTableV2``) from id to row number plus a dense ``[rows + 1, dim]`` variable does the same
lookup with stock ops. The ids are a *variable* that initialises the hash table when the model
loads, so they are stored with the weights (``variables/``) and never in the graph protobuf,
which is capped at 2 GiB.

**Unknown ids.** An id the table does not hold, and a pad id (< 0), map to the last row, which
is all zeros: what ``gmeta eval`` scores an unseen id with (its lookups are read-only and give
zeros for missing ids). A multi-hot feature mean-pools its valid ids (>= 0), unseen ones
included as zeros, exactly as in training and evaluation (``sparse_features.SparseState``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.ops.lookup_ops import TableInitializerBase

from gmeta_tf.embedding.table import UniqueLookup


class IdsFromVariable(TableInitializerBase):
    """Fill a hash table with ``ids[i] -> i`` from a variable, when the table is initialised
    (after the variables are restored on load), so the ids are not graph constants."""

    def __init__(self, ids: tf.Variable):
        self._ids = ids  # tracked: saved with the weights
        super().__init__(tf.int64, tf.int64)

    def initialize(self, table):
        ids = self._ids.read_value()
        return tf.raw_ops.LookupTableImportV2(table_handle=table.resource_handle, keys=ids,
                                              values=tf.range(tf.size(ids, out_type=tf.int64)))


class StaticTable(tf.Module):
    """What the model reads of a table (``name``, ``dim``, ``lookup_unique``) over frozen rows."""

    def __init__(self, name: str, ids: np.ndarray, rows: np.ndarray):
        super().__init__(name=None)
        self.table_name = name
        self.dim = int(rows.shape[1])
        n = len(ids)
        self.ids = tf.Variable(ids.astype(np.int64), trainable=False, name=f"{name}_ids")
        # The appended zero row is where unknown and pad ids land.
        self.rows = tf.Variable(np.concatenate([rows, np.zeros((1, self.dim), np.float32)]),
                                trainable=False, name=f"{name}_rows")
        self.index = tf.lookup.StaticHashTable(IdsFromVariable(self.ids), default_value=tf.constant(n, tf.int64))

    @property
    def name(self) -> str:  # the feature's name, as the model's tables have it
        return self.table_name

    def lookup_unique(self, ids: Sequence[tf.Tensor], trainable: bool = False) -> UniqueLookup:
        """Rows of the de-duplicated ids of ``ids`` (any shapes, flattened in order), as
        ``EmbeddingTable.lookup_unique`` returns them; always read-only."""
        flat = tf.concat([tf.reshape(x, [-1]) for x in ids], axis=0)
        uniq, index = tf.unique(flat, out_idx=tf.int32)
        return UniqueLookup(rows=tf.gather(self.rows, self.index.lookup(uniq)), index=index)
