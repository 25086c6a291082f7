"""Every metric of ``gmeta eval`` per user, as parts whose pooled ratio is the reported number.

Why: a paired comparison of two scorers resamples *users* (the unit the cold-start question is
about, and the unit whose errors are correlated), so each user needs its own numbers. Every
metric is defined once as ``f(Σ num / Σ den)`` over users (``metrics.error_parts``,
``ranking.ranking_parts``, ``metrics.pooled``), so the resampled statistic is exactly the
pooled number the table reports, not a mean of per-user ratios:

=============  ===============================  ==========================  ============
metric         num (per user)                   den (per user)              f
=============  ===============================  ==========================  ============
``mae``        Σ |error| over its query          query size                  identity
``rmse``       Σ error²                          query size                  square root
``logloss``    Σ log loss                        query size                  identity
``auc``        the user's AUC                    1 if both classes, else 0   identity
``p_at_5``     expected hits@5 / min(5, Q)       1 (0 for an empty query)    identity
``ndcg_at_5``  expected DCG@5 / IDCG@5           1 if a relevant item, else 0  identity
=============  ===============================  ==========================  ============

``auc_pooled`` ranks all users' samples together and has no per-user part: it is not compared.
``TaskScores`` holds the parts of several scorers on the same users; ``eval_tasks.parquet``
(beside ``eval.json``) stores them, so ``gmeta eval --compare RUN`` pairs two runs' users
without re-scoring either.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gmeta_tf.errors import DataError
from gmeta_tf.evaluation import segments
from gmeta_tf.evaluation.metrics import Parts, error_parts_flat, pooled
from gmeta_tf.evaluation.ranking import ranking_parts_flat

RATING_METRICS = ("mae", "rmse", "p_at_5", "ndcg_at_5")
CLICK_METRICS = ("auc", "logloss", "p_at_5", "ndcg_at_5")
TASKS_FILE = "eval_tasks.parquet"
_META_KEY = b"gmeta_eval_tasks"


def metric_names(kind: str) -> Tuple[str, ...]:
    return CLICK_METRICS if kind == "click" else RATING_METRICS


def task_parts_flat(kind: str, labels: np.ndarray, preds: np.ndarray, offsets: np.ndarray,
                    threshold: float) -> Dict[str, Parts]:
    """``task_parts`` of users given as flat arrays with ``offsets`` (``segments.py``): all
    users at once, no Python call per user."""
    parts = {**error_parts_flat(kind, labels, preds, offsets),
             **ranking_parts_flat(kind, labels, preds, offsets, threshold)}
    return {m: parts[m] for m in metric_names(kind)}


def task_parts(kind: str, labels: List[np.ndarray], preds: List[np.ndarray], threshold: float) -> Dict[str, Parts]:
    """Per user (the order of ``labels``): each metric of ``metric_names(kind)`` as (num, den)."""
    y, offsets = segments.flatten(labels)
    p, _ = segments.flatten(preds)
    return task_parts_flat(kind, y, p, offsets, threshold)


@dataclass
class TaskScores:
    """Several scorers' per-user parts on the same users of one split.

    ``setup`` says what was scored (split, support / query sizes): two ``TaskScores`` pair only
    when it and the users agree. ``checks`` holds per-user values that must agree too (the query
    size and label sum: the same users with other query sets do not pair). ``roles`` says what
    each scorer is: ``model`` (the run as reported: ERM also fine-tuned), ``variant`` (a meta
    run before adapting) or ``baseline``.
    """

    kind: str
    task_ids: List[str]
    setup: Dict[str, object]
    checks: Dict[str, np.ndarray]
    scorers: Dict[str, Dict[str, Parts]] = field(default_factory=dict)
    roles: Dict[str, str] = field(default_factory=dict)

    def named(self, role: str) -> List[str]:
        return [s for s in self.scorers if self.roles.get(s) == role]

    def metric(self, scorer: str, metric: str) -> float:
        return float(pooled(metric, *self.scorers[scorer][metric]))

    def to_parquet(self) -> bytes:
        cols: Dict[str, object] = {"task_id": pa.array(self.task_ids, pa.string())}
        cols.update({f"check/{k}": pa.array(v, pa.float64()) for k, v in self.checks.items()})
        for scorer, metrics in self.scorers.items():
            for m, (num, den) in metrics.items():
                cols[f"{scorer}/{m}/num"] = pa.array(num, pa.float64())
                cols[f"{scorer}/{m}/den"] = pa.array(den, pa.float64())
        table = pa.table(cols).replace_schema_metadata(
            {_META_KEY: json.dumps({"kind": self.kind, "setup": self.setup, "roles": self.roles}).encode()})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()

    @classmethod
    def from_parquet(cls, data: bytes) -> "TaskScores":
        table = pq.read_table(io.BytesIO(data))
        meta = json.loads((table.schema.metadata or {})[_META_KEY])
        out = cls(meta["kind"], table.column("task_id").cast(pa.string()).to_pylist(), meta["setup"], {},
                  roles=meta.get("roles", {}))
        for name in table.column_names:
            parts = name.split("/")
            if parts[0] == "check":
                out.checks[parts[1]] = table.column(name).to_numpy()
            elif len(parts) == 3 and parts[2] == "num":
                den = table.column(f"{parts[0]}/{parts[1]}/den").to_numpy()
                out.scorers.setdefault(parts[0], {})[parts[1]] = (table.column(name).to_numpy(), den)
        return out

    def aligned(self, other: "TaskScores") -> "TaskScores":
        """``other`` with its users in this one's order; ``ValueError`` (saying how) when the two
        did not score the same users of the same split with the same support and query sizes."""
        diff = [f"{k}: {self.setup.get(k)!r} vs {other.setup.get(k)!r}"
                for k in sorted(set(self.setup) | set(other.setup)) if self.setup.get(k) != other.setup.get(k)]
        if diff:
            raise ValueError("scored differently (" + "; ".join(diff) + ")")
        # numpy string arrays, sorted: no Python call per user (300k users pair in well under a second)
        mine, theirs = np.asarray(self.task_ids, dtype=str), np.asarray(other.task_ids, dtype=str)
        by_id = np.argsort(theirs, kind="stable")
        if mine.shape != theirs.shape or not np.array_equal(np.sort(mine), theirs[by_id]):
            missing = sorted(set(self.task_ids) ^ set(other.task_ids))
            raise ValueError(f"not the same users ({len(missing)} differ, e.g. {missing[:3]})")
        order = by_id[np.searchsorted(theirs[by_id], mine)].astype(np.int64)
        checks = {k: v[order] for k, v in other.checks.items()}
        for k, v in self.checks.items():
            if k in checks and not np.allclose(v, checks[k]):
                bad = self.task_ids[int(np.flatnonzero(~np.isclose(v, checks[k]))[0])]
                raise ValueError(f"user {bad!r} has another query set ({k} differs)")
        scorers = {s: {m: (num[order], den[order]) for m, (num, den) in ms.items()}
                   for s, ms in other.scorers.items()}
        return TaskScores(other.kind, list(self.task_ids), other.setup, checks, scorers, dict(other.roles))


def load_for_comparison(run_dir: str, scores: TaskScores) -> TaskScores:
    """Another run's ``eval_tasks.parquet``, its users in ``scores``' order; a ``DataError``
    saying what to run when it is missing or scored other users or other support / query sets."""
    from gmeta_tf import storage

    path = storage.join(str(run_dir), TASKS_FILE)
    split = scores.setup.get("split")
    fix = (f"run `gmeta eval --run {run_dir} --split {split}` first, with the same data "
           f"(data.support={scores.setup.get('support')}, data.query={scores.setup.get('query')})")
    if not storage.exists(path):
        raise DataError(f"cannot compare with {run_dir}: it has no {TASKS_FILE} (per-user scores); {fix}")
    try:
        other = TaskScores.from_parquet(storage.read_bytes(path))
    except (OSError, KeyError, ValueError, pa.ArrowException) as e:
        raise DataError(f"cannot compare with {run_dir}: {path} is not a readable per-user score file "
                        f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); {fix}") from None
    try:
        return scores.aligned(other)
    except ValueError as e:
        raise DataError(f"cannot compare with {run_dir}: {path} {e}; {fix}") from None


def concat(parts: List[TaskScores]) -> TaskScores:
    """The users of several ``TaskScores`` (e.g. the test folds of a cross-validation) as one;
    every part must hold the same scorers and metrics."""
    first = parts[0]
    scorers = {s: {m: tuple(np.concatenate([p.scorers[s][m][j] for p in parts]) for j in (0, 1))
                   for m in ms} for s, ms in first.scorers.items()}
    return TaskScores(first.kind, [t for p in parts for t in p.task_ids], dict(first.setup),
                      {k: np.concatenate([p.checks[k] for p in parts]) for k in first.checks}, scorers,
                      dict(first.roles))
