"""The per-user evaluation code that the vectorized, streaming ``gmeta eval`` replaced: the reference.

Kept verbatim (one sklearn ``roc_auc_score`` / one ``np.unique`` / one ``TaskItems`` per user) so
``tests/test_eval_vectorized.py`` can check the vectorized code against it and
``bench/eval_metrics.py`` can time it, both by a plain import (``from tests.eval_reference import
...``). Not part of the package: it is slow by design.
"""
from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score

from gmeta_tf.evaluation import per_task

_CLIP = 1e-7


def _old_pooled(metric, num, den):
    total = np.sum(den)
    value = np.sum(num) / np.where(total > 0, total, np.nan)
    return np.sqrt(value) if metric == "rmse" else value


def _old_error_parts(kind, labels, preds):
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


def _old_compute(kind, labels, preds):
    parts = _old_error_parts(kind, labels, preds)
    value = {m: float(_old_pooled(m, *p)) for m, p in parts.items()}
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


def _old_discounts(n, k):
    pos = np.arange(1, n + 1, dtype=np.float64)
    d = np.where(pos <= k, 1.0 / np.log2(pos + 1.0), 0.0)
    return np.concatenate([[0.0], np.cumsum(d)])


def _old_expected_hits_dcg(scores, rel, k=5):
    scores = np.asarray(scores, dtype=np.float64)
    rel = np.asarray(rel, dtype=np.float64)
    n = scores.size
    if n == 0:
        return 0.0, 0.0
    _, group = np.unique(-scores, return_inverse=True)
    group = group.reshape(-1)
    sizes = np.bincount(group).astype(np.float64)
    rel_in = np.bincount(group, weights=rel)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    slots = np.clip(k - starts, 0.0, sizes)
    c = _old_discounts(n, k)
    hits = float(np.sum(rel_in * slots / sizes))
    dcg = float(np.sum(rel_in * (c[ends.astype(int)] - c[starts.astype(int)]) / sizes))
    return hits, dcg


def _old_ideal_dcg(n_relevant, k=5):
    return float(_old_discounts(max(n_relevant, 0), k)[min(n_relevant, k)]) if n_relevant > 0 else 0.0


def _old_relevant(kind, labels, threshold):
    return np.asarray(labels, dtype=np.float64) >= (0.5 if kind == "click" else threshold)


def _old_ranking_parts(kind, labels, scores, threshold, k=5):
    n = len(labels)
    p_name, n_name = f"p_at_{k}", f"ndcg_at_{k}"
    out = {p_name: (np.zeros(n), np.zeros(n)), n_name: (np.zeros(n), np.zeros(n))}
    for i, (y, s) in enumerate(zip(labels, scores)):
        if len(y) == 0:
            continue
        rel = _old_relevant(kind, y, threshold)
        hits, dcg = _old_expected_hits_dcg(s, rel, k)
        out[p_name][0][i], out[p_name][1][i] = hits / min(k, len(y)), 1.0
        n_rel = int(rel.sum())
        if n_rel:
            out[n_name][0][i], out[n_name][1][i] = dcg / _old_ideal_dcg(n_rel, k), 1.0
    return out


def _old_ranking_metrics(kind, labels, scores, threshold, k=5):
    return {m: float(_old_pooled(m, *p)) for m, p in _old_ranking_parts(kind, labels, scores, threshold, k).items()}


def _old_relevance_summary(kind, labels, threshold, k=5):
    n_rel = [int(_old_relevant(kind, y, threshold).sum()) for y in labels if len(y)]
    return {"k": k, "relevance": "label 1" if kind == "click" else f"rating >= {threshold:g}",
            "users": len(n_rel), "ndcg_users": sum(1 for r in n_rel if r > 0)}


def _old_task_parts(kind, labels, preds, threshold):
    parts = {**_old_error_parts(kind, labels, preds), **_old_ranking_parts(kind, labels, preds, threshold)}
    return {m: parts[m] for m in per_task.metric_names(kind)}


