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
    from gmeta_tf.evaluation.pooled_auc import PooledAUC  # it builds on this module

    auc = PooledAUC()
    auc.add(y, p)
    return summarize(kind, parts, auc.value())
