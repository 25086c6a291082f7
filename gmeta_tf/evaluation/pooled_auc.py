"""``auc_pooled`` (every user's query samples ranked together) without keeping the samples.

Exact streaming equivalent of sklearn's ``roc_auc_score`` over all (clipped) samples: the AUC
depends on the samples only through, per distinct score, how many samples and how many
positives have it. Each added chunk becomes such a histogram; the pending histograms are merged
into one whenever they outgrow it (amortized n log n). AUC = Σ_v pos_v · (negatives below v +
neg_v / 2) / (P·N), summed in integers (twice the statistic), in score order.

Why it spills: the histogram has one entry per distinct score, and a model's float32 scores are
nearly all distinct, so it grows with the users scored (12 B per query sample and scorer: ~50 MB
per model scorer at 270k users, and the merges' sorts twice that). Past ``SPILL_AT`` distinct
scores in memory the merged histogram goes to a Parquet file in a temporary directory, and the
value is DuckDB's ``GROUP BY score ORDER BY score`` over those files (out of core under
``MEMORY_LIMIT``), summed batch by batch with the negatives below carried across batches: the
same integers in the same order, so the same AUC, in memory that does not grow with the users.
"""
from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from gmeta_tf.evaluation.metrics import _CLIP, positive

MEMORY_LIMIT = "256MB"  # DuckDB's, for the spilled histograms' group-by and sort


class PooledAUC:
    MERGE_AT = 1 << 16  # pending distinct scores that always trigger a merge
    SPILL_AT = 1 << 21  # distinct scores held in memory (~24 MB); past it, the merged ones go to disk

    def __init__(self) -> None:
        self._parts: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._merged = 0  # distinct scores in the first part, once merged
        self._pending = 0
        self._samples = 0
        self._spill: Optional[Path] = None  # the directory of spilled histograms, once there is one
        self._spilled = 0

    def _count_dtype(self):
        """int32 counts (12 B per distinct float32 score, not 24) until a count could pass 2^31."""
        return np.int32 if self._samples < np.iinfo(np.int32).max else np.int64

    def add(self, labels: np.ndarray, preds: np.ndarray) -> None:
        # clipped in the predictions' own dtype (a model's float32 rounds the bounds, so every
        # float32 score at or above float32(1 - 1e-7) joins one tie, as it always has); kept in it:
        # float32 → float64 is exact and keeps the order, so the histogram's ties are the same
        q = np.clip(np.asarray(preds), _CLIP, 1 - _CLIP)
        q = q if q.dtype in (np.float32, np.float64) else q.astype(np.float64)
        if q.size == 0:
            return
        self._samples += int(q.size)
        u, inv = np.unique(q, return_inverse=True)
        inv = inv.reshape(-1)
        dt = self._count_dtype()
        pos = np.bincount(inv, weights=positive(labels), minlength=u.size).astype(dt)
        self._parts.append((u, pos, np.bincount(inv, minlength=u.size).astype(dt)))
        self._pending += u.size
        if self._pending > max(self._merged, self.MERGE_AT):
            self._merge()
            if self._merged > self.SPILL_AT:
                self._to_disk()

    def _merge(self) -> None:
        if len(self._parts) > 1:
            u, inv = np.unique(np.concatenate([p[0] for p in self._parts]), return_inverse=True)
            inv = inv.reshape(-1)
            dt = self._count_dtype()
            pos = np.bincount(inv, weights=np.concatenate([p[1] for p in self._parts]), minlength=u.size)
            cnt = np.bincount(inv, weights=np.concatenate([p[2] for p in self._parts]), minlength=u.size)
            self._parts = [(u, pos.astype(dt), cnt.astype(dt))]
        self._merged = self._parts[0][0].size if self._parts else 0
        self._pending = 0

    def _to_disk(self) -> None:
        """The merged histogram → one more Parquet file of the spill directory; memory emptied."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._spill is None:
            self._spill = Path(tempfile.mkdtemp(prefix="gmeta-auc-"))
            weakref.finalize(self, shutil.rmtree, str(self._spill), True)  # gone with the object
        u, pos, cnt = self._parts[0]
        pq.write_table(pa.table({"s": u, "p": pos.astype(np.int64), "c": cnt.astype(np.int64)}),
                       self._spill / f"h-{self._spilled:06d}.parquet", compression="none")
        self._spilled += 1
        self._parts, self._merged = [], 0

    def value(self) -> float:
        """The pooled AUC; NaN unless both classes occur."""
        self._merge()
        if self._spilled:
            if self._parts:
                self._to_disk()
            return _auc(self._from_disk())
        return _auc(iter([(self._parts[0][1], self._parts[0][2])] if self._parts else []))

    def _from_disk(self):
        """(positives, counts) per distinct score, ascending, in batches: DuckDB's group-by over
        every spilled file (equal float32 scores from different files are one score)."""
        import duckdb

        con = duckdb.connect(config={"memory_limit": MEMORY_LIMIT, "temp_directory": str(self._spill / "duckdb"),
                                     "preserve_insertion_order": False})
        try:
            glob = str(self._spill / "h-*.parquet").replace("'", "''")
            reader = con.sql(f"SELECT s, sum(p)::BIGINT AS p, sum(c)::BIGINT AS c FROM read_parquet('{glob}') "
                             f"GROUP BY s ORDER BY s").fetch_record_batch(1 << 18)
            for b in reader:
                yield b.column(1).to_numpy(), b.column(2).to_numpy()
        finally:
            con.close()


def _auc(batches) -> float:
    """Σ pos·(2·negatives below + neg) / (2·P·N) over (positives, counts) per distinct score in
    ascending order, in integers; NaN unless both classes occur."""
    below = n_pos = n_neg = two_u = 0
    for pos, cnt in batches:
        pos, cnt = pos.astype(np.int64), cnt.astype(np.int64)
        neg = cnt - pos
        under = below + np.cumsum(neg) - neg
        two_u += int(np.sum(pos * (2 * under + neg)))
        below += int(neg.sum())
        n_pos += int(pos.sum())
        n_neg += int(neg.sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return two_u / (2.0 * n_pos * n_neg)