_EPS = 1e-6


def _old_logit(p):
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def _old_user_residual(stats, task, k_item, k_user):
    n = task.support_labels.size
    if n + k_user <= 0:
        return 0.0
    base = stats.item_means(task.support_items, k_item)
    return float(np.sum(task.support_labels - base) / (n + k_user))


def _old_predict(kind, stats, tasks, k_item, k_user, with_items=True):
    names = ("global_ctr", "item_ctr", "item_ctr_user_bias") if kind == "click" else \
        ("global_mean", "item_mean", "item_mean_user_bias")
    out = {n: [] for n in (names if with_items else names[:1])}
    for task in tasks:
        q = task.query_items
        out[names[0]].append(np.full(q.shape, stats.global_mean, dtype=np.float64))
        if not with_items:
            continue
        item = stats.item_means(q, k_item)
        out[names[1]].append(item)
        r = _old_user_residual(stats, task, k_item, k_user)
        if kind == "click":
            shift = 0.0
            if task.support_items.size:
                p_bar = float(np.mean(stats.item_means(task.support_items, k_item)))
                shift = float(_old_logit(np.asarray(p_bar + r)) - _old_logit(np.asarray(p_bar)))
            out[names[2]].append(1.0 / (1.0 + np.exp(-(_old_logit(item) + shift))))
        else:
            out[names[2]].append(item + r)
    return out


def _old_score(kind, labels, preds, threshold):
    return {**_old_compute(kind, labels, preds), **_old_ranking_metrics(kind, labels, preds, threshold)}


def _old_evaluate(cfg, algo, kind, split, steps, lr, item, stats, task_ids, labels, before, after, items):
    """The old ``_evaluate`` after ``_collect`` (and ``_baseline_results``, ``evaluate_tasks``)."""
    result = {"algo": algo, "split": split, "tasks": len(labels), "query_samples": int(sum(len(y) for y in labels))}
    threshold = cfg.eval.relevance_threshold
    no_adapt = _old_score(kind, labels, before, threshold)
    adapted = _old_score(kind, labels, after, threshold)
    if algo == "erm":
        result.update(no_adapt)
        result.update({f"{k}_no_adapt": v for k, v in no_adapt.items()})
        scorers = {algo: (before, "model")}
        if steps > 0:
            result.update({f"{k}_finetune": v for k, v in adapted.items()})
            scorers[f"{algo}_finetune"] = (after, "model")
    else:
        result.update(adapted)
        result.update({f"{k}_no_adapt": v for k, v in no_adapt.items()})
        scorers = {algo: (after, "model"), f"{algo}_no_adapt": (before, "variant")}
    result["adapt"] = {"steps": steps, "lr": lr, "params": cfg.meta.adapt}
    result["ranking"] = _old_relevance_summary(kind, labels, threshold)
    if stats is not None:
        k_item, k_user = cfg.eval.baseline_shrinkage, cfg.eval.baseline_user_shrinkage
        preds = _old_predict(kind, stats, items, k_item, k_user, with_items=item is not None)
        result["baselines"] = {name: _old_score(kind, labels, p, threshold) for name, p in preds.items()}
        result["baseline_setup"] = {"item_feature": item, "shrinkage": k_item, "user_shrinkage": k_user,
                                    "train_samples": stats.samples, "train_items": int(stats.ids.size),
                                    "global_mean": stats.global_mean}
        scorers.update({name: (p, "baseline") for name, p in preds.items()})
    parts = {name: _old_task_parts(kind, labels, p, threshold) for name, (p, _) in scorers.items()}
    checks = {"query_size": np.array([y.size for y in labels], np.float64),
              "query_label_sum": np.array([float(np.sum(y)) for y in labels])}
    return result, parts, {name: role for name, (_, role) in scorers.items()}, checks
