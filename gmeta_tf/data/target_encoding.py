"""Target encoding and id counts of categorical features, fitted on the train split at prepare time.

Why: a cold user's query is full of items that only a handful of training users rated. Their
embedding rows are trained on those few ratings and mostly memorise them, while the number a
recommender engineer reaches for first -- the item's mean rating, shrunk toward the global mean
when it rests on few ratings -- is exactly what such a row cannot learn. Target encoding hands
that number (and how much evidence it rests on) to the model as two dense features per sample:

    mean      = (sum + k·g) / (n + k) − g          k = ``prepare.target_encoding_prior``
    log_count = log(1 + n)                           g = mean label of the train split

``sum`` and ``n`` are the id's label sum and sample count over every train task's support and
query samples as written (the same samples ``gmeta eval``'s baselines are fitted on). For a
sample of a **train** task its own label is left out (``sum − y``, ``n − 1``): otherwise the
feature contains the target and the model learns to trust it, which it cannot do on a cold user.
Valid and test samples use the full train statistics, an id never seen in training gets
``mean`` 0 and ``log_count`` 0. No valid or test label is ever read. For clicks ``mean`` is
the shrunk CTR minus the global CTR.

The fitted tables are written next to the data (``target_encoding/<col>.npz``: ``ids``, ``sums``,
``counts``) so that an exported model can compute the same features from an id alone; and every
categorical / multi-hot feature's train-split id counts go to ``id_counts/<col>.npz`` (``ids``,
``counts``) for ``data.min_id_count`` (rare ids, read in Meta-IO). See ``task_format.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from gmeta_tf.errors import DataError

TE_DIR = "target_encoding"
ID_COUNTS_DIR = "id_counts"


def feature_names(column: str) -> List[str]:
    """The two dense feature names target encoding adds for ``column``, in order."""
    return [f"te.{column}.mean", f"te.{column}.log_count"]


@dataclass(frozen=True)
class TargetTable:
    """Label sums and counts per id over the train split (ids sorted, for searchsorted)."""

    column: str
    ids: np.ndarray  # int64, sorted, unique
    sums: np.ndarray  # float64
    counts: np.ndarray  # int64
    global_mean: float
    prior: float

    def features(self, ids: np.ndarray, labels: np.ndarray, leave_out: np.ndarray) -> np.ndarray:
        """``[n, 2]`` float32 (mean, log_count) for samples ``ids``; where ``leave_out`` the
        sample's own ``labels`` are taken out of its id's statistics (train samples)."""
        s, n = lookup(self.ids, self.sums, self.counts, ids)
        return features_from(s, n, labels, leave_out, self.global_mean, self.prior)


def features_from(s: np.ndarray, n: np.ndarray, labels: np.ndarray, leave_out: np.ndarray, g: float,
                  k: float) -> np.ndarray:
    """``TargetTable.features`` from each sample's looked-up id ``s`` (label sum) and ``n`` (count):
    the one formula both prepare engines use."""
    leave_out = np.asarray(leave_out, bool)
    s = s - np.where(leave_out, np.asarray(labels, np.float64), 0.0)
    n = n - leave_out.astype(np.int64)
    mean = (s + k * g) / (n + k) - g
    return np.stack([mean, np.log1p(n)], axis=1).astype(np.float32)


def lookup(ids: np.ndarray, sums: np.ndarray, counts: np.ndarray, query: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(sum, count) per ``query`` id in a sorted table; 0, 0 for an id not in it."""
    query = np.asarray(query, np.int64)
    if ids.size == 0:
        return np.zeros(query.shape), np.zeros(query.shape, np.int64)
    pos = np.minimum(np.searchsorted(ids, query), ids.size - 1)
    found = ids[pos] == query
    return np.where(found, sums[pos], 0.0), np.where(found, counts[pos], 0)


def count_ids(ids: np.ndarray, labels: np.ndarray = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted unique ids, label sums, counts) of ``ids`` (sums are 0 without ``labels``)."""
    u, inv = np.unique(np.asarray(ids, np.int64), return_inverse=True)
    inv = inv.reshape(-1)
    w = None if labels is None else np.asarray(labels, np.float64)
    sums = np.bincount(inv, weights=w, minlength=u.size) if w is not None else np.zeros(u.size)
    return u, sums.astype(np.float64), np.bincount(inv, minlength=u.size).astype(np.int64)


def fit(column: str, train_ids: np.ndarray, train_labels: np.ndarray, prior: float) -> TargetTable:
    ids, sums, counts = count_ids(train_ids, train_labels)
    g = float(np.mean(np.asarray(train_labels, np.float64))) if len(train_labels) else 0.0
    return TargetTable(column, ids, sums, counts, g, float(prior))


def check_columns(columns: Sequence[str], categorical: Sequence[str], dense: Sequence[str]) -> None:
    """``prepare.target_encoding`` must name categorical features whose new names are free."""
    for col in columns:
        if col not in categorical:
            raise DataError(
                f"prepare.target_encoding: '{col}' is not a categorical feature "
                f"(categorical: {', '.join(categorical) or 'none'})"
            )
        taken = [n for n in feature_names(col) if n in dense]
        if taken:
            raise DataError(f"prepare.target_encoding: '{col}' would add dense feature '{taken[0]}', "
                            "which is already an input dense column; rename that column")


def encode(
    columns: Sequence[str], cats: Dict[str, np.ndarray], labels: np.ndarray, train_rows: np.ndarray, prior: float
) -> Tuple[np.ndarray, List[str], List[TargetTable]]:
    """Features for every sample (row-aligned with ``labels``): ``[N, 2·len(columns)]``, their
    names, and the fitted tables. ``train_rows``: indices of the train split's written samples,
    the only labels read, and the samples whose own label is left out."""
    is_train = np.zeros(labels.shape[0], bool)
    is_train[train_rows] = True
    blocks, names, tables = [], [], []
    for col in columns:
        table = fit(col, cats[col][train_rows], labels[train_rows], prior)
        blocks.append(table.features(cats[col], np.where(is_train, labels, 0.0), is_train))
        names += feature_names(col)
        tables.append(table)
    out = np.concatenate(blocks, axis=1) if blocks else np.zeros((labels.shape[0], 0), np.float32)
    return out, names, tables


def write_tables(root: Path, tables: Sequence[TargetTable]) -> List[Dict]:
    """``target_encoding/<col>.npz`` per table; returns the ``schema.json`` entries."""
    entries = []
    if tables:
        (root / TE_DIR).mkdir()
    for t in tables:
        rel = f"{TE_DIR}/{t.column}.npz"
        np.savez(root / rel, ids=t.ids, sums=t.sums, counts=t.counts)
        entries.append({"column": t.column, "prior": t.prior, "global_mean": t.global_mean,
                        "features": feature_names(t.column), "file": rel})
    return entries


def write_id_counts(root: Path, train_ids: Dict[str, np.ndarray]) -> Dict[str, str]:
    """``id_counts/<col>.npz`` (``ids``, ``counts``) per feature; returns ``{col: file}``."""
    (root / ID_COUNTS_DIR).mkdir()
    files = {}
    for col, ids in train_ids.items():
        u, _, counts = count_ids(ids)
        rel = f"{ID_COUNTS_DIR}/{col}.npz"
        np.savez(root / rel, ids=u, counts=counts)
        files[col] = rel
    return files
