"""Query-set metrics over unseen tasks, each defined once as per-user parts.

Every metric is ``f(Σ num / Σ den)`` over users (``pooled``), with each user's ``(num, den)``
computed here (error metrics) or in ``ranking.py`` (P@5, nDCG@5). Why parts: a paired
comparison resamples *users* (``paired.py``), and its statistic must be exactly the number the
table reports; with one definition, the table and the interval cannot drift apart
(``per_task.py`` collects the parts per scorer).

AUC is reported two ways because they answer different questions: the mean *per-task* AUC
(over tasks whose query set has both classes) asks "does the model rank well within one
user?", which is what per-task adaptation can improve; the pooled AUC also rewards getting the
users' base rates right, and has no per-user part (it is not compared).

Every part is computed for all users at once from flat arrays with offsets (``segments.py``):
a Python call per user (sklearn's ``roc_auc_score`` per user was 83% of an eval) does not
scale to hundreds of thousands of users. The AUC is the Mann-Whitney statistic with tied
scores given their average rank, which is what sklearn's trapezoidal ROC area computes
(``tests/test_eval_vectorized.py`` checks the two agree per user); it is evaluated in integers
(twice the rank sums) until one final division.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from gmeta_tf.evaluation import segments

Parts = Tuple[np.ndarray, np.ndarray]  # (num, den) per user

_CLIP = 1e-7  # probabilities are clipped to [_CLIP, 1 - _CLIP] for the log loss (as sklearn's log_loss needs)


def pooled(metric: str, num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    """``f(Σ num / Σ den)`` along ``axis`` (vectorized: the bootstrap calls it on resamples);
    NaN where no user has a part (Σ den = 0)."""
    return pooled_from_sums(metric, np.sum(num, axis=axis), np.sum(den, axis=axis))


def pooled_from_sums(metric: str, num_total: np.ndarray, den_total: np.ndarray) -> np.ndarray:
    """``pooled`` given the sums ``Σ num`` and ``Σ den`` (the batched bootstrap sums many
    resamples of many scorers in one matrix product, ``paired.py``)."""
    value = num_total / np.where(den_total > 0, den_total, np.nan)
    return np.sqrt(value) if metric == "rmse" else value


def positive(labels: np.ndarray) -> np.ndarray:
    """A click label's class (labels are 0 or 1)."""
    return np.asarray(labels, np.float64) >= 0.5


def user_auc_parts(labels: np.ndarray, scores: np.ndarray, offsets: np.ndarray) -> Parts:
    """Per user: (AUC, 1) when its samples hold both classes, else (0, 0).

    One ``lexsort`` by (user, score) ranks every user's samples; a run of equal (user, score)
    is a tie group whose members all get the group's average rank. With R = the sum of the
    positives' ranks, AUC = (R − P(P+1)/2) / (P·N): computed as (2R − P(P+1)) / (2·P·N), where
    2R is a sum of integers (exact in float64).
    """
    y = positive(labels)
    s = np.asarray(scores, np.float64)
    users = len(offsets) - 1
    seg = segments.segment_ids(offsets)
    order = np.lexsort((s, seg))
    seg_sorted = seg[order]
    group, starts = segments.tie_groups(seg_sorted, s[order])
    ends = np.append(starts[1:], s.size)
    first = offsets[seg_sorted[starts]]  # where each group's user starts
    # ranks (starts - first + 1) .. (ends - first), so twice the average rank:
    twice_rank = (starts - first + 1 + ends - first).astype(np.float64)
    two_r = np.bincount(seg_sorted, weights=twice_rank[group] * y[order], minlength=users)
    n_pos = np.bincount(seg, weights=y, minlength=users)
    n_neg = segments.counts(offsets) - n_pos
    both = (n_pos > 0) & (n_neg > 0)
    num = np.zeros(users)
    num[both] = (two_r[both] - n_pos[both] * (n_pos[both] + 1)) / (2.0 * n_pos[both] * n_neg[both])
    return num, both.astype(np.float64)


def error_parts_flat(kind: str, labels: np.ndarray, preds: np.ndarray, offsets: np.ndarray) -> Dict[str, Parts]:
    """``error_parts`` of users given as flat arrays with ``offsets`` (``segments.py``)."""
    y = np.asarray(labels, np.float64)
    p = np.asarray(preds, np.float64)
    seg = segments.segment_ids(offsets)
    size = segments.counts(offsets).astype(np.float64)
    if kind == "click":
        q = np.clip(p, _CLIP, 1 - _CLIP)
        loss = -(y * np.log(q) + (1 - y) * np.log1p(-q))
        return {"auc": user_auc_parts(y, p, offsets), "logloss": (segments.segment_sum(loss, offsets, seg), size)}
    err = p - y
    return {"mae": (segments.segment_sum(np.abs(err), offsets, seg), size),
            "rmse": (segments.segment_sum(err ** 2, offsets, seg), size)}


