"""Synthetic embedding tables with the access skew of Meta's public DLRM dataset (2021, 856 tables).

Why: the calibration microbenchmark and the sharding benchmark need many realistic tables, and
what costs on a PS depends on the skew (how many *distinct* ids a step touches), not just on
rows and pooling. The dataset describes its tables in aggregate (``META_SKEW``): of the touched
rows, 47% are used once and take 7% of lookups; rows reused more than 8 times are 12% of rows
and take 72% of lookups; more than 32 times 2% / 49%; more than 128 times 0.4% / 36%.

Each table gets its own perturbation of those shares; its access counts are drawn per segment
(1, 2-8, 9-32, 33-128, >128) from a truncated power law whose exponent is solved so that the
segment carries its share of lookups. ``TableStats.skew`` is the histogram of those counts.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from gmeta_tf.plan.spec import TableStats, skew_histogram

# threshold -> (share of touched rows with count > threshold, share of lookups they take);
# threshold 1 is "used exactly once" (rows, lookups).
META_SKEW: Dict[str, Tuple[float, float]] = {
    "once": (0.47, 0.07), "gt8": (0.12, 0.72), "gt32": (0.02, 0.49), "gt128": (0.004, 0.36)}
DIMS = (4, 8, 16, 32, 64, 128)
SEGMENTS = ((1, 1), (2, 8), (9, 32), (33, 128), (129, 200_000))
SAMPLE_ROWS = 20_000  # access counts drawn per table (enough for the histogram's shares)


@dataclass(frozen=True)
class SyntheticTable:
    stats: TableStats
    counts: np.ndarray  # access counts of SAMPLE_ROWS representative ids (for checks)


@functools.lru_cache(maxsize=None)
def _grid(lo: float, hi: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integration grid of a segment, its spacing and floors: built once per segment, not once
    per bisection step (the suite's build spent most of its minute here)."""
    x = np.geomspace(lo, hi + 1, 2000)
    return x, np.gradient(x), np.floor(x)


def _power_law_mean(lo: float, hi: float, s: float) -> float:
    """Floored mean of p(x) ~ x^-s on the segment's grid (in place: the suite calls this 300,000 times)."""
    x, dx, floor = _grid(lo, hi)
    w = x ** (-s)
    w *= dx
    total = np.add.reduce(w)  # what np.sum does, without its dispatch
    w *= floor
    return float(np.add.reduce(w) / total)


SHARED_STEPS = 10  # bisection steps whose midpoints every solve of a segment visits alike


@functools.lru_cache(maxsize=None)
def _shared_mean(lo: float, hi: float, s: float) -> float:
    """``_power_law_mean`` at the first bisection steps' midpoints, computed once: every solve
    starts from the same interval, so the first steps' midpoints repeat across tables."""
    return _power_law_mean(lo, hi, s)


@functools.lru_cache(maxsize=None)
def _solve_exponent(lo: int, hi: int, mean: float) -> float:
    """Exponent s of p(x) ~ x^-s on [lo, hi+1) whose floored mean is ``mean`` (bisection; a pure
    function of its arguments, so remembered: the suite's second build in a test run is free)."""
    a, b = -4.0, 8.0  # larger s -> smaller mean
    for step in range(50):
        m = (a + b) / 2
        f = _shared_mean if step < SHARED_STEPS else _power_law_mean
        if f(lo, hi, m) > mean:
            a = m
        else:
            b = m
    return (a + b) / 2


def _draw_segment(rng, lo: int, hi: int, mean: float, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, np.int64)
    if lo == hi:
        return np.full(n, lo, np.int64)
    mean = float(np.clip(mean, lo * 1.05, hi * 0.7))
    s = _solve_exponent(lo, hi, mean)
    u = rng.random(n)
    a, b = float(lo), float(hi + 1)
    if abs(s - 1.0) < 1e-6:
        x = a * (b / a) ** u
    else:
        e = 1.0 - s
        x = (a ** e + u * (b ** e - a ** e)) ** (1.0 / e)
    return np.clip(np.floor(x), lo, hi).astype(np.int64)


def _jittered_profile(rng, jitter: float):
    """Per-segment (row share, lookup share), the Meta aggregate perturbed by ~``jitter``."""
    j = lambda v: v * float(np.exp(rng.normal(0.0, jitter)))  # noqa: E731
    r_once, l_once = j(META_SKEW["once"][0]), j(META_SKEW["once"][1])
    r8, l8 = j(META_SKEW["gt8"][0]), j(META_SKEW["gt8"][1])
    r32, l32 = min(j(META_SKEW["gt32"][0]), 0.5 * r8), min(j(META_SKEW["gt32"][1]), 0.9 * l8)
    r128, l128 = min(j(META_SKEW["gt128"][0]), 0.5 * r32), min(j(META_SKEW["gt128"][1]), 0.9 * l32)
    l8 = min(l8, 0.95 - l_once)
    r_once = min(r_once, 0.95 - r8)
    rows = np.array([r_once, 1 - r_once - r8, r8 - r32, r32 - r128, r128])
    looks = np.array([l_once, 1 - l_once - l8, l8 - l32, l32 - l128, l128])
    return rows, looks


def draw_counts(rng, n: int, jitter: float = 0.15) -> np.ndarray:
    """Access counts of ``n`` touched ids of one table."""
    rows, looks = _jittered_profile(rng, jitter)
    per_seg = np.floor(rows * n).astype(np.int64)
    per_seg[1] += n - per_seg.sum()
    mean_all = rows[0] / looks[0]  # count-1 ids: their lookup share is rows_share / mean count
    parts = [_draw_segment(rng, lo, hi, looks[k] * mean_all / rows[k], int(per_seg[k]))
             for k, (lo, hi) in enumerate(SEGMENTS)]
    return np.concatenate(parts)


def synthetic_table(name: str, rng, jitter: float = 0.15, dims=DIMS,
                    rows_range=(1e2, 1e7), pooling_range=(1.0, 30.0)) -> SyntheticTable:
    """One table: dim from ``dims``, log-uniform rows and pooling, Meta-like skew."""
    rows = int(round(10 ** rng.uniform(np.log10(rows_range[0]), np.log10(rows_range[1]))))
    dim = int(rng.choice(dims))
    pooling = float(np.round(np.exp(rng.uniform(np.log(pooling_range[0]), np.log(pooling_range[1]))), 2))
    counts = draw_counts(rng, SAMPLE_ROWS, jitter)
    stats = TableStats(name=name, rows=rows, dim=dim, pooling=pooling, skew=skew_histogram(counts))
    return SyntheticTable(stats, counts)


def synthetic_tables(n: int, seed: int, prefix: str = "t", **kw) -> List[SyntheticTable]:
    rng = np.random.default_rng(seed)
    return [synthetic_table(f"{prefix}{i:02d}", rng, **kw) for i in range(n)]


def skew_shares(counts: np.ndarray) -> Dict[str, Tuple[float, float]]:
    """The Meta statistics of a set of access counts: (row share, lookup share) per threshold."""
    c = np.asarray(counts, dtype=np.float64)
    total = c.sum()
    out = {"once": (float(np.mean(c == 1)), float(c[c == 1].sum() / total))}
    for t in (8, 32, 128):
        m = c > t
        out[f"gt{t}"] = (float(np.mean(m)), float(c[m].sum() / total))
    return out
