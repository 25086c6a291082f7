"""From a table's access-skew histogram to what one training step does to it.

Why its own module: the cost model (its features), the calibration microbenchmark (the ids it
sends) and the synthetic benchmark tables must all read a histogram the same way, or the model
would be fitted on one access pattern and asked about another.

The histogram (``spec.skew_histogram``) only gives the share of a table's ids per access-count
bin. We read it as: every id of bin ``b`` was accessed ``BIN_COUNT[b]`` times over the data, so
one looked-up id is an id of bin ``b`` with probability ``skew[b] * BIN_COUNT[b] / mean_count``,
uniformly among that bin's ids. A step draws ``pooling * samples_per_step`` ids this way.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from gmeta_tf.plan.spec import N_SKEW_BINS, SKEW_EDGES


def _bin_counts() -> np.ndarray:
    """Mean access count of an id in each bin: bin (a, 2a] holds the integers a+1..2a."""
    out = [1.0]
    for k in range(1, N_SKEW_BINS - 1):
        a = SKEW_EDGES[k - 1]
        out.append((3 * a + 1) / 2)
    out.append(2 * SKEW_EDGES[-2])  # the open bin (32768, inf)
    return np.asarray(out)


BIN_COUNT = _bin_counts()


def lookup_shares(skew: Sequence[float]) -> np.ndarray:
    """Share of all lookups that go to ids of each bin."""
    w = np.asarray(skew, dtype=np.float64) * BIN_COUNT
    return w / w.sum()


def mean_count(skew: Sequence[float]) -> float:
    """Mean accesses per id over the data (lookups / distinct ids)."""
    return float(np.dot(np.asarray(skew, dtype=np.float64), BIN_COUNT))


def lookups_per_step(pooling: float, samples_per_step: int) -> int:
    return max(1, int(round(pooling * samples_per_step)))


def expected_distinct(rows: int, skew: Sequence[float], n: float) -> float:
    """Expected distinct ids among ``n`` draws of ``IdSampler`` (Poisson approximation per id)."""
    per_bin = bin_rows(max(int(rows), 1), skew).astype(np.float64)
    w = np.asarray(skew, dtype=np.float64) * BIN_COUNT * (per_bin > 0)
    share = w / w.sum()  # of the lookups, per bin; spread evenly over the bin's ids
    safe = np.maximum(per_bin, 1.0)
    return float(np.sum(per_bin * -np.expm1(-n * share / safe)))


def bin_rows(rows: int, skew: Sequence[float]) -> np.ndarray:
    """Integer ids per bin (largest remainder, summing to ``rows``)."""
    s = np.asarray(skew, dtype=np.float64)
    exact = s / s.sum() * rows
    out = np.floor(exact).astype(np.int64)
    rest = rows - int(out.sum())
    if rest > 0:
        out[np.argsort(-(exact - out), kind="stable")[:rest]] += 1
    return out


class IdSampler:
    """Draws one step's ids of one table (or shard) with the histogram's access pattern.

    Ids of bin ``b`` are the contiguous range ``[start_b, start_b + rows_b)``; ids are then
    scrambled by an odd multiplier so hot ids are not small, dense keys.
    """

    def __init__(self, rows: int, skew: Sequence[float], seed: int = 0):
        self.rows_per_bin = bin_rows(max(int(rows), 1), skew)
        w = np.asarray(skew, dtype=np.float64) * BIN_COUNT * (self.rows_per_bin > 0)
        self.p = w / w.sum()
        self.start = np.concatenate([[0], np.cumsum(self.rows_per_bin)[:-1]])
        self.rng = np.random.default_rng(seed)

    def draw(self, n: int) -> np.ndarray:
        b = self.rng.choice(N_SKEW_BINS, size=n, p=self.p)
        ids = self.start[b] + np.floor(self.rng.random(n) * self.rows_per_bin[b]).astype(np.int64)
        return (ids * 0x9E3779B1 + 1) & ((1 << 62) - 1)
