"""Query-set metrics over unseen tasks.

AUC is reported two ways because they answer different questions: the mean *per-task* AUC
(over tasks whose query set has both classes) asks "does the model rank well within one
user?", which is what per-task adaptation can improve; the pooled AUC also rewards getting the
users' base rates right. sklearn computes both (no hand-rolled ranking code).
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
from sklearn.metrics import log_loss, roc_auc_score


def click_metrics(labels: List[np.ndarray], probs: List[np.ndarray]) -> Dict[str, float]:
    per_task = [roc_auc_score(y, p) for y, p in zip(labels, probs) if 0 < y.sum() < len(y)]
    y_all = np.concatenate(labels)
    p_all = np.clip(np.concatenate(probs), 1e-7, 1 - 1e-7)
    return {
        "auc": float(np.mean(per_task)) if per_task else float("nan"),
        "auc_pooled": float(roc_auc_score(y_all, p_all)) if 0 < y_all.sum() < len(y_all) else float("nan"),
        "logloss": float(log_loss(y_all, p_all, labels=[0, 1])),
        "auc_tasks": len(per_task),
    }


def rating_metrics(labels: List[np.ndarray], preds: List[np.ndarray]) -> Dict[str, float]:
    err = np.concatenate(preds) - np.concatenate(labels)
    return {"mae": float(np.mean(np.abs(err))), "rmse": float(np.sqrt(np.mean(err ** 2)))}


def compute(kind: str, labels: List[np.ndarray], preds: List[np.ndarray]) -> Dict[str, float]:
    return click_metrics(labels, preds) if kind == "click" else rating_metrics(labels, preds)
