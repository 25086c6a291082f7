"""``model.hot_split: auto``: keep the hot/cold split only where the network makes it pay.

The split trades bytes for CPU: cold rows still go to the PS, hot rows are served and updated
on the worker, and their gradients are all-reduced between workers. On loopback bytes are free
and the split's own work makes the step slower (make bench: 0.88x); on a slow link the bytes it
saves dominate. The decision compares two predicted worker steps, per worker:

    off:  compute                    + link(PS bytes, all rows)
    on:   compute x (1 + overhead)   + link(PS bytes, cold rows; + the hot all-reduce)

* PS bytes: for each table, the expected distinct ids of one step's ``n`` lookups under the id
  profile's frequencies (``1 - exp(-n p)`` per profiled id; the unprofiled tail counted as all
  distinct), each read and written once (``plan.network.row_payload_bytes``: slots stay on the
  PS). ``n`` is the step's lookup bound (``rows.touched_bounds``: exact for single-id features,
  an upper bound for multi-hot). A table served wholly by hot rows sends nothing.
* the all-reduce: what ``hot/sync.py`` chose per table (dense or sparse), each worker sending
  and receiving that many bytes;
* the link is full duplex, so a direction carries half the PS payload (plus the all-reduce); a
  PS's link carries ``workers / ps`` workers' share: the slower of the two sets the time;
* ``compute`` and ``overhead``: the step on unshaped links and the split's extra CPU there, both
  measured by make bench's ``network`` section on this project's 2-core box (docs/network.md).
  A faster worker (a GPU) has a smaller ``compute``, so bytes weigh more: pass its step time.

Without a link rate (``cluster.link_rate`` unset: loopback) bytes cost nothing and only the
overhead is left, so ``auto`` keeps the split off there.

Under ``auto`` the hot set itself is chosen by bytes (``hot.select: auto`` -> ``bytes``,
``hot/by_bytes.py``): only rows that save more link bytes than their sync costs are hot, so the
verdict is off when no row pays (``hot_rows = 0``), whatever the link. The verdict states its
bytes: per worker step on the worker's link, sent plus received, ``PS payload`` without the
split against ``PS payload of the cold rows + 2 x the hot exchange`` with it (the exchange
receives what it sends), and how many rows are hot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

import numpy as np

from gmeta_tf.plan.network import VALUE_BYTES, Link, row_payload_bytes

# The default path's worker step on unshaped links (make bench network, bridge, 2 workers + 2 PS:
# 67.2 ms) and the split's extra CPU there (make bench hot_split, loopback: 0.88x, i.e. +14%,
# taken as 10%: the network section's single bridge run saw 1.30x, within its noise).
# docs/network.md.
COMPUTE_MS = 67.0
SPLIT_OVERHEAD = 0.10


@dataclass(frozen=True)
class SplitDecision:
    on: bool
    step_ms_off: float
    step_ms_on: float
    ps_bytes_off: float  # payload per worker step
    ps_bytes_on: float
    allreduce_bytes: float  # what a worker sends in the hot exchange, per step
    hot_rows: Optional[int] = None  # rows the split would keep hot (None: not counted)

    @property
    def link_bytes_off(self) -> float:
        """Bytes per worker step on its link without the split (sent + received)."""
        return self.ps_bytes_off

    @property
    def link_bytes_on(self) -> float:
        """With it: the cold rows' PS payload plus the hot exchange, sent and received."""
        return self.ps_bytes_on + 2.0 * self.allreduce_bytes

    def format(self, rate: Optional[str]) -> str:
        link = f"link {rate}" if rate else "no link rate (loopback: bytes are free)"
        verdict = "on" if self.on else "off"
        rows = "" if self.hot_rows is None else f", {self.hot_rows:,} rows hot"
        nothing = "; no row saves bytes as a hot row" if self.hot_rows == 0 else ""
        return (f"hot split auto: {verdict} ({link}{nothing}; predicted step {self.step_ms_on:.1f} ms with the split "
                f"vs {self.step_ms_off:.1f} ms without; PS payload {self.ps_bytes_on:,.0f} vs "
                f"{self.ps_bytes_off:,.0f} B/step, hot all-reduce {self.allreduce_bytes:,.0f} B/step; link bytes per "
                f"worker step {self.link_bytes_on:,.0f} with the split vs {self.link_bytes_off:,.0f} without{rows})")


