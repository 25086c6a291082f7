"""What ``gmeta eval`` keeps while users stream past: per-user parts, never the samples.

Why: an eval pass used to hold every user's query labels and every scorer's predictions as
Python lists of small arrays until the end (3.2 GB at 27k users) and then score them one user
at a time. Here each chunk of users (flat arrays with offsets, ``segments.py``) is scored as it
arrives, all its users at once, and only what the report and the paired comparison need is kept:

* per scorer and user, each metric's (num, den) parts (``per_task.task_parts_flat``): a few
  floats per user, exactly what ``eval_tasks.parquet`` stores;
* per user, its id, query size and label sum (``TaskScores.checks``);
* for clicks, per scorer, ``metrics.PooledAUC``: the exact pooled AUC from a histogram of the
  distinct (clipped) scores, not the samples themselves.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

from gmeta_tf.evaluation import metrics, ranking, segments
from gmeta_tf.evaluation.metrics import Parts
from gmeta_tf.evaluation.per_task import metric_names, task_parts_flat


class StreamScores:
    """Scorers' metrics over users that arrive in chunks (``add``), in arrival order."""

    def __init__(self, kind: str, threshold: float) -> None:
        self.kind = kind
        self.threshold = threshold
        self._parts: Dict[str, List[Dict[str, Parts]]] = {}
        self._auc: Dict[str, metrics.PooledAUC] = {}
        self._task_ids: List[np.ndarray] = []
        self._sizes: List[np.ndarray] = []
        self._label_sums: List[np.ndarray] = []
        self.users = 0
        self.samples = 0
        self._ranked = 0  # users with a query
        self._ndcg = 0  # users with a relevant query item

    def add(self, task_ids: Sequence[str], labels: np.ndarray, offsets: np.ndarray,
            preds: Dict[str, np.ndarray]) -> None:
        """One chunk: its users' ids, flat query ``labels`` with ``offsets``, and each scorer's
        flat predictions (aligned with ``labels``). Every chunk must bring the same scorers."""
        labels = np.asarray(labels, np.float64)
        if self.users and set(preds) != set(self._parts):
            raise ValueError(f"scorers changed between chunks: {sorted(self._parts)} then {sorted(preds)}")
        for name, p in preds.items():
            self._parts.setdefault(name, []).append(task_parts_flat(self.kind, labels, p, offsets, self.threshold))
            if self.kind == "click":
                self._auc.setdefault(name, metrics.PooledAUC()).add(labels, p)
        self._task_ids.append(np.asarray(task_ids, dtype=object))
        self._sizes.append(segments.counts(offsets).astype(np.float64))
        self._label_sums.append(segments.segment_sum(labels, offsets))
        ranked, ndcg = ranking.relevance_counts(self.kind, labels, offsets, self.threshold)
        self._ranked += ranked
        self._ndcg += ndcg
        self.users += len(offsets) - 1
        self.samples += int(labels.size)

    @property
    def scorers(self) -> List[str]:
        return list(self._parts)

    def parts(self, name: str) -> Dict[str, Parts]:
        """Scorer ``name``'s per-user parts of every metric, all users in arrival order."""
        chunks = self._parts.get(name, [])
        return {m: (np.concatenate([c[m][0] for c in chunks]) if chunks else np.zeros(0),
                    np.concatenate([c[m][1] for c in chunks]) if chunks else np.zeros(0))
                for m in metric_names(self.kind)}

    def metrics(self, name: str) -> Dict:
        """Scorer ``name``'s metrics as reported (``metrics.compute`` and ``ranking.ranking_metrics``
        over all users, the same keys in the same order)."""
        parts = self.parts(name)
        auc = self._auc[name].value() if name in self._auc else float("nan")
        rank_keys = [m for m in parts if m.startswith(("p_at_", "ndcg_at_"))]
        return {**metrics.summarize(self.kind, parts, auc),
                **{m: float(metrics.pooled(m, *parts[m])) for m in rank_keys}}

    def ranking_summary(self) -> Dict:
        return ranking.summary(self.kind, self._ranked, self._ndcg, self.threshold)

    def task_ids(self) -> List[str]:
        return np.concatenate(self._task_ids).tolist() if self._task_ids else []

    def checks(self) -> Dict[str, np.ndarray]:
        """``TaskScores.checks``: each user's query size and label sum."""
        if not self._sizes:
            return {"query_size": np.zeros(0), "query_label_sum": np.zeros(0)}
        return {"query_size": np.concatenate(self._sizes), "query_label_sum": np.concatenate(self._label_sums)}
