"""What ``gmeta eval`` keeps while users stream past: per-user parts, never the samples.

Why: an eval pass used to hold every user's query labels and every scorer's predictions as
Python lists of small arrays until the end (3.2 GB at 27k users) and then score them one user
at a time. Here each chunk of users (flat arrays with offsets, ``segments.py``) is scored as it
arrives, all its users at once, and only what the report and the paired comparison need is kept:

* per scorer and user, each metric's (num, den) parts (``per_task.task_parts_flat``): a few
  floats per user, exactly what ``eval_tasks.parquet`` stores;
* per user, its id, query size and label sum (``TaskScores.checks``);
* for clicks, per scorer, ``pooled_auc.PooledAUC``: the exact pooled AUC from a histogram of the
  distinct (clipped) scores, not the samples themselves, on disk past a bound.

Pure numpy (no TensorFlow): ``evaluate.py`` cuts the model's padded batches into
``QueryChunk``s; ``score_chunks`` does everything after that, which is what the tests and
``bench/eval_metrics.py`` drive directly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from gmeta_tf.config.schema import Config
from gmeta_tf.evaluation import baselines, metrics, ranking, segments
from gmeta_tf.evaluation.baselines import FlatItems
from gmeta_tf.evaluation.metrics import Parts
from gmeta_tf.evaluation.per_task import TaskScores, metric_names, task_parts_flat
from gmeta_tf.evaluation.pooled_auc import PooledAUC

CHUNK_USERS = 2048  # users scored together: big enough that numpy's per-call cost vanishes

Progress = Callable[[int], None]  # called with the number of users just scored


@dataclass
class QueryChunk:
    """Some users' query sets as flat arrays with ``offsets`` (``segments.py``), padding removed:
    labels and the model's predictions before / after adapting; with ``items``, the samples the
    baselines need (support items and labels, query items)."""

    task_ids: np.ndarray  # str, one per user
    offsets: np.ndarray
    labels: np.ndarray
    before: np.ndarray
    after: np.ndarray
    items: Optional[FlatItems] = None

    @property
    def users(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def concat(cls, chunks: List["QueryChunk"]) -> "QueryChunk":
        if len(chunks) == 1:
            return chunks[0]
        offsets = segments.offsets_from_counts(np.concatenate([np.diff(c.offsets) for c in chunks]))

        def cat(name: str) -> np.ndarray:
            return np.concatenate([getattr(c, name) for c in chunks])

        items = None
        if chunks[0].items is not None:
            its = [c.items for c in chunks]
            sup_items, sup_offsets = segments.concat([(i.support_items, i.support_offsets) for i in its])
            items = FlatItems(sup_offsets, sup_items, np.concatenate([i.support_labels for i in its]), offsets,
                              np.concatenate([i.query_items for i in its]))
        return cls(cat("task_ids"), offsets, cat("labels"), cat("before"), cat("after"), items)


class StreamScores:
    """Scorers' metrics over users that arrive in chunks (``add``), in arrival order."""

    def __init__(self, kind: str, threshold: float) -> None:
        self.kind = kind
        self.threshold = threshold
        self._parts: Dict[str, List[Dict[str, Parts]]] = {}
        self._auc: Dict[str, PooledAUC] = {}
        self._task_ids: List[np.ndarray] = []
        self._sizes: List[np.ndarray] = []
        self._label_sums: List[np.ndarray] = []
        self.users = 0
        self.samples = 0
        self._ranked = 0  # users with a query
        self._ndcg = 0  # users with a relevant query item
        self._released: set = set()

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
                self._auc.setdefault(name, PooledAUC()).add(labels, p)
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
        if name in self._released:
            raise ValueError(f"scorer {name!r}'s parts were handed over (pop_parts): this stream no longer holds them")
        chunks = self._parts.get(name, [])
        return {m: (np.concatenate([c[m][0] for c in chunks]) if chunks else np.zeros(0),
                    np.concatenate([c[m][1] for c in chunks]) if chunks else np.zeros(0))
                for m in metric_names(self.kind)}

    def pop_parts(self, name: str) -> Dict[str, Parts]:
        """``parts(name)``, and the stream lets go of its chunks: the concatenated copy is the only
        one left (the last step, ``task_scores``: at 300k users each scorer's parts are ~64 MB)."""
        out = self.parts(name)
        self._parts[name] = []
        self._released.add(name)
        return out

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


