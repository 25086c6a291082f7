"""Baselines a recommender engineer computes in five minutes, scored on the cold users of ``gmeta eval``.

A meta-learned model is only worth shipping if it beats these on the *same* users, support and
query sets, so ``evaluate`` hands this module exactly the (possibly truncated) support and query
samples the model saw. All statistics come from the training split only (every train task's
support and query samples): nothing of a cold user leaks in except its own support set, which the
model adapts on too.

Ratings: ``global_mean``; ``item_mean`` = (sum_i + k·g) / (n_i + k) with ``k`` =
``eval.baseline_shrinkage`` (a rare item stays near the global mean g; an unseen item gets g);
``item_mean_user_bias`` = item mean + b_u with b_u = sum over the support of (y − item mean) /
(n_support + k_user), ``k_user`` = ``eval.baseline_user_shrinkage``. Predictions are not clipped to
the rating scale, like the model's.

Clicks: ``global_ctr``, ``item_ctr`` (shrunk the same way) and ``item_ctr_user_bias``. The user
bias is the same shrunk mean residual r = sum(y − p_item) / (n_support + k_user), applied in
*logit* space: b_u = logit(p̄ + r) − logit(p̄), where p̄ is the mean item CTR over the support, and
the prediction is sigmoid(logit(p_item) + b_u). Why logit space: CTRs differ by orders of magnitude
between items, so adding r to every item's probability would push rare-click items below 0 (a
clipped, near-infinite log loss) while barely moving popular ones; a log-odds shift keeps every
prediction in (0, 1) and moves the user's support average exactly to its shrunk CTR p̄ + r.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import pyarrow.parquet as pq

from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError
from gmeta_tf.evaluation import segments

_EPS = 1e-6  # keeps logit() finite for a shrinkage of 0 and an all-click support


@dataclass(frozen=True)
class TaskItems:
    """One cold user's samples as the model saw them: support (items, labels) and query items."""

    support_items: np.ndarray
    support_labels: np.ndarray
    query_items: np.ndarray


@dataclass(frozen=True)
class FlatItems:
    """Many cold users' samples as the model saw them, as flat arrays with offsets
    (``segments.py``): support (items, labels) and query items. What ``gmeta eval`` streams:
    no object per user."""

    support_offsets: np.ndarray
    support_items: np.ndarray
    support_labels: np.ndarray
    query_offsets: np.ndarray
    query_items: np.ndarray

    @classmethod
    def from_tasks(cls, tasks: List[TaskItems]) -> "FlatItems":
        """The list form (one ``TaskItems`` per user) as flat arrays."""
        sup_items, sup_offsets = segments.flatten([t.support_items for t in tasks], np.int64)
        sup_labels, _ = segments.flatten([t.support_labels for t in tasks])
        q_items, q_offsets = segments.flatten([t.query_items for t in tasks], np.int64)
        return cls(sup_offsets, sup_items, sup_labels, q_offsets, q_items)


@dataclass(frozen=True)
class ItemStats:
    """Label sums and counts per item id over the training split (ids sorted, for searchsorted)."""

    global_mean: float
    samples: int
    ids: np.ndarray
    sums: np.ndarray
    counts: np.ndarray

    def item_means(self, items: np.ndarray, shrinkage: float) -> np.ndarray:
        """(sum + k·g) / (n + k) per item; an unseen item (n = 0) gets g."""
        items = np.asarray(items, dtype=np.int64)
        s = np.zeros(items.shape)
        n = np.zeros(items.shape)
        if self.ids.size:
            pos = np.minimum(np.searchsorted(self.ids, items), self.ids.size - 1)
            seen = self.ids[pos] == items
            s = np.where(seen, self.sums[pos], 0.0)
            n = np.where(seen, self.counts[pos], 0).astype(np.float64)
        denom = n + shrinkage
        return np.where(denom > 0, (s + shrinkage * self.global_mean) / np.where(denom > 0, denom, 1.0),
                        self.global_mean)


def item_feature(schema: dict, name: Optional[str], data_path: str) -> Optional[str]:
    """The categorical feature that names the item (``eval.item_feature``, else the first one).

    None when the data has no categorical feature and none was asked for: then only the global
    baseline is defined.
    """
    cats = [c["name"] for c in schema.get("categorical") or []]
    if name is None:
        return cats[0] if cats else None
    if name not in cats:
        raise DataError(
            f"config key 'eval.item_feature': {name!r} is not a categorical feature of "
            f"{os.path.join(data_path, fmt.SCHEMA_FILE)} (categorical features: {', '.join(cats) or 'none'})"
        )
    return name


STATS_BATCH_TASKS = 8192  # train tasks read at once: ~0.5M samples, ~20 MB of columns


class _IdSums:
    """Label sums and counts per id over batches that arrive one by one: each batch's own
    (ids, sums, counts), merged into one whenever the pending ones outgrow it (amortized
    n log n), so memory follows the distinct ids, never the samples read."""

    MERGE_AT = 1 << 20

    def __init__(self) -> None:
        self._parts: List[tuple] = []
        self._merged = self._pending = 0

    def add(self, ids: np.ndarray, labels: np.ndarray) -> None:
        u, inv = np.unique(ids, return_inverse=True)
        inv = inv.reshape(-1)
        self._parts.append((u, np.bincount(inv, weights=labels, minlength=u.size),
                            np.bincount(inv, minlength=u.size).astype(np.int64)))
        self._pending += u.size
        if self._pending > max(self._merged, self.MERGE_AT):
            self._merge()

    def _merge(self) -> None:
        if len(self._parts) > 1:
            u, inv = np.unique(np.concatenate([p[0] for p in self._parts]), return_inverse=True)
            inv = inv.reshape(-1)
            self._parts = [(u, np.bincount(inv, weights=np.concatenate([p[1] for p in self._parts]), minlength=u.size),
                            np.bincount(inv, weights=np.concatenate([p[2] for p in self._parts]),
                                        minlength=u.size).astype(np.int64))]
        self._merged = self._parts[0][0].size if self._parts else 0
        self._pending = 0

    def result(self) -> tuple:
        self._merge()
        return self._parts[0] if self._parts else (np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))


