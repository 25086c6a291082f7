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
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError
from gmeta_tf.metaio.reader import split_files

_EPS = 1e-6  # keeps logit() finite for a shrinkage of 0 and an all-click support


@dataclass(frozen=True)
class TaskItems:
    """One cold user's samples as the model saw them: support (items, labels) and query items."""

    support_items: np.ndarray
    support_labels: np.ndarray
    query_items: np.ndarray


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


def train_item_stats(data_path: str, schema: dict, item: Optional[str]) -> ItemStats:
    """Label sums and counts per item over every support and query sample of the train split."""
    ids, sums, counts = [], [], []
    total, n_total = 0.0, 0
    for f in split_files(data_path, "train", schema):
        cols = [fmt.label_col(w) for w in fmt.SETS] + ([fmt.cat_col(w, item) for w in fmt.SETS] if item else [])
        try:
            t = pq.read_table(f, columns=cols)
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"{f}: cannot read the train split's labels for the baselines: {str(e).splitlines()[0]}") from None
        for w in fmt.SETS:
            y = np.asarray(pc.list_flatten(t[fmt.label_col(w)]).to_numpy(), dtype=np.float64)
            total += float(y.sum())
            n_total += y.size
            if item:
                x = fmt.flat_ids(t[fmt.cat_col(w, item)].combine_chunks())
                if x.size != y.size:
                    raise DataError(f"{f}: column '{fmt.cat_col(w, item)}' has {x.size} ids but "
                                    f"'{fmt.label_col(w)}' has {y.size} labels")
                u, inv = np.unique(x, return_inverse=True)
                ids.append(u)
                sums.append(np.bincount(inv.reshape(-1), weights=y, minlength=u.size))
                counts.append(np.bincount(inv.reshape(-1), minlength=u.size))
    if n_total == 0:
        raise DataError(f"{data_path}: the train split has no samples to compute the baselines from")
    if ids:
        u, inv = np.unique(np.concatenate(ids), return_inverse=True)
        inv = inv.reshape(-1)
        merged = (u, np.bincount(inv, weights=np.concatenate(sums), minlength=u.size),
                  np.bincount(inv, weights=np.concatenate(counts), minlength=u.size).astype(np.int64))
    else:
        merged = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))
    return ItemStats(total / n_total, n_total, *merged)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def _user_residual(stats: ItemStats, task: TaskItems, k_item: float, k_user: float) -> float:
    """sum over the support of (y − item baseline) / (n_support + k_user); 0 without support."""
    n = task.support_labels.size
    if n + k_user <= 0:
        return 0.0
    base = stats.item_means(task.support_items, k_item)
    return float(np.sum(task.support_labels - base) / (n + k_user))


def predict(kind: str, stats: ItemStats, tasks: List[TaskItems], k_item: float, k_user: float,
            with_items: bool = True) -> Dict[str, List[np.ndarray]]:
    """Query predictions of every baseline, per task (the order of ``tasks``)."""
    names = ("global_ctr", "item_ctr", "item_ctr_user_bias") if kind == "click" else \
        ("global_mean", "item_mean", "item_mean_user_bias")
    out: Dict[str, List[np.ndarray]] = {n: [] for n in (names if with_items else names[:1])}
    for task in tasks:
        q = task.query_items
        out[names[0]].append(np.full(q.shape, stats.global_mean, dtype=np.float64))
        if not with_items:
            continue
        item = stats.item_means(q, k_item)
        out[names[1]].append(item)
        r = _user_residual(stats, task, k_item, k_user)
        if kind == "click":
            shift = 0.0
            if task.support_items.size:  # move the support's mean item CTR p̄ to p̄ + r
                p_bar = float(np.mean(stats.item_means(task.support_items, k_item)))
                shift = float(_logit(np.asarray(p_bar + r)) - _logit(np.asarray(p_bar)))
            out[names[2]].append(1.0 / (1.0 + np.exp(-(_logit(item) + shift))))
        else:
            out[names[2]].append(item + r)
    return out