def expected_distinct(counts: np.ndarray, lookups: int, n: float, tail: Optional[float] = None) -> float:
    """Distinct ids among ``n`` lookups drawn with the profiled frequencies (Poisson per id);
    ``tail``, the share of lookups outside the profile (default: what ``counts`` leave), counts
    as all distinct."""
    if lookups <= 0 or n <= 0:
        return 0.0
    p = np.asarray(counts, dtype=np.float64) / lookups
    if tail is None:
        tail = max(0.0, 1.0 - float(p.sum()))
    return float(np.sum(-np.expm1(-n * p))) + n * tail


def ps_payload(profiles: Mapping, dims: Mapping[str, int], lookups_per_step: Mapping[str, int],
               hot_ids: Optional[Mapping[str, np.ndarray]] = None,
               local_only: Optional[Mapping[str, bool]] = None, value_bytes: int = VALUE_BYTES) -> float:
    """Payload bytes per worker step to and from the PS; with ``hot_ids``, of the cold rows only.
    ``value_bytes``: a float's bytes on the wire (``cluster.wire_dtype``)."""
    total = 0.0
    for name, dim in dims.items():
        prof = profiles.get(name)
        n = float(lookups_per_step.get(name, 0))
        if prof is None:
            total += n * row_payload_bytes(dim, value_bytes)  # no profile: every lookup a distinct row
            continue
        if local_only and local_only.get(name):
            continue
        counts = np.asarray(prof.counts)
        tail = max(0.0, 1.0 - float(counts.sum()) / prof.lookups) if prof.lookups else 0.0  # never hot
        if hot_ids is not None and name in hot_ids and len(hot_ids[name]):
            counts = counts[~np.isin(np.asarray(prof.ids), hot_ids[name])]
        total += expected_distinct(counts, prof.lookups, n, tail) * row_payload_bytes(dim, value_bytes)
    return total


def decide(ps_bytes_off: float, ps_bytes_on: float, allreduce_bytes: float, link: Link, workers: int, ps: int,
           compute_ms: float = COMPUTE_MS, overhead: float = SPLIT_OVERHEAD,
           hot_rows: Optional[int] = None) -> SplitDecision:
    """Predicted steps with and without the split; on where it is faster (ties: off) and, with
    ``hot_rows`` given, where there is a hot row at all."""
    share = workers / max(ps, 1)  # workers' traffic each PS link carries

    def link_ms(ps_bytes: float, allreduce: float) -> float:
        return max(link.ms(ps_bytes / 2 + allreduce), link.ms(ps_bytes * share / 2))

    off = compute_ms + link_ms(ps_bytes_off, 0.0)
    on = compute_ms * (1.0 + overhead) + link_ms(ps_bytes_on, allreduce_bytes)
    return SplitDecision(on=on < off and math.isfinite(on) and hot_rows != 0, step_ms_off=off, step_ms_on=on,
                         ps_bytes_off=ps_bytes_off, ps_bytes_on=ps_bytes_on, allreduce_bytes=allreduce_bytes,
                         hot_rows=hot_rows)


def hot_touched(profiles: Mapping, hot_ids: Mapping[str, np.ndarray], lookups_per_step: Mapping[str, float]
                ) -> Dict[str, float]:
    """Expected distinct hot ids one step touches per table (what a sparse all-gather sends)."""
    out = {}
    for name, ids in hot_ids.items():
        prof = profiles.get(name)
        if prof is None or not len(ids):
            continue
        counts = np.asarray(prof.counts)[np.isin(np.asarray(prof.ids), ids)]
        out[name] = expected_distinct(counts, prof.lookups, float(lookups_per_step.get(name, 0)), tail=0.0)
    return out


def allreduce_bytes(modes: Mapping[str, str], sizes: Mapping[str, int], dims: Mapping[str, int],
                    touched: Mapping[str, float], workers: int, value_bytes: int = VALUE_BYTES) -> float:
    """Bytes each worker sends per step in the hot rows' gradient exchange, with ``hot/sync.py``'s
    per-table choice: a dense all-reduce moves the whole ``[K, dim + 1]`` table, a sparse
    all-gather the rows the step touched (``touched``, expected); it receives as many."""
    from gmeta_tf.embedding.hot.sync import dense_cost, sparse_cost

    total = 0.0
    for t, mode in modes.items():
        if mode == "dense":
            total += dense_cost(sizes[t], dims[t], workers, value_bytes)
        elif mode == "sparse":
            total += sparse_cost(touched.get(t, 0.0), dims[t], workers, value_bytes)
    return total