def _train_batches(f: str, cols: List[str]):
    """File ``f``'s ``cols``, ``STATS_BATCH_TASKS`` tasks at a time; a file that cannot be read,
    or lacks one of ``cols`` (which ``iter_batches`` would skip), is named."""
    def unreadable(why: str) -> DataError:
        return DataError(f"{f}: cannot read the train split's labels for the baselines: {why}")

    try:
        pf = pq.ParquetFile(f)
    except (OSError, ValueError) as e:
        raise unreadable(str(e).splitlines()[0]) from None
    missing = [c for c in cols if c not in pf.schema_arrow.names]
    if missing:
        raise unreadable(f"no column '{missing[0]}'")
    try:
        yield from pf.iter_batches(batch_size=STATS_BATCH_TASKS, columns=cols)
    except (OSError, ValueError) as e:
        raise unreadable(str(e).splitlines()[0]) from None


def train_item_stats(data_path: str, schema: dict, item: Optional[str]) -> ItemStats:
    """Label sums and counts per item over every support and query sample of the train split.

    Read in batches of tasks (``_IdSums``): at 100M rows the train split's label and item columns
    read a file at a time held ~1 GB at once, as long as the first users took to score."""
    from gmeta_tf.metaio.reader import split_files  # here: the rest of this module needs no TensorFlow

    per_item = _IdSums()
    total, n_total = 0.0, 0
    cols = [fmt.label_col(w) for w in fmt.SETS] + ([fmt.cat_col(w, item) for w in fmt.SETS] if item else [])
    for f in split_files(data_path, "train", schema):
        for b in _train_batches(f, cols):
            for w in fmt.SETS:
                y = np.asarray(b.column(fmt.label_col(w)).flatten().to_numpy(), dtype=np.float64)
                total += float(y.sum())
                n_total += y.size
                if item:
                    x = fmt.flat_ids(b.column(fmt.cat_col(w, item)))
                    if x.size != y.size:
                        raise DataError(f"{f}: column '{fmt.cat_col(w, item)}' has {x.size} ids but "
                                        f"'{fmt.label_col(w)}' has {y.size} labels")
                    per_item.add(x, y)
    if n_total == 0:
        raise DataError(f"{data_path}: the train split has no samples to compute the baselines from")
    return ItemStats(total / n_total, n_total, *per_item.result())


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def names(kind: str, with_items: bool = True) -> tuple:
    """The baselines ``predict`` returns, in order."""
    out = ("global_ctr", "item_ctr", "item_ctr_user_bias") if kind == "click" else \
        ("global_mean", "item_mean", "item_mean_user_bias")
    return out if with_items else out[:1]


def predict_flat(kind: str, stats: ItemStats, items: FlatItems, k_item: float, k_user: float,
                 with_items: bool = True) -> Dict[str, np.ndarray]:
    """Query predictions of every baseline for all users at once: one flat array per baseline,
    aligned with ``items.query_items`` (segments ``items.query_offsets``)."""
    q = np.asarray(items.query_items, np.int64)
    out: Dict[str, np.ndarray] = {}
    which = names(kind, with_items)
    out[which[0]] = np.full(q.shape, stats.global_mean, dtype=np.float64)
    if not with_items:
        return out
    item = stats.item_means(q, k_item)
    out[which[1]] = item
    # the user's residual: sum over the support of (y − item baseline) / (n_support + k_user); 0
    # without support (or when n_support + k_user is 0)
    sup_offsets = items.support_offsets
    n = segments.counts(sup_offsets).astype(np.float64)
    sup_ids = segments.segment_ids(sup_offsets)
    base = stats.item_means(items.support_items, k_item)
    resid = segments.segment_sum(np.asarray(items.support_labels, np.float64) - base, sup_offsets, sup_ids)
    ok = n + k_user > 0
    r = np.zeros(n.size)
    r[ok] = resid[ok] / (n[ok] + k_user)
    q_user = segments.segment_ids(items.query_offsets)
    if kind == "click":
        shift = np.zeros(n.size)
        has = n > 0  # move the support's mean item CTR p̄ to p̄ + r
        p_bar = segments.segment_sum(base, sup_offsets, sup_ids)[has] / n[has]
        shift[has] = _logit(p_bar + r[has]) - _logit(p_bar)
        out[which[2]] = 1.0 / (1.0 + np.exp(-(_logit(item) + shift[q_user])))
    else:
        out[which[2]] = item + r[q_user]
    return out


def predict(kind: str, stats: ItemStats, tasks: List[TaskItems], k_item: float, k_user: float,
            with_items: bool = True) -> Dict[str, List[np.ndarray]]:
    """Query predictions of every baseline, per task (the order of ``tasks``): ``predict_flat``
    on the list form."""
    flat = FlatItems.from_tasks(tasks)
    preds = predict_flat(kind, stats, flat, k_item, k_user, with_items)
    return {name: segments.split(p, flat.query_offsets) for name, p in preds.items()}
