"""What Meta-IO does to a sample before the model sees it, rebuilt in the graph with stock ops.

A client of the export sends what the input data has: real ids and the input's own dense
columns. Two data features change that on the way into the model, and an export that skipped
them would score differently from ``gmeta eval``:

* ``data.min_id_count`` (``metaio/rare_ids.py``): an id of a listed feature that is neither in
  the train split's frequent set nor ``PAD_ID`` is read as ``RARE_ID`` -- the row rare ids were
  trained with, not the zero row of an unknown id. The frequent set comes from
  ``rare_ids.frequent_ids``, the one owner of that rule.
* ``prepare.target_encoding`` (``data/target_encoding.py``): two dense features per encoded
  column, from the column's *real* id (before the rare-id remap) and the fitted train-split
  table, with the valid/test rule (full statistics, nothing left out; an unseen id gets sum 0,
  count 0, which the formula turns into mean 0 and log_count 0, as ``lookup`` does).

Every id set is a variable that fills a ``StaticHashTable`` when the model loads
(``static_table.IdsFromVariable``), so no id is a graph constant.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping

import numpy as np
import tensorflow as tf

from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError
from gmeta_tf.export.static_table import IdsFromVariable
from gmeta_tf.metaio.rare_ids import frequent_ids


class RareIds(tf.Module):
    """One feature's frequent ids; ``apply`` turns every other id except ``PAD_ID`` into ``RARE_ID``."""

    def __init__(self, feature: str, frequent: np.ndarray, k: int):
        super().__init__(name=None)
        self.feature, self.k = feature, int(k)
        self.frequent = int(np.size(frequent))
        # A hash table cannot be imported from no keys, and a k above every count leaves none
        # (the whole feature pooled): then it holds PAD_ID alone, which ``apply`` keeps anyway.
        keys = np.asarray(frequent, np.int64) if self.frequent else np.array([fmt.PAD_ID], np.int64)
        self.ids = tf.Variable(keys, trainable=False, name=f"{feature}_frequent_ids")
        self.index = tf.lookup.StaticHashTable(IdsFromVariable(self.ids), default_value=tf.constant(-1, tf.int64))

    def apply(self, ids: tf.Tensor) -> tf.Tensor:
        keep = (self.index.lookup(ids) >= 0) | tf.equal(ids, fmt.PAD_ID)
        return tf.where(keep, ids, tf.constant(fmt.RARE_ID, tf.int64))


class TargetEncoder(tf.Module):
    """One encoded column's fitted table; ``features`` gives ``[N, 2]`` (mean, log_count)."""

    def __init__(self, entry: dict, ids: np.ndarray, sums: np.ndarray, counts: np.ndarray):
        super().__init__(name=None)
        self.column: str = entry["column"]
        self.names: List[str] = list(entry["features"])
        self.prior, self.global_mean = float(entry["prior"]), float(entry["global_mean"])
        self.ids = tf.Variable(np.asarray(ids, np.int64), trainable=False, name=f"{self.column}_te_ids")
        # One extra 0 at the end: where an unseen id's sum and count are read.
        self.sums = tf.Variable(np.append(np.asarray(sums, np.float64), 0.0), trainable=False,
                                name=f"{self.column}_te_sums")
        self.counts = tf.Variable(np.append(np.asarray(counts, np.float64), 0.0), trainable=False,
                                  name=f"{self.column}_te_counts")
        self.index = tf.lookup.StaticHashTable(IdsFromVariable(self.ids),
                                               default_value=tf.constant(len(ids), tf.int64))

    def features(self, ids: tf.Tensor) -> tf.Tensor:
        """``target_encoding.TargetTable.features`` with nothing left out, in float64 as there."""
        row = self.index.lookup(ids)
        s, n = tf.gather(self.sums, row), tf.gather(self.counts, row)
        g, k = tf.constant(self.global_mean, tf.float64), tf.constant(self.prior, tf.float64)
        mean = (s + k * g) / (n + k) - g
        return tf.cast(tf.stack([mean, tf.math.log1p(n)], axis=-1), tf.float32)


def _read_te_table(path: str, entry: dict):
    file = os.path.join(path, entry["file"])
    try:
        with np.load(file) as z:
            return z["ids"], z["sums"], z["counts"]
    except (OSError, KeyError, ValueError) as e:
        raise DataError(f"{file}: cannot read the target encoding table of '{entry['column']}': {e}") from None


class InputTransforms(tf.Module):
    """The rare-id remaps and target encoders of one run, and the dense columns clients send."""

    def __init__(self, path: str, schema: dict, min_id_count: Mapping[str, int]):
        super().__init__(name="input_transforms")
        frequent = frequent_ids(path, schema, min_id_count) if min_id_count else {}
        self.rare: Dict[str, RareIds] = {f: RareIds(f, ids, min_id_count[f]) for f, ids in frequent.items()}
        self.encoders: List[TargetEncoder] = [TargetEncoder(e, *_read_te_table(path, e))
                                              for e in schema.get("target_encoding") or []]
        dense = [d["name"] for d in schema.get("dense") or []]
        computed = [n for e in self.encoders for n in e.names]
        missing = [n for n in computed if n not in dense]
        if missing:
            raise DataError(f"{path}: schema.json's target_encoding adds dense feature '{missing[0]}', "
                            "which its dense list lacks; prepare the data again")
        self.input_dense: List[str] = [n for n in dense if n not in computed]
        assembled = self.input_dense + computed
        order = [assembled.index(n) for n in dense]  # assembled columns → schema.json's dense order
        self.dense_order = None if order == list(range(len(order))) else tf.constant(order, tf.int32)

    @property
    def computed_dense(self) -> List[str]:
        return [n for e in self.encoders for n in e.names]

    def dense(self, input_dense: tf.Tensor, cat: Mapping[str, tf.Tensor]) -> tf.Tensor:
        """Raw dense ``[N, n_input_dense]`` and real categorical ids → every dense feature,
        unstandardised, in ``schema.json``'s order."""
        parts = [input_dense] + [e.features(cat[e.column]) for e in self.encoders]
        out = tf.concat(parts, axis=-1) if len(parts) > 1 else input_dense
        return out if self.dense_order is None else tf.gather(out, self.dense_order, axis=-1)

    def ids(self, feature: str, ids: tf.Tensor) -> tf.Tensor:
        """The ids the model's table is looked up with (``RARE_ID`` for rare ones)."""
        return self.rare[feature].apply(ids) if feature in self.rare else ids

    def describe(self) -> dict:
        return {
            "rare_ids": {f: {"min_id_count": r.k, "frequent_ids": r.frequent, "rare_id": fmt.RARE_ID}
                         for f, r in self.rare.items()},
            "dense_inputs": self.input_dense,
            "computed_dense": [{"features": e.names, "from": e.column, "rule": "target_encoding",
                                "prior": e.prior, "global_mean": e.global_mean, "ids": int(e.ids.shape[0])}
                               for e in self.encoders],
        }
