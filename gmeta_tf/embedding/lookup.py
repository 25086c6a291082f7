"""From a task batch's ids to per-sample embedding tensors, with one table lookup per step.

``lookup_batch`` looks every table up once for support *and* query ids together (TFRA's shadow
variable remembers only its last lookup, see ``table.py``), and returns ``SparseState``: per
feature, a matrix of rows plus the index of every support / query position into it.

When the inner loop adapts embeddings, each task needs its *own* copy of each row it touches:
``per_task=True`` re-keys rows by (task, id), so the summed support loss has a separate
gradient for every task's copy of a row, and a task's adapted row is used by that task's query
only. Rows a task touches only in its query get no support gradient and stay as looked up.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from gmeta_tf.embedding.fused import looked_up_together
from gmeta_tf.embedding.hot_cold import HotColdTable
from gmeta_tf.embedding.ps_requests import PsRequests
from gmeta_tf.embedding.table import Table, UniqueIds, UniqueLookup
from gmeta_tf.embedding.tfra import de


@dataclass
class FeatureRows:
    rows: tf.Tensor  # [R, D] (R = unique ids, or unique (task, id) pairs)
    support_pos: tf.Tensor  # int32 [T, S] or [T, S, L]
    query_pos: tf.Tensor  # int32 [T, Q] or [T, Q, L]
    support_valid: tf.Tensor  # float32, same shape as support_pos
    query_valid: tf.Tensor
    multi: bool
    # ``hot_apart`` lookups: the hot slot of each of the batch's unique ids (-1: not hot; a hot
    # slot appears once), ``rows`` zero at the hot rows; with ``per_task``, ``hot_source`` is
    # the unique id each row is a task's copy of (None: row i is unique id i). Kept per unique id
    # so the compiled step sums a slot's gradient over bounded rows, never over the whole table.
    hot_slot: Optional[tf.Tensor] = None  # int32 [U]
    hot_source: Optional[tf.Tensor] = None  # int32 [R]


@dataclass
class SparseState:
    features: List[FeatureRows]

    def rows(self) -> List[tf.Tensor]:
        return [f.rows for f in self.features]

    def with_rows(self, rows: Sequence[tf.Tensor]) -> "SparseState":
        return SparseState([replace(f, rows=r) for f, r in zip(self.features, rows)])

    def embed(self, which: str) -> tf.Tensor:
        """``[T, N, F, D]`` embeddings of the support or query samples (multi-hot mean-pooled)."""
        out = []
        for f in self.features:
            pos = f.support_pos if which == "support" else f.query_pos
            valid = f.support_valid if which == "support" else f.query_valid
            e = tf.gather(f.rows, pos) * valid[..., None]
            if f.multi:
                count = tf.maximum(tf.reduce_sum(valid, axis=-1, keepdims=True), 1.0)
                e = tf.reduce_sum(e, axis=-2) / count
            out.append(e)
        return tf.stack(out, axis=2)


def feature_ids(batch: dict, cat_names: Sequence[str], multi_names: Sequence[str]):
    """``[(support_ids, query_ids, is_multi)]`` in table order: categorical, then multi-hot."""
    out = [(batch["support"]["cat"][n], batch["query"]["cat"][n], False) for n in cat_names]
    out += [(batch["support"]["multi"][n], batch["query"]["multi"][n], True) for n in multi_names]
    return out


def lookup_batch(tables: Sequence[Table], batch: dict, cat_names: Sequence[str],
                 multi_names: Sequence[str], *, trainable: bool, per_task: bool,
                 requests: Optional[PsRequests] = None, hot_apart: bool = False) -> SparseState:
    """``requests`` (``model.ps_requests: per_ps``) looks up the tables it takes in one request
    per PS; the members of a fused table are looked up together (``together``); every other
    table looks itself up. ``hot_apart``: hot/cold tables leave their hot rows to the caller
    (``FeatureRows.hot_slot``; ``hot_cold.py``)."""
    ids = feature_ids(batch, cat_names, multi_names)
    train = trainable and de.ModelMode.CURRENT_SETTING == de.ModelMode.TRAIN
    looked = together(tables, [x[:2] for x in ids], trainable, requests if train else None, hot_apart)
    feats = []
    for i, (table, (s_ids, q_ids, multi)) in enumerate(zip(tables, ids)):
        if i in looked:
            got = looked[i]
        elif hot_apart and isinstance(table, HotColdTable):
            got = table.lookup_unique([s_ids, q_ids], trainable=trainable, hot_apart=True)
        else:
            got = table.lookup_unique([s_ids, q_ids], trainable=trainable)
        rows, index, slot, source = got.rows, got.index, got.hot_slot, None
        n_s = tf.size(s_ids)
        if per_task:
            t = tf.shape(s_ids)[0]
            task_s = tf.reshape(tf.broadcast_to(_task_axis(s_ids, t), tf.shape(s_ids)), [-1])
            task_q = tf.reshape(tf.broadcast_to(_task_axis(q_ids, t), tf.shape(q_ids)), [-1])
            tasks = tf.concat([task_s, task_q], axis=0)
            n_rows = tf.cast(tf.shape(rows)[0], tf.int64)
            key = tf.cast(tasks, tf.int64) * n_rows + tf.cast(index, tf.int64)
            keys, index = tf.unique(key, out_idx=tf.int32)
            rows = tf.gather(rows, keys % n_rows)
            source = None if slot is None else tf.cast(keys % n_rows, tf.int32)
        feats.append(FeatureRows(
            rows=rows,
            support_pos=tf.reshape(index[:n_s], tf.shape(s_ids)),
            query_pos=tf.reshape(index[n_s:], tf.shape(q_ids)),
            support_valid=tf.cast(s_ids >= 0, tf.float32),
            query_valid=tf.cast(q_ids >= 0, tf.float32),
            multi=multi,
            hot_slot=slot,
            hot_source=source,
        ))
    return SparseState(feats)


def together(tables: Sequence[Table], ids: Sequence[Sequence[tf.Tensor]], trainable: bool,
             requests: Optional[PsRequests] = None, hot_apart: bool = False) -> Dict[int, UniqueLookup]:
    """The lookups made together, by table index: every member of a fused table (one find and
    one shadow per fused table, ``EmbeddingTable.lookup_parts``) and, with ``requests``, every
    table it takes (one request per PS). A hot/cold table joins with its cold ids (hot rows stay
    local), unless it has no PS work or its cold rows were read ahead."""
    parts = []  # (table index, table, rows owner, unique ids or hot split, the ids to read)
    for i, t in enumerate(tables):
        hot = isinstance(t, HotColdTable)
        owner = t.base if hot else t
        if not (looked_up_together(owner) or (requests is not None and requests.takes(owner))):
            continue
        if hot and not t.cold_together(trainable):
            continue
        plan = t.split(ids[i]) if hot else UniqueIds.of(ids[i])
        parts.append((i, t, owner, plan, plan.cold if hot else plan.real))
    rows = _rows(parts, trainable, requests)
    return {i: t.join(plan, r, hot_apart) if isinstance(t, HotColdTable) else plan.lookup(r, t.dim)
            for (i, t, _, plan, _), r in zip(parts, rows)}


def _rows(parts, trainable: bool, requests: Optional[PsRequests]) -> List[tf.Tensor]:
    out: List[Optional[tf.Tensor]] = [None] * len(parts)
    sent = [k for k, p in enumerate(parts) if requests is not None and requests.takes(p[2])]
    if sent:
        for k, r in zip(sent, requests.find([parts[k][2] for k in sent], [parts[k][4] for k in sent])):
            out[k] = r
    by_storage: Dict[int, List[int]] = {}  # the parts held in one TFRA table, looked up at once
    for k, p in enumerate(parts):
        if out[k] is None:
            by_storage.setdefault(id(p[2].storage()[0]), []).append(k)
    for ks in by_storage.values():
        storage = parts[ks[0]][2].storage()[0]
        for k, r in zip(ks, storage.lookup_parts([(parts[k][2], parts[k][4]) for k in ks], trainable)):
            out[k] = r
    return out


def _task_axis(ids: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
    shape = [-1] + [1] * (ids.shape.rank - 1)
    return tf.reshape(tf.range(t, dtype=tf.int32), shape)
