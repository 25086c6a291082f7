"""Paired differences between two scorers on the same users, with a bootstrap interval.

Two scorers evaluated on the same cold users make correlated errors: a user whose taste is odd
is hard for both. The honest question is therefore paired — "on these users, how much does A
change the metric against B?" — and its uncertainty comes from which users we happened to get.
So the interval resamples **users** with replacement, the same users for both scorers
(SciPy's ``stats.bootstrap`` with ``paired=True``: it resamples the user indices and hands the
statistic each resample of every array), and the statistic is the difference of the pooled
metrics (``per_task.pooled``), exactly what the table reports for the full set of users.

Percentile interval (``method='percentile'``): the 2.5th and 97.5th percentiles of the
resampled differences. It needs no jackknife (BCa's costs O(users²), too much for a large
eval split) and is what a reader can check by hand. Seeded, so a rerun prints the same
interval. A verdict reads the interval with the metric's direction: entirely on the good side
of 0 is "better", on the bad side "worse", straddling 0 "can't tell".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

from gmeta_tf.config.schema import metric_direction
from gmeta_tf.evaluation.per_task import Parts, TaskScores, pooled

BETTER, WORSE, CANT_TELL = "better", "worse", "can't tell"


@dataclass(frozen=True)
class Bootstrap:
    """How intervals are computed (``eval.bootstrap_*`` keys)."""

    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0
    method: str = "percentile"

    @classmethod
    def from_eval(cls, cfg) -> "Bootstrap":
        """From an ``EvalConfig`` (``eval.bootstrap_resamples`` / ``_confidence`` / ``_seed``)."""
        return cls(resamples=cfg.bootstrap_resamples, confidence=cfg.bootstrap_confidence, seed=cfg.bootstrap_seed)

    def to_json(self) -> Dict:
        return {"method": f"paired bootstrap over users, {self.method} interval (scipy.stats.bootstrap)",
                "resamples": self.resamples, "confidence": self.confidence, "seed": self.seed}


def verdict(metric: str, low: float, high: float) -> str:
    """``better`` / ``worse`` / ``can't tell`` for an interval of (A − B) in ``metric``."""
    direction = metric_direction(metric) or -1
    if not (np.isfinite(low) and np.isfinite(high)):
        return CANT_TELL
    if low > 0 or high < 0:
        return BETTER if (low > 0) == (direction > 0) else WORSE
    return CANT_TELL


def paired_difference(metric: str, a: Parts, b: Parts, boot: Bootstrap) -> Dict[str, object]:
    """``diff`` = pooled(A) − pooled(B) over all users, its interval, and the verdict."""
    a_num, a_den = (np.asarray(x, np.float64) for x in a)
    b_num, b_den = (np.asarray(x, np.float64) for x in b)
    diff = float(pooled(metric, a_num, a_den) - pooled(metric, b_num, b_den))

    def statistic(an, ad, bn, bd, axis=-1):
        return pooled(metric, an, ad, axis) - pooled(metric, bn, bd, axis)

    low = high = float("nan")
    if a_num.size >= 2 and np.isfinite(diff):
        res = stats.bootstrap((a_num, a_den, b_num, b_den), statistic, paired=True, vectorized=True,
                              n_resamples=boot.resamples, confidence_level=boot.confidence,
                              method=boot.method, rng=np.random.default_rng(boot.seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return {"diff": diff, "ci_low": low, "ci_high": high, "verdict": verdict(metric, low, high)}


def compare(scores: TaskScores, a: str, b: str, boot: Bootstrap,
            metrics: Optional[Iterable[str]] = None, other: Optional[TaskScores] = None) -> Dict[str, Dict]:
    """Scorer ``a`` of ``scores`` against scorer ``b`` of ``other`` (default: of ``scores``),
    every metric both have; ``other`` must already be ``scores.aligned`` (same users, same order)."""
    other = other if other is not None else scores
    names = metrics if metrics is not None else scores.scorers[a].keys()
    return {m: paired_difference(m, scores.scorers[a][m], other.scorers[b][m], boot)
            for m in names if m in scores.scorers[a] and m in other.scorers[b]}


def report(scores: TaskScores, models: Sequence[str], baselines: Sequence[str], boot: Bootstrap,
           others: Optional[Dict[str, Tuple[TaskScores, Sequence[str]]]] = None, *,
           metrics: Optional[Iterable[str]] = None) -> Dict[str, object]:
    """The ``paired`` section of ``eval.json``: every scorer of ``models`` against every one of
    ``baselines`` (keys ``<model>_vs_<baseline>``) and against every scorer of another run
    (``others``: name → (its scores, aligned to ``scores``; its scorers); keys
    ``<model>_vs_<scorer>@<name>``), each metric (``metrics``; default: all both have) with
    ``diff``, ``ci_low``, ``ci_high``, ``verdict``. The one place comparisons are keyed and
    assembled: ``gmeta eval`` (``eval_report``) and the MovieLens example both call it."""
    comparisons: Dict[str, Dict] = {}
    for a in models:
        for b in baselines:
            comparisons[f"{a}_vs_{b}"] = compare(scores, a, b, boot, metrics)
        for name, (other, theirs) in (others or {}).items():
            for b in theirs:
                comparisons[f"{a}_vs_{b}@{name}"] = compare(scores, a, b, boot, metrics, other=other)
    return {**boot.to_json(), "users": len(scores.task_ids), "difference": "model - other (per metric)",
            "comparisons": comparisons}


def eval_report(scores: TaskScores, boot: Bootstrap,
                others: Optional[Dict[str, TaskScores]] = None) -> Dict[str, object]:
    """``gmeta eval``'s ``report``: each ``model`` scorer against the run's ``variant`` (itself
    before adapting) and every ``baseline``, and against the ``model`` scorers of each of
    ``others`` (name → its scores, aligned to ``scores``)."""
    theirs = {name: (other, other.named("model")) for name, other in (others or {}).items()}
    return report(scores, scores.named("model"), scores.named("variant") + scores.named("baseline"), boot, theirs)
