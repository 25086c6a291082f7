"""Feature statistics written to ``schema.json``.

Why a module of its own: the model sizes its embedding tables and normalizes dense inputs from
these numbers, so their definitions must be explicit and testable:

* ``cardinality`` = distinct ids among the *written* samples (all splits): what the tables
  will actually see;
* ``pooling`` = mean ids per sample (1.0 for a categorical), ``max_len`` = most ids in a sample;
* dense ``mean``/``std`` and ``label_stats`` come from the **train** split only, so nothing
  about valid/test tasks leaks into training. A constant column gets ``std`` 1.0 (not 0) so
  normalizing by it is always safe.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pyarrow as pa

# Access-count bins of the access-skew histogram, as the Meta DLRM embedding dataset describes
# tables: (0,1], (1,2], (2,4], ..., (16384,32768], (32768,inf). ``SKEW_EDGES[i]`` is the upper
# edge of bin i; the last bin is open.
SKEW_EDGES: Tuple[float, ...] = tuple(float(2 ** k) for k in range(16)) + (float("inf"),)
N_SKEW_BINS = len(SKEW_EDGES)  # 17


def skew_histogram(access_counts: np.ndarray) -> Tuple[float, ...]:
    """Share of distinct ids whose access count falls in each ``SKEW_EDGES`` bin (sums to 1)."""
    c = np.asarray(access_counts, dtype=np.float64)
    c = c[c > 0]
    idx = np.searchsorted(np.asarray(SKEW_EDGES), c, side="left")
    return skew_shares(np.bincount(idx, minlength=N_SKEW_BINS)[:N_SKEW_BINS])


def skew_shares(hist: np.ndarray) -> Tuple[float, ...]:
    """Bin counts of distinct ids → shares (all in the first bin when there is no id): what
    ``skew_histogram`` returns, from a histogram accumulated in pieces (``ooc.py``)."""
    hist = np.asarray(hist).astype(np.float64)
    if hist.sum() == 0:
        return tuple([1.0] + [0.0] * (N_SKEW_BINS - 1))
    return tuple(float(x) for x in hist / hist.sum())


def skew_from_histogram(hist: np.ndarray) -> List[float]:
    """``access_stats``'s rounded ``skew`` from bin counts."""
    return [round(x, 6) for x in skew_shares(hist)]


def categorical_stats(name: str, ids: np.ndarray, hashed: bool) -> Dict:
    return {"name": name, "cardinality": int(np.unique(ids).size), "hashed": bool(hashed), "pooling": 1.0}


def multi_hot_stats(name: str, lists: pa.ListArray, hashed: bool) -> Dict:
    lens = np.diff(lists.offsets.to_numpy())
    vals = lists.flatten().to_numpy(zero_copy_only=False)
    return {
        "name": name,
        "cardinality": int(np.unique(vals).size),
        "hashed": bool(hashed),
        "pooling": float(lens.mean()) if lens.size else 0.0,
        "max_len": int(lens.max()) if lens.size else 0,
    }


def _safe_std(x: np.ndarray) -> float:
    return safe_std_value(float(x.std()) if x.size else None)


def safe_std_value(std) -> float:
    """A standard deviation safe to divide by: 1.0 when there are no values or they are constant."""
    s = 1.0 if std is None else float(std)
    return s if s > 1e-12 else 1.0


def dense_stats(names: List[str], train_dense: np.ndarray) -> List[Dict]:
    x = train_dense.astype(np.float64)
    return [
        {"name": n, "mean": float(x[:, j].mean()) if x.shape[0] else 0.0, "std": _safe_std(x[:, j])}
        for j, n in enumerate(names)
    ]


def label_stats(train_labels: np.ndarray) -> Dict:
    """Mean and std standardise rating labels; min and max are the labels a model was trained
    on, which an export refuses to adapt to outside of (``export/manifest.py``)."""
    y = train_labels.astype(np.float64)
    return {"mean": float(y.mean()) if y.size else 0.0, "std": _safe_std(y),
            "min": float(y.min()) if y.size else 0.0, "max": float(y.max()) if y.size else 0.0}


def access_stats(ids: np.ndarray, n_samples: int) -> Dict:
    """What the sharding planner needs of one table, from every id lookup of the train split.

    ``rows``: distinct ids (what training inserts into the table; valid/test ids are looked
    up without insertion); ``pooling``: ids per sample; ``skew``: the share of distinct ids
    whose access count falls in each ``SKEW_EDGES`` bin (the Meta DLRM dataset's
    description of a table), from which a PS's cache behaviour can be predicted.
    """
    ids = np.asarray(ids, dtype=np.int64)
    _, counts = np.unique(ids, return_counts=True)
    return {
        "rows": int(counts.size),
        "pooling": float(ids.size / n_samples) if n_samples else 0.0,
        "lookups": int(ids.size),
        "skew": [round(x, 6) for x in skew_histogram(counts)],
    }