def error_parts(kind: str, labels: List[np.ndarray], preds: List[np.ndarray]) -> Dict[str, Parts]:
    """Per user (the order of ``labels``): ``auc`` and ``logloss`` (clicks) or ``mae`` and
    ``rmse`` (ratings) as (num, den). A user's AUC counts only when its query has both classes."""
    y, offsets = segments.flatten(labels)
    p, _ = segments.flatten(preds)
    return error_parts_flat(kind, y, p, offsets)


class PooledAUC:
    """``auc_pooled`` (every user's query samples ranked together) without keeping the samples.

    Exact streaming equivalent of sklearn's ``roc_auc_score`` over all (clipped) samples: the
    AUC depends on the samples only through, per distinct score, how many samples and how many
    positives have it. Each added chunk becomes such a histogram; the pending histograms are
    merged into one whenever they outgrow it (amortized n log n), so memory is bounded by the
    number of distinct scores (a baseline has few; a model has at most one per sample), not by
    Python objects per user. AUC = Σ_v pos_v · (negatives below v + neg_v / 2) / (P·N),
    summed in integers (twice the statistic).
    """

    MERGE_AT = 1 << 16  # pending distinct scores that always trigger a merge

    def __init__(self) -> None:
        self._parts: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._merged = 0  # distinct scores in the first part, once merged
        self._pending = 0
        self._samples = 0

    def _count_dtype(self):
        """int32 counts (12 B per distinct float32 score, not 24) until a count could pass 2^31."""
        return np.int32 if self._samples < np.iinfo(np.int32).max else np.int64

    def add(self, labels: np.ndarray, preds: np.ndarray) -> None:
        # clipped in the predictions' own dtype (a model's float32 rounds the bounds, so every
        # float32 score at or above float32(1 - 1e-7) joins one tie, as it always has); kept in it:
        # float32 → float64 is exact and keeps the order, so the histogram's ties are the same
        q = np.clip(np.asarray(preds), _CLIP, 1 - _CLIP)
        q = q if q.dtype in (np.float32, np.float64) else q.astype(np.float64)
        if q.size == 0:
            return
        self._samples += int(q.size)
        u, inv = np.unique(q, return_inverse=True)
        inv = inv.reshape(-1)
        dt = self._count_dtype()
        pos = np.bincount(inv, weights=positive(labels), minlength=u.size).astype(dt)
        self._parts.append((u, pos, np.bincount(inv, minlength=u.size).astype(dt)))
        self._pending += u.size
        if self._pending > max(self._merged, self.MERGE_AT):
            self._merge()

    def _merge(self) -> None:
        if len(self._parts) > 1:
            u, inv = np.unique(np.concatenate([p[0] for p in self._parts]), return_inverse=True)
            inv = inv.reshape(-1)
            dt = self._count_dtype()
            pos = np.bincount(inv, weights=np.concatenate([p[1] for p in self._parts]), minlength=u.size)
            cnt = np.bincount(inv, weights=np.concatenate([p[2] for p in self._parts]), minlength=u.size)
            self._parts = [(u, pos.astype(dt), cnt.astype(dt))]
        self._merged = self._parts[0][0].size if self._parts else 0
        self._pending = 0

    def value(self) -> float:
        """The pooled AUC; NaN unless both classes occur."""
        self._merge()
        if not self._parts:
            return float("nan")
        _, pos, cnt = self._parts[0]
        pos, cnt = pos.astype(np.int64), cnt.astype(np.int64)
        neg = cnt - pos
        n_pos, n_neg = int(pos.sum()), int(neg.sum())
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        below = np.cumsum(neg) - neg
        two_u = int(np.sum(pos * (2 * below + neg)))
        return two_u / (2.0 * n_pos * n_neg)


def summarize(kind: str, parts: Dict[str, Parts], auc_pooled: float = float("nan")) -> Dict[str, float]:
    """The error metrics as reported, from all users' parts (and, for clicks, ``auc_pooled``)."""
    value = {m: float(pooled(m, *parts[m])) for m in (("auc", "logloss") if kind == "click" else ("mae", "rmse"))}
    if kind != "click":
        return value
    return {"auc": value["auc"], "auc_pooled": float(auc_pooled), "logloss": value["logloss"],
            "auc_tasks": int(parts["auc"][1].sum())}


def compute(kind: str, labels: List[np.ndarray], preds: List[np.ndarray]) -> Dict[str, float]:
    """The error metrics as reported: ``pooled`` over ``error_parts``; clicks add ``auc_pooled``
    (all users' samples ranked together) and ``auc_tasks`` (how many users have an AUC)."""
    y, offsets = segments.flatten(labels)
    p, _ = segments.flatten(preds, dtype=None)  # the pooled AUC clips in the predictions' dtype
    parts = error_parts_flat(kind, y, p, offsets)
    if kind != "click":
        return summarize(kind, parts)
    auc = PooledAUC()
    auc.add(y, p)
    return summarize(kind, parts, auc.value())
