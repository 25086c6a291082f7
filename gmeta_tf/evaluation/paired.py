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
interval.

Every comparison of a report is resampled in **one** ``stats.bootstrap`` call
(``paired_differences``): each comparison used its own call with the same seed, so all drew the
same user indices, and each materialized ``resamples × users`` copies of its four arrays (2,000 ×
27k users: 0.4 GB each, 3.1 GB peak and most of an eval's time). Now the indices are drawn once,
in batches of about ``_BATCH_CELLS / users`` resamples (SciPy's ``batch``: the same stream of
indices, so the same resamples), turned into per-resample user counts, and one matrix product
gives every scorer's ``Σ num`` and ``Σ den`` per resample: memory O(``_BATCH_CELLS``), not
O(resamples × users). The sums differ from summing the gathered values only by rounding (~1e-16
relative). A verdict reads the interval with the metric's direction: entirely on the good side
of 0 is "better", on the bad side "worse", straddling 0 "can't tell".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

from gmeta_tf.config.schema import metric_direction
from gmeta_tf.evaluation.metrics import pooled_from_sums
from gmeta_tf.evaluation.per_task import Parts, TaskScores, pooled

BETTER, WORSE, CANT_TELL = "better", "worse", "can't tell"

# Resampled users held at once by the batched bootstrap (resamples per batch × users): a few
# arrays of this many 8-byte cells, ~16 MB each, whatever the number of users.
_BATCH_CELLS = 1 << 21


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


def paired_differences(items: Sequence[Tuple[str, Parts, Parts]], boot: Bootstrap) -> List[Dict[str, object]]:
    """``paired_difference`` of each (metric, A's parts, B's parts), all on the same users, with
    one bootstrap for all (see the module doc): the same ``diff``, and the same resamples, so the
    same interval up to rounding."""
    sizes = {len(x) for _, a, b in items for x in (*a, *b)}
    if boot.method != "percentile" or len(sizes) > 1:  # other intervals call the statistic otherwise
        return [paired_difference(m, a, b, boot) for m, a, b in items]
    columns: Dict[int, int] = {}
    arrays: List[np.ndarray] = []

    def column(x) -> int:  # each scorer's array once, however many comparisons it is in
        if id(x) not in columns:
            columns[id(x)] = len(arrays)
            arrays.append(np.asarray(x, np.float64))
        return columns[id(x)]

    out: List[Dict[str, object]] = []
    live: List[Tuple[int, str, int, int, int, int]] = []
    for metric, a, b in items:
        a_num, a_den = (np.asarray(x, np.float64) for x in a)
        b_num, b_den = (np.asarray(x, np.float64) for x in b)
        diff = float(pooled(metric, a_num, a_den) - pooled(metric, b_num, b_den))
        out.append({"diff": diff, "ci_low": float("nan"), "ci_high": float("nan")})
        if a_num.size >= 2 and np.isfinite(diff):
            live.append((len(out) - 1, metric, column(a[0]), column(a[1]), column(b[0]), column(b[1])))
    if live:
        n = arrays[0].size
        table = np.column_stack(arrays)  # users × (each scorer's num and den)

        def statistic(i, axis=-1):
            sums = _resampled_sums(np.atleast_2d(i), table)
            return np.stack([pooled_from_sums(m, sums[:, an], sums[:, ad]) - pooled_from_sums(m, sums[:, bn], sums[:, bd])
                             for _, m, an, ad, bn, bd in live])

        res = stats.bootstrap((np.arange(n),), statistic, vectorized=True, n_resamples=boot.resamples,
                              confidence_level=boot.confidence, method=boot.method,
                              rng=np.random.default_rng(boot.seed), batch=max(1, _BATCH_CELLS // n))
        lows, highs = np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)
        for (k, *_), low, high in zip(live, lows, highs):
            out[k]["ci_low"], out[k]["ci_high"] = float(low), float(high)
    for (metric, _, _), r in zip(items, out):
        r["verdict"] = verdict(metric, r["ci_low"], r["ci_high"])
    return out


def _resampled_sums(i: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Each resample's column sums of ``table`` (``[resamples, columns]``): resample ``r`` takes
    users ``i[r]``, i.e. user ``u`` as often as it occurs in ``i[r]``."""
    rows, n = i.shape
    counts = np.bincount((i + np.arange(rows)[:, None] * n).reshape(-1), minlength=rows * n)
    return counts.reshape(rows, n).astype(np.float64) @ table


def compare(scores: TaskScores, a: str, b: str, boot: Bootstrap,
            metrics: Optional[Iterable[str]] = None, other: Optional[TaskScores] = None) -> Dict[str, Dict]:
    """Scorer ``a`` of ``scores`` against scorer ``b`` of ``other`` (default: of ``scores``),
    every metric both have; ``other`` must already be ``scores.aligned`` (same users, same order)."""
    items = _items(scores, a, b, metrics, other)
    return dict(zip((m for m, _, _ in items), paired_differences(items, boot)))


def _items(scores: TaskScores, a: str, b: str, metrics: Optional[Iterable[str]],
           other: Optional[TaskScores] = None) -> List[Tuple[str, Parts, Parts]]:
    other = other if other is not None else scores
    names = metrics if metrics is not None else scores.scorers[a].keys()
    return [(m, scores.scorers[a][m], other.scorers[b][m])
            for m in names if m in scores.scorers[a] and m in other.scorers[b]]


def report(scores: TaskScores, models: Sequence[str], baselines: Sequence[str], boot: Bootstrap,
           others: Optional[Dict[str, Tuple[TaskScores, Sequence[str]]]] = None, *,
           metrics: Optional[Iterable[str]] = None) -> Dict[str, object]:
    """The ``paired`` section of ``eval.json``: every scorer of ``models`` against every one of
    ``baselines`` (keys ``<model>_vs_<baseline>``) and against every scorer of another run
    (``others``: name → (its scores, aligned to ``scores``; its scorers); keys
    ``<model>_vs_<scorer>@<name>``), each metric (``metrics``; default: all both have) with
    ``diff``, ``ci_low``, ``ci_high``, ``verdict``. The one place comparisons are keyed and
    assembled: ``gmeta eval`` (``eval_report``) and the MovieLens example both call it."""
    metrics = list(metrics) if metrics is not None else None
    keyed: List[Tuple[str, List[Tuple[str, Parts, Parts]]]] = []
    for a in models:
        for b in baselines:
            keyed.append((f"{a}_vs_{b}", _items(scores, a, b, metrics)))
        for name, (other, theirs) in (others or {}).items():
            for b in theirs:
                keyed.append((f"{a}_vs_{b}@{name}", _items(scores, a, b, metrics, other)))
    results = iter(paired_differences([item for _, items in keyed for item in items], boot))
    comparisons = {key: {m: next(results) for m, _, _ in items} for key, items in keyed}
    return {**boot.to_json(), "users": len(scores.task_ids), "difference": "model - other (per metric)",
            "comparisons": comparisons}


def eval_report(scores: TaskScores, boot: Bootstrap,
                others: Optional[Dict[str, TaskScores]] = None) -> Dict[str, object]:
    """``gmeta eval``'s ``report``: each ``model`` scorer against the run's ``variant`` (itself
    before adapting) and every ``baseline``, and against the ``model`` scorers of each of
    ``others`` (name → its scores, aligned to ``scores``)."""
    theirs = {name: (other, other.named("model")) for name, other in (others or {}).items()}
    return report(scores, scores.named("model"), scores.named("variant") + scores.named("baseline"), boot, theirs)