def score_chunks(chunks: Iterable[QueryChunk], cfg: Config, algo: str, kind: str, split: str, steps: int,
                 lr: float, item: Optional[str], stats: Optional[baselines.ItemStats],
                 progress: Optional[Progress] = None):
    """``gmeta eval`` past the model: score streamed ``QueryChunk``s (model predictions before
    and after adapting; with ``stats``, the baselines of feature ``item``) and assemble
    ``eval.json``'s result. Returns (result, the ``StreamScores``, scorer → (its name in the
    stream, role)); ``progress`` hears each chunk's user count once it is scored."""
    threshold = cfg.eval.relevance_threshold
    k_item, k_user = cfg.eval.baseline_shrinkage, cfg.eval.baseline_user_shrinkage
    adapted_needed = algo != "erm" or steps > 0
    stream = StreamScores(kind, threshold)
    for chunk in chunks:
        preds = {"before": chunk.before}
        if adapted_needed:
            preds["after"] = chunk.after
        if stats is not None:
            preds.update(baselines.predict_flat(kind, stats, chunk.items, k_item, k_user, with_items=item is not None))
        stream.add(chunk.task_ids, chunk.labels, chunk.offsets, preds)
        if progress is not None:
            progress(chunk.users)
    result: Dict = {"algo": algo, "split": split, "tasks": stream.users, "query_samples": stream.samples}
    no_adapt = stream.metrics("before")
    if algo == "erm":
        result.update(no_adapt)
        result.update({f"{k}_no_adapt": v for k, v in no_adapt.items()})
        scorers = {algo: ("before", "model")}
        if steps > 0:
            result.update({f"{k}_finetune": v for k, v in stream.metrics("after").items()})
            scorers[f"{algo}_finetune"] = ("after", "model")
    else:
        result.update(stream.metrics("after"))
        result.update({f"{k}_no_adapt": v for k, v in no_adapt.items()})
        scorers = {algo: ("after", "model"), f"{algo}_no_adapt": ("before", "variant")}
    result["adapt"] = {"steps": steps, "lr": lr, "params": cfg.meta.adapt}
    result["ranking"] = stream.ranking_summary()
    if stats is not None:
        names = baselines.names(kind, item is not None)
        result["baselines"] = {name: stream.metrics(name) for name in names}
        result["baseline_setup"] = {"item_feature": item, "shrinkage": k_item, "user_shrinkage": k_user,
                                    "train_samples": stats.samples, "train_items": int(stats.ids.size),
                                    "global_mean": stats.global_mean}
        scorers.update({name: (name, "baseline") for name in names})
    return result, stream, scorers


def task_scores(stream: StreamScores, scorers: Dict[str, Tuple[str, str]], split: str, cfg: Config) -> TaskScores:
    """The streamed parts as ``TaskScores``: ``scorers`` maps each reported scorer to (the
    stream's name for its predictions, its role)."""
    tasks = TaskScores(stream.kind, stream.task_ids(),
                       {"split": split, "support": cfg.data.support, "query": cfg.data.query,
                        "relevance_threshold": stream.threshold},
                       stream.checks())
    keys = [key for key, _ in scorers.values()]
    tasks.scorers = {name: stream.pop_parts(key) if keys.count(key) == 1 else stream.parts(key)
                     for name, (key, _) in scorers.items()}
    tasks.roles = {name: role for name, (_, role) in scorers.items()}
    return tasks
