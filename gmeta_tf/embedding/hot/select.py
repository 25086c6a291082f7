"""Which rows are hot: the most lookups per byte of worker memory, across all tables.

A hot row costs ``optimizers.row_bytes``: its value plus as much again per optimizer slot, because its optimizer state lives on the worker
with it. The value of a row is the lookups it serves (its count in the id profile), so the
best use of a budget is the rows with the highest ``count / bytes``: one merged ranking over
all tables, taken greedily while it fits. With equal row sizes this is optimal (a fractional
knapsack with unit items); with different dims per table it is the classic greedy, off by at
most one row's value. Coverage can only grow with the budget: a larger budget takes a longer
prefix of the same ranking.

``cap`` (``hot.select: bytes``, ``hot/by_bytes.py``): per table, only the first ``cap[t]`` ids
of its profile (the ones that save link bytes as hot rows) may be taken; the ranking within the
budget is the same.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

import numpy as np

from gmeta_tf.data.id_profile import TableProfile
from gmeta_tf.embedding.optimizers import row_bytes


@dataclass
class HotSet:
    """Hot ids per table (decreasing count: slot i holds ``ids[table][i]``) and what they buy."""

    ids: Dict[str, np.ndarray]
    covered: Dict[str, int]  # profiled lookups the hot rows serve
    lookups: Dict[str, int]  # profiled lookups per table
    bytes_used: int
    budget: int
    # Tables whose hot rows are every id of the train split (a complete profile): served
    # without the PS in training steps (``HotColdTable(local_only=True)``); validation's
    # read-only lookups still read new users' ids from it.
    local_only: Dict[str, bool] = field(default_factory=dict)

    def coverage(self, table: str) -> float:
        return self.covered[table] / self.lookups[table] if self.lookups.get(table) else 0.0

    @property
    def total_coverage(self) -> float:
        total = sum(self.lookups.values())
        return sum(self.covered.values()) / total if total else 0.0

    @property
    def rows(self) -> int:
        return int(sum(len(v) for v in self.ids.values()))

    def format(self) -> str:
        lines = [f"hot set: {self.rows:,} rows, {self.bytes_used / 2**20:.2f} MiB of "
                 f"{self.budget / 2**20:.2f} MiB per worker (values + optimizer slots), "
                 f"covers {self.total_coverage:.1%} of profiled lookups"]
        for t in self.ids:
            where = "  (every train id: no PS lookups)" if self.local_only.get(t) else ""
            lines.append(f"  {t:<16} {len(self.ids[t]):>9,} rows  {self.coverage(t):6.1%} of its lookups{where}")
        return "\n".join(lines)


def select_hot(profiles: Dict[str, TableProfile], dims: Dict[str, int], optimizer: str,
               budget: int, min_count: int = 1, cap: Optional[Mapping[str, int]] = None) -> HotSet:
    """Greedy by lookups per byte over every table's profiled ids, within ``budget`` bytes
    (and, with ``cap``, within each table's first ``cap[t]`` ids)."""
    names = [t for t in dims if t in profiles]
    lookups = {t: int(profiles[t].lookups) for t in names}
    empty = {t: np.zeros(0, np.int64) for t in names}
    if budget <= 0 or not names:
        return HotSet(empty, {t: 0 for t in names}, lookups, 0, budget)
    counts, sizes, owner, rank = [], [], [], []
    for k, t in enumerate(names):
        c = np.asarray(profiles[t].counts, np.int64)
        c = c[c >= min_count]
        if cap is not None:
            c = c[: max(0, int(cap.get(t, 0)))]
        counts.append(c)
        sizes.append(np.full(c.size, row_bytes(dims[t], optimizer), np.int64))
        owner.append(np.full(c.size, k, np.int64))
        rank.append(np.arange(c.size))
    counts, sizes = np.concatenate(counts), np.concatenate(sizes)
    owner, rank = np.concatenate(owner), np.concatenate(rank)
    # Highest count per byte first; ties broken by table order then profile order, so every
    # worker computes the same set from the same file.
    order = np.lexsort((rank, owner, -(counts / sizes)))
    fits = np.cumsum(sizes[order]) <= budget
    chosen = order[fits] if fits.all() else order[: int(np.argmin(fits))]
    ids, covered, local_only = {}, {}, {}
    for k, t in enumerate(names):
        r = np.sort(rank[chosen][owner[chosen] == k])  # a prefix of the table's ranking
        ids[t] = np.asarray(profiles[t].ids, np.int64)[r]
        covered[t] = int(np.asarray(profiles[t].counts, np.int64)[r].sum())
        local_only[t] = bool(profiles[t].complete) and len(r) == len(profiles[t].ids) > 0
    return HotSet(ids, covered, lookups, int(sizes[chosen].sum()), budget, local_only)
