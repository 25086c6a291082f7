"""Query-set metrics over unseen tasks, each defined once as per-user parts.

Every metric is ``f(Σ num / Σ den)`` over users (``pooled``), with each user's ``(num, den)``
computed here (error metrics) or in ``ranking.py`` (P@5, nDCG@5). Why parts: a paired
comparison resamples *users* (``paired.py``), and its statistic must be exactly the number the
table reports; with one definition, the table and the interval cannot drift apart
(``per_task.py`` collects the parts per scorer).

AUC is reported two ways because they answer different questions: the mean *per-task* AUC
(over tasks whose query set has both classes) asks "does the model rank well within one
user?", which is what per-task adaptation can improve; the pooled AUC also rewards getting the
users' base rates right, and has no per-user part (it is not compared). sklearn computes both
(no hand-rolled ranking code).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
from sklearn.metrics import roc_auc_score

Parts = Tuple[np.ndarray, np.ndarray]  # (num, den) per user

_CLIP = 1e-7  # probabilities are clipped to [_CLIP, 1 - _CLIP] for the log loss (as sklearn's log_loss needs)


def pooled(metric: str, num: np.ndarray, den: np.ndarray, axis: int = -1) -> np.ndarray:
    """``f(Σ num / Σ den)`` along ``axis`` (vectorized: the bootstrap calls it on resamples);
    NaN where no user has a part (Σ den = 0)."""
    total = np.sum(den, axis=axis)
    value = np.sum(num, axis=axis) / np.where(total > 0, total, np.nan)
    return np.sqrt(value) if metric == "rmse" else value


def error_parts(kind: str, labels: List[np.ndarray], preds: List[np.ndarray]) -> Dict[str, Parts]:
    """Per user (the order of ``labels``): ``auc`` and ``logloss`` (clicks) or ``mae`` and
    ``rmse`` (ratings) as (num, den). A user's AUC counts only when its query has both classes."""
    n = len(labels)
    names = ("auc", "logloss") if kind == "click" else ("mae", "rmse")
    out = {m: (np.zeros(n), np.zeros(n)) for m in names}
    for i, (y, p) in enumerate(zip(labels, preds)):
        y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
        if y.size == 0:
            continue
        if kind == "click":
            q = np.clip(p, _CLIP, 1 - _CLIP)
            out["logloss"][0][i] = -np.sum(y * np.log(q) + (1 - y) * np.log1p(-q))
            out["logloss"][1][i] = y.size
            if 0 < y.sum() < y.size:
                out["auc"][0][i], out["auc"][1][i] = roc_auc_score(y, p), 1.0
        else:
            err = p - y
            out["mae"][0][i], out["mae"][1][i] = np.sum(np.abs(err)), y.size
            out["rmse"][0][i], out["rmse"][1][i] = np.sum(err ** 2), y.size
    return out


def compute(kind: str, labels: List[np.ndarray], preds: List[np.ndarray]) -> Dict[str, float]:
    """The error metrics as reported: ``pooled`` over ``error_parts``; clicks add ``auc_pooled``
    (all users' samples ranked together) and ``auc_tasks`` (how many users have an AUC)."""
    parts = error_parts(kind, labels, preds)
    value = {m: float(pooled(m, *p)) for m, p in parts.items()}
    if kind != "click":
        return value
    y_all = np.concatenate(labels)
    p_all = np.clip(np.concatenate(preds), _CLIP, 1 - _CLIP)
    return {
        "auc": value["auc"],
        "auc_pooled": float(roc_auc_score(y_all, p_all)) if 0 < y_all.sum() < len(y_all) else float("nan"),
        "logloss": value["logloss"],
        "auc_tasks": int(parts["auc"][1].sum()),
    }
