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

from gmeta_tf.evaluation import segments
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


def _hits_dcg_flat(scores: np.ndarray, rel: np.ndarray, offsets: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """Expected hits@k and expected DCG@k of every user (flat arrays with ``offsets``).

    One ``lexsort`` by (user, −score) puts every user's items in rank order; a run of equal
    (user, score) is a tie group occupying positions (start, start + size] of its user, and each
    of its items sits at every one of those positions with equal probability.
    """
    s = np.asarray(scores, dtype=np.float64)
    rel = np.asarray(rel, dtype=np.float64)
    users = len(offsets) - 1
    seg = segments.segment_ids(offsets)
    order = np.lexsort((-s, seg))
    seg_sorted = seg[order]
    group, starts = segments.tie_groups(seg_sorted, -s[order])
    ends = np.append(starts[1:], s.size)
    owner = seg_sorted[starts]
    start = starts - offsets[owner]  # the group's positions within its user
    end = ends - offsets[owner]
    sizes = (ends - starts).astype(np.float64)
    rel_in = np.bincount(group, weights=rel[order], minlength=starts.size)
    slots = np.clip(k - start, 0.0, sizes)  # how many of the group's positions are in the top k
    c = _discounts(k, k)  # c[p] for p > k is c[k]: positions beyond k add nothing
    by_user = segments.offsets_from_counts(np.bincount(owner, minlength=users))  # groups are in user order
    hits = segments.segment_sum(rel_in * slots / sizes, by_user)
    dcg = segments.segment_sum(rel_in * (c[np.minimum(end, k)] - c[np.minimum(start, k)]) / sizes, by_user)
    return hits, dcg


def expected_hits_dcg(scores: np.ndarray, rel: np.ndarray, k: int = K) -> Tuple[float, float]:
    """Expected number of relevant items in the top ``k`` and expected DCG@k of one user.

    Items are grouped by equal score; a group occupying positions (start, start + size] puts each
    of its items at every one of those positions with equal probability.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if scores.size == 0:
        return 0.0, 0.0
    hits, dcg = _hits_dcg_flat(scores, rel, np.array([0, scores.size], np.int64), k)
    return float(hits[0]), float(dcg[0])


def ideal_dcg(n_relevant: int, k: int = K) -> float:
    return float(_discounts(max(n_relevant, 0), k)[min(n_relevant, k)]) if n_relevant > 0 else 0.0


def ranking_parts_flat(kind: str, labels: np.ndarray, scores: np.ndarray, offsets: np.ndarray,
                       threshold: float, k: int = K) -> Dict[str, Parts]:
    """``ranking_parts`` of users given as flat arrays with ``offsets`` (``segments.py``)."""
    rel = relevant(kind, labels, threshold)
    users = len(offsets) - 1
    size = segments.counts(offsets)
    hits, dcg = _hits_dcg_flat(scores, rel, offsets, k)
    n_rel = np.bincount(segments.segment_ids(offsets), weights=rel, minlength=users).astype(np.int64)
    some, any_rel = size > 0, n_rel > 0
    p_num, n_num = np.zeros(users), np.zeros(users)
    p_num[some] = hits[some] / np.minimum(k, size[some])
    ideal = _discounts(k, k)  # ideal_dcg(r) = ideal[min(r, k)]
    n_num[any_rel] = dcg[any_rel] / ideal[np.minimum(n_rel[any_rel], k)]
    return {f"p_at_{k}": (p_num, some.astype(np.float64)), f"ndcg_at_{k}": (n_num, any_rel.astype(np.float64))}


def ranking_parts(kind: str, labels: List[np.ndarray], scores: List[np.ndarray],
                  threshold: float, k: int = K) -> Dict[str, Parts]:
    """Per user (the order of ``labels``): ``p_at_5`` and ``ndcg_at_5`` (suffix follows ``k``) as
    (num, den), pooled by ``metrics.pooled``: P@5 has den 1 for every user with a query, nDCG@5
    only for a user with a relevant item (the others are excluded, as defined above)."""
    y, offsets = segments.flatten(labels)
    s, _ = segments.flatten(scores)
    return ranking_parts_flat(kind, y, s, offsets, threshold, k)


def ranking_metrics(kind: str, labels: List[np.ndarray], scores: List[np.ndarray],
                    threshold: float, k: int = K) -> Dict[str, float]:
    """``p_at_5`` and ``ndcg_at_5`` (suffix follows ``k``) over users, as defined above."""
    return {m: float(pooled(m, *p)) for m, p in ranking_parts(kind, labels, scores, threshold, k).items()}


def relevance_counts(kind: str, labels: np.ndarray, offsets: np.ndarray, threshold: float) -> Tuple[int, int]:
    """(users with a query, users with a relevant query item) of flat ``labels`` with ``offsets``."""
    size = segments.counts(offsets)
    n_rel = np.bincount(segments.segment_ids(offsets), weights=relevant(kind, labels, threshold),
                        minlength=len(offsets) - 1)
    return int(np.sum(size > 0)), int(np.sum((size > 0) & (n_rel > 0)))


def summary(kind: str, users: int, ndcg_users: int, threshold: float, k: int = K) -> Dict:
    """What the ranking numbers average over (the same for every scorer): for eval.json."""
    return {"k": k, "relevance": "label 1" if kind == "click" else f"rating >= {threshold:g}",
            "users": users, "ndcg_users": ndcg_users}


def relevance_summary(kind: str, labels: List[np.ndarray], threshold: float, k: int = K) -> Dict:
    """What the ranking numbers average over (the same for every scorer): for eval.json."""
    y, offsets = segments.flatten(labels)
    return summary(kind, *relevance_counts(kind, y, offsets, threshold), threshold, k)
