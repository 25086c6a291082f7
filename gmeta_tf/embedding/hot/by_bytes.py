"""Which rows pay for being hot, by the bytes they put on a worker's link (``hot.select: bytes``).

Issue 41 measured the split sending *more* bytes than it saves: a hot row costs a gradient
exchange with every peer at every sync, while as a cold row it costs the PS traffic only when
this worker touches it. So a row is hot only where its expected touches save more bytes than
its sync costs, for the job's worker count ``W``, sync interval ``k`` (``model.hot_sync_every``)
and wire dtype (HugeCTR's hybrid-embedding split of frequent and infrequent categories, written
for this trainer's flows: a PS read/write instead of an all-to-all, a gradient all-gather or
all-reduce between workers).

A row of a table with ``dim`` values, looked up with probability ``p`` per lookup (its count
over the profile's lookups), ``n`` lookups per worker step (``rows.lookups_per_step``), ``b``
bytes a value on the wire (4; 2 with ``cluster.wire_dtype: bfloat16``), ``key = 8`` (the PS's
int64 key), ``id = 4`` (the int32 slot a hot gradient carries, ``wire.pack``). Touches are
Poisson, as in ``auto.expected_distinct``: this worker touches the row in one step with
``q1 = 1 - exp(-n p)`` and in a window of ``k`` steps with ``qk = 1 - exp(-k n p)``. All costs
are bytes on one worker's link per worker step, sent plus received:

* **cold**: when touched, read once (key out, value back) and written once (key and gradient
  out), ``plan.network.row_payload_bytes``::

      cold(p) = q1 · 2 · (dim·b + key)

* **hot, sparse all-gather** (``hot/sync.py``): once a window, this worker sends the row's
  gradient and slot to each of the ``W - 1`` peers if it touched it, and receives one from each
  peer that did (each with ``qk``); spread over the window's ``k`` steps::

      sparse(p) = 2 · (W - 1) · qk · (dim·b + id) / k

* **hot, dense all-reduce**: the row is one line of the ``[K, dim + 1]`` tensor whatever the
  touches, a ring sending and receiving ``2·(W-1)/W`` of it once a window::

      dense = 2 · 2·(W-1)/W · (dim + 1)·b / k

A table's hot rows go one way or the other (``sync.choose_mode``, per table), so per table the
rule keeps the better of two sets: the rows with ``cold(p) > sparse(p)`` or those with
``cold(p) > dense``, whichever saves more bytes in total (``Σ cold - Σ hot`` over its rows).
Both sets are a prefix of the table's profile (decreasing count): ``cold - dense`` grows with
``p``, and ``cold > sparse`` iff ``k·q1/qk > (W-1)·(dim·b + id)/(dim·b + key)``, whose left
side grows with ``p`` from 1 (rare rows) to ``k`` (rows touched every step). With ``W = 1``
nothing crosses a link and every row pays. What it implies:

* ``k = 1``: sparse pays for every row at ``W = 2`` (``dim·b + 8 > dim·b + 4``, a margin of the
  key's width) and for none at ``W >= 3``; dense pays only for rows touched almost every step
  (``q1 > 2(W-1)/W · (dim+1)·b / (dim·b + 8)``: 0.94 at ``W = 2``, dim 16, float32; never at
  ``W >= 4``);
* a larger ``k`` divides both hot costs by up to ``k`` (sparse by ``k·q1/qk``), so more rows pay;
* bfloat16 halves the value bytes on both sides but not the key/id bytes, so it shifts the
  thresholds: sparse's ratio moves from ``(dim·4 + 4)/(dim·4 + 8)`` to ``(dim·2 + 4)/(dim·2 + 8)``.

Within ``hot.budget`` the paying rows are then taken as before (``select.select_hot``: lookups
per byte of worker memory, across tables), so a row is hot iff it pays *and* fits. Whatever the
budget leaves out, the rows kept still each save bytes under either mode, and
``sync.choose_mode`` then picks the cheaper one for the set kept, which saves at least as much.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping

import numpy as np

from gmeta_tf.embedding.hot.sync import dense_cost, sparse_cost
from gmeta_tf.plan.network import row_payload_bytes


class RowRuleError(ValueError):
    """Inputs the rule cannot price (no workers, a window under one step)."""


def cold_bytes(p: np.ndarray, n: float, dim: int, value_bytes: int = 4) -> np.ndarray:
    """``q1 · 2·(dim·b + key)`` per row and worker step."""
    return -np.expm1(-n * np.asarray(p, np.float64)) * row_payload_bytes(dim, value_bytes)


def sparse_bytes(p: np.ndarray, n: float, dim: int, workers: int, every: int, value_bytes: int = 4) -> np.ndarray:
    """``2·(W-1)·qk·(dim·b + id) / k`` per row and worker step (``sync.sparse_cost`` both ways)."""
    qk = -np.expm1(-every * n * np.asarray(p, np.float64))
    return 2.0 * sparse_cost(1.0, dim, workers, value_bytes) * qk / every


def dense_bytes(dim: int, workers: int, every: int, value_bytes: int = 4) -> float:
    """``2 · 2·(W-1)/W·(dim+1)·b / k`` per row and worker step (``sync.dense_cost`` both ways)."""
    return 2.0 * dense_cost(1, dim, workers, value_bytes) / every


@dataclass(frozen=True)
class TablePay:
    """The rows of one table that pay for being hot: the first ``rows`` of its profile."""

    table: str
    rows: int
    mode: str  # "sparse" | "dense" | "local" (one worker): the exchange the rule priced
    cold_bytes: float  # what those rows cost per worker step as cold rows
    hot_bytes: float  # and as hot rows, in ``mode``

    @property
    def saved_bytes(self) -> float:
        return self.cold_bytes - self.hot_bytes


def table_pay(name: str, counts: np.ndarray, lookups: int, n: float, dim: int, workers: int, every: int,
              value_bytes: int = 4) -> TablePay:
    """The paying prefix of one table's profile (``counts`` decreasing), in its better mode."""
    if workers < 1 or every < 1:
        raise RowRuleError(f"hot rows by bytes: need workers >= 1 and every >= 1, got {workers}, {every}")
    counts = np.asarray(counts, np.float64)
    if lookups <= 0 or n <= 0 or not counts.size:
        return TablePay(name, 0, "local" if workers == 1 else "sparse", 0.0, 0.0)
    p = counts / lookups
    cold = cold_bytes(p, n, dim, value_bytes)
    if workers == 1:  # nothing crosses a link: every row with a lookup pays
        m = int(np.count_nonzero(cold > 0))
        return TablePay(name, m, "local", float(cold[:m].sum()), 0.0)
    best = TablePay(name, 0, "sparse", 0.0, 0.0)
    for mode, hot in (("sparse", sparse_bytes(p, n, dim, workers, every, value_bytes)),
                      ("dense", np.full(p.shape, dense_bytes(dim, workers, every, value_bytes)))):
        pays = cold > hot
        m = int(np.argmin(pays)) if not pays.all() else int(pays.size)  # a prefix (module docstring)
        got = TablePay(name, m, mode, float(cold[:m].sum()), float(hot[:m].sum()))
        if got.saved_bytes > best.saved_bytes:
            best = got
    return best


def paying_rows(profiles: Mapping, dims: Mapping[str, int], lookups_per_step: Mapping[str, float], workers: int,
                every: int, value_bytes: int = 4, min_count: int = 1) -> Dict[str, TablePay]:
    """``table_pay`` for every profiled table (rows seen fewer than ``min_count`` times never pay)."""
    out = {}
    for name, dim in dims.items():
        prof = profiles.get(name)
        if prof is None:
            continue
        counts = np.asarray(prof.counts, np.int64)
        counts = counts[counts >= min_count]
        out[name] = table_pay(name, counts, int(prof.lookups), float(lookups_per_step.get(name, 0)), dim,
                              workers, every, value_bytes)
    return out
