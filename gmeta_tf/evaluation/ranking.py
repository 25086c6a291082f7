"""The ranking view of a cold user's query set: precision@5 and nDCG@5 with binary relevance.

Each user's query items are ranked by the scorer's predictions and compared with which of them
are relevant (a rating >= ``eval.relevance_threshold``, or a click). Definitions, per user:

* **Ties do not depend on data order.** A scorer may give several items the same score (the
  global-mean baseline scores every item equally; unseen items share the global value). The
  metrics are the *exact expectation* under uniformly random tie-breaking: a tie group that spans
  the cut-off at 5 gets its share of the remaining slots in proportion to its relevant items,
  and each item of a tie group gets the mean discount of the positions the group occupies
  (0 beyond position 5). Sorting with a stable sort would instead reward whatever order the
  Parquet files happen to have.
* **P@5** = (expected relevant items in the top 5) / min(5, query size): a user with 3 query
  items can reach 1.0. Averaged over all users (a user with no relevant item scores 0 for every
  scorer alike).
* **nDCG@5** = E[DCG@5] / IDCG@5 with discount 1/log2(1 + position). A user with no relevant
  query item has IDCG 0 and no defined nDCG: such users are *excluded* from the mean, and
  ``ndcg_users`` (from ``relevance_summary``) says how many users counted.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from gmeta_tf.evaluation.metrics import Parts, pooled

K = 5


def relevant(kind: str, labels: np.ndarray, threshold: float) -> np.ndarray:
    """Binary relevance of query samples: a click, or a rating >= ``threshold``."""
    labels = np.asarray(labels, dtype=np.float64)
    return labels >= (0.5 if kind == "click" else threshold)


def _discounts(n: int, k: int) -> np.ndarray:
    """Cumulative discounts: ``c[p]`` = sum of the discounts of positions 1..p (0 beyond ``k``)."""
    pos = np.arange(1, n + 1, dtype=np.float64)
    d = np.where(pos <= k, 1.0 / np.log2(pos + 1.0), 0.0)
    return np.concatenate([[0.0], np.cumsum(d)])


def expected_hits_dcg(scores: np.ndarray, rel: np.ndarray, k: int = K) -> Tuple[float, float]:
    """Expected number of relevant items in the top ``k`` and expected DCG@k of one user.

    Items are grouped by equal score; a group occupying positions (start, start + size] puts each
    of its items at every one of those positions with equal probability.
    """
    scores = np.asarray(scores, dtype=np.float64)
    rel = np.asarray(rel, dtype=np.float64)
    n = scores.size
    if n == 0:
        return 0.0, 0.0
    _, group = np.unique(-scores, return_inverse=True)  # group 0 = the highest score
    group = group.reshape(-1)
    sizes = np.bincount(group).astype(np.float64)
    rel_in = np.bincount(group, weights=rel)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    slots = np.clip(k - starts, 0.0, sizes)  # how many of the group's positions are in the top k
    c = _discounts(n, k)
    hits = float(np.sum(rel_in * slots / sizes))
    dcg = float(np.sum(rel_in * (c[ends.astype(int)] - c[starts.astype(int)]) / sizes))
    return hits, dcg


def ideal_dcg(n_relevant: int, k: int = K) -> float:
    return float(_discounts(max(n_relevant, 0), k)[min(n_relevant, k)]) if n_relevant > 0 else 0.0


def ranking_parts(kind: str, labels: List[np.ndarray], scores: List[np.ndarray],
                  threshold: float, k: int = K) -> Dict[str, Parts]:
    """Per user (the order of ``labels``): ``p_at_5`` and ``ndcg_at_5`` (suffix follows ``k``) as
    (num, den), pooled by ``metrics.pooled``: P@5 has den 1 for every user with a query, nDCG@5
    only for a user with a relevant item (the others are excluded, as defined above)."""
    n = len(labels)
    p_name, n_name = f"p_at_{k}", f"ndcg_at_{k}"
    out = {p_name: (np.zeros(n), np.zeros(n)), n_name: (np.zeros(n), np.zeros(n))}
    for i, (y, s) in enumerate(zip(labels, scores)):
        if len(y) == 0:
            continue
        rel = relevant(kind, y, threshold)
        hits, dcg = expected_hits_dcg(s, rel, k)
        out[p_name][0][i], out[p_name][1][i] = hits / min(k, len(y)), 1.0
        n_rel = int(rel.sum())
        if n_rel:
            out[n_name][0][i], out[n_name][1][i] = dcg / ideal_dcg(n_rel, k), 1.0
    return out


def ranking_metrics(kind: str, labels: List[np.ndarray], scores: List[np.ndarray],
                    threshold: float, k: int = K) -> Dict[str, float]:
    """``p_at_5`` and ``ndcg_at_5`` (suffix follows ``k``) over users, as defined above."""
    return {m: float(pooled(m, *p)) for m, p in ranking_parts(kind, labels, scores, threshold, k).items()}


def relevance_summary(kind: str, labels: List[np.ndarray], threshold: float, k: int = K) -> Dict:
    """What the ranking numbers average over (the same for every scorer): for eval.json."""
    n_rel = [int(relevant(kind, y, threshold).sum()) for y in labels if len(y)]
    return {"k": k, "relevance": "label 1" if kind == "click" else f"rating >= {threshold:g}",
            "users": len(n_rel), "ndcg_users": sum(1 for r in n_rel if r > 0)}
