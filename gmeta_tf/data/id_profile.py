"""Id frequencies per embedding table, sampled from the train split: what the hot set is chosen from.

Why a profile file and not a pass at training start: every worker must pick the *same* hot rows
(a row hot on one rank and cold on another would be trained twice, differently), and a file
written once next to ``schema.json`` gives all ranks the same input without reading the data.

Counting unit: one lookup = one id occurrence in one sample (a multi-hot list of 3 ids is 3
lookups), pad ids excluded. Small tables are counted exactly (``np.unique``). Tables whose
distinct ids may exceed ``exact_max_ids`` are counted with a count-min sketch (``CountMinSketch``:
never undercounts, overcounts by at most ``e/width`` of the stream with probability
``1 - exp(-depth)``) plus a bounded top-k heap of candidate ids, so memory stays
``depth × width + top_k`` whatever the id space.

Files (``DIR/id_profile.npz`` + ``DIR/id_profile.json``): per table the top ids in decreasing
count, their counts and the lookups counted; the JSON holds the summary and the cumulative
lookup-coverage curve (the share of lookups the hottest n rows serve).
"""
from __future__ import annotations

import heapq
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import numpy as np
import pyarrow.parquet as pq

from gmeta_tf.atomic_file import replace_file
from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError

PROFILE_NPZ = "id_profile.npz"
PROFILE_JSON = "id_profile.json"


class CountMinSketch:
    """Count-min sketch over int64 ids, vectorized with numpy (``depth`` rows × ``width``)."""

    def __init__(self, width: int = 1 << 18, depth: int = 4, seed: int = 0):
        if width < 2 or width & (width - 1):
            raise ValueError(f"count-min width must be a power of two >= 2, got {width}")
        rng = np.random.default_rng(seed)
        self.width, self.depth = int(width), int(depth)
        self._shift = np.uint64(64 - (self.width.bit_length() - 1))
        # Multiply-shift hashing (Dietzfelbinger): h(x) = (a·x + b mod 2^64) >> (64 - log2 width)
        # with odd a; uint64 arithmetic wraps, which is exactly the mod 2^64.
        self.a = rng.integers(0, 1 << 63, size=depth, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self.b = rng.integers(0, 1 << 63, size=depth, dtype=np.uint64)
        self.table = np.zeros((depth, width), dtype=np.int64)
        self.total = 0

    def _buckets(self, ids: np.ndarray) -> np.ndarray:
        x = ids.astype(np.uint64)
        out = np.empty((self.depth, x.size), dtype=np.int64)
        for d in range(self.depth):
            out[d] = ((self.a[d] * x + self.b[d]) >> self._shift).astype(np.int64)
        return out

    def add(self, ids: np.ndarray, counts: Optional[np.ndarray] = None) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        counts = np.ones(ids.size, np.int64) if counts is None else np.asarray(counts, np.int64)
        for d, b in enumerate(self._buckets(ids)):
            np.add.at(self.table[d], b, counts)
        self.total += int(counts.sum())

    def query(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return np.zeros(0, np.int64)
        b = self._buckets(ids)
        return np.min(self.table[np.arange(self.depth)[:, None], b], axis=0)


class TopKHeap:
    """The ``k`` ids with the largest sketch estimates seen so far (a min-heap on the estimate).

    After each chunk the heap's members and the chunk's ids are re-estimated (estimates only
    grow), and the ``k`` largest kept: a true heavy hitter's estimate is at least its true
    count, so it enters the heap as soon as it is among the k largest and is never evicted by
    ids whose estimate stays below it.
    """

    def __init__(self, k: int):
        self.k = int(k)
        self.ids = np.zeros(0, np.int64)

    def offer(self, sketch: CountMinSketch, candidates: np.ndarray) -> None:
        cand = np.union1d(self.ids, candidates)
        est = sketch.query(cand)
        heap: List[tuple] = []
        for c, i in zip(est.tolist(), cand.tolist()):
            if len(heap) < self.k:
                heapq.heappush(heap, (c, -i))
            elif (c, -i) > heap[0]:
                heapq.heapreplace(heap, (c, -i))
        self.ids = np.array(sorted(-i for _, i in heap), dtype=np.int64)

    def top(self, sketch: CountMinSketch) -> tuple[np.ndarray, np.ndarray]:
        est = sketch.query(self.ids)
        order = np.lexsort((self.ids, -est))
        return self.ids[order], est[order]


@dataclass
class TableProfile:
    name: str
    method: str  # "exact" | "sketch"
    ids: np.ndarray  # top ids, decreasing count (ties: increasing id)
    counts: np.ndarray
    lookups: int  # lookups counted for this table (the coverage denominator)
    distinct: int  # exact distinct ids, or -1 for a sketch
    # Every id of the train split is recorded (exact count, whole split, nothing cut by top_k):
    # a hot set holding all of them can serve the table without the PS during training.
    complete: bool = False

    def coverage(self, n: int) -> float:
        return float(self.counts[:n].sum() / self.lookups) if self.lookups else 0.0


class _Counter:
    """Exact while the distinct ids stay under ``exact_max_ids``, a sketch + heap beyond."""

    def __init__(self, exact_max_ids: int, top_k: int, width: int, depth: int, seed: int):
        self.exact_max_ids, self.top_k = exact_max_ids, top_k
        self.width, self.depth, self.seed = width, depth, seed
        self._pending: List[np.ndarray] = []  # raw ids not merged into (_u, _c) yet
        self._u, self._c = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.sketch: Optional[CountMinSketch] = None
        self.heap: Optional[TopKHeap] = None
        self.lookups = 0

    def add(self, ids: np.ndarray) -> None:
        ids = ids[ids >= 0]
        if ids.size == 0:
            return
        self.lookups += int(ids.size)
        if self.sketch is None:
            self._pending.append(ids)
            if sum(a.size for a in self._pending) > 4 * self.exact_max_ids:
                self._merge()
            return
        u, c = np.unique(ids, return_counts=True)
        self.sketch.add(u, c)
        self.heap.offer(self.sketch, u)

    def _merge(self) -> None:
        """Fold pending ids into the exact counts; past ``exact_max_ids`` switch to the sketch."""
        if self._pending:
            u, c = np.unique(np.concatenate(self._pending), return_counts=True)
            self._pending = []
            u, inv = np.unique(np.concatenate([self._u, u]), return_inverse=True)
            self._u, self._c = u, np.bincount(inv, weights=np.concatenate([self._c, c]),
                                              minlength=u.size).astype(np.int64)
        if self._u.size > self.exact_max_ids:  # carry what was counted into the sketch
            self.sketch = CountMinSketch(self.width, self.depth, self.seed)
            self.heap = TopKHeap(self.top_k)
            self.sketch.add(self._u, self._c)
            self.heap.offer(self.sketch, self._u)
            self._u, self._c = np.zeros(0, np.int64), np.zeros(0, np.int64)

    def result(self, name: str) -> TableProfile:
        if self.sketch is None:
            self._merge()
        if self.sketch is not None:
            ids, counts = self.heap.top(self.sketch)
            return TableProfile(name, "sketch", ids, counts, self.lookups, -1)
        order = np.lexsort((self._u, -self._c))[: self.top_k]
        return TableProfile(name, "exact", self._u[order], self._c[order], self.lookups, int(self._u.size),
                            complete=len(order) == self._u.size)


def profile_ids(data_dir: str | Path, sample: float = 1.0, exact_max_ids: int = 1 << 16,
                top_k: int = 1 << 17, sketch_width: int = 1 << 18, sketch_depth: int = 4,
                seed: int = 0) -> Dict[str, TableProfile]:
    """Count ids per table over a ``sample`` fraction of the train split's tasks (seeded)."""
    from gmeta_tf.data.task_format import load_schema, split_files

    if not 0.0 < sample <= 1.0:
        raise DataError(f"--sample must be in (0, 1], got {sample}")
    data_dir = str(data_dir)
    schema = load_schema(data_dir)
    columns = fmt.table_id_columns(schema)
    counters = {t: _Counter(exact_max_ids, top_k, sketch_width, sketch_depth, seed) for t in columns}
    rng = np.random.default_rng(seed)
    for file in split_files(data_dir, "train", schema):
        pf = pq.ParquetFile(file)
        for g in range(pf.num_row_groups):
            rg = pf.read_row_group(g, columns=[c for cols in columns.values() for c in cols])
            keep = None if sample >= 1.0 else np.flatnonzero(rng.random(rg.num_rows) < sample)
            if keep is not None:
                rg = rg.take(keep)
            for table, cols in columns.items():
                for col in cols:
                    counters[table].add(fmt.flat_ids(rg.column(col).combine_chunks()))
    out = {t: c.result(t) for t, c in counters.items()}
    if sample < 1.0:
        for p in out.values():
            p.complete = False
    return out


def coverage_curve(p: TableProfile, points: Iterable[int] = ()) -> Dict[str, float]:
    """Share of lookups served by the hottest n rows, n = 1, 10, 100, ... up to all recorded."""
    pts = sorted(set(points) | {10 ** i for i in range(0, 10) if 10 ** i < len(p.ids)} | {len(p.ids)})
    return {str(n): round(p.coverage(n), 6) for n in pts if n > 0}


def write_profile(data_dir: str | Path, profiles: Dict[str, TableProfile], meta: dict) -> Path:
    data_dir = Path(data_dir)
    arrays = {}
    for t, p in profiles.items():
        arrays[f"{t}.ids"], arrays[f"{t}.counts"] = p.ids, p.counts
        arrays[f"{t}.lookups"] = np.array(p.lookups, np.int64)
        arrays[f"{t}.complete"] = np.array(p.complete)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    replace_file(data_dir / PROFILE_NPZ, buf.getvalue())
    summary = {**meta, "tables": {t: {
        "method": p.method, "complete": p.complete, "lookups": p.lookups, "distinct": p.distinct, "recorded": int(len(p.ids)),
        "top": [[int(i), int(c)] for i, c in zip(p.ids[:10], p.counts[:10])],
        "coverage": coverage_curve(p)} for t, p in profiles.items()}}
    (data_dir / PROFILE_JSON).write_text(json.dumps(summary, indent=1))
    return data_dir / PROFILE_NPZ


def load_profile(path: str | Path) -> Dict[str, TableProfile]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no id profile; run 'gmeta data profile {path.parent}' first "
                        f"(or set hot.budget=0 to train without the hot/cold split)")
    with np.load(path) as z:
        names = sorted({k.rsplit(".", 1)[0] for k in z.files})
        method = {}
        js = path.with_name(PROFILE_JSON)
        if js.is_file():
            method = {t: v.get("method", "?") for t, v in json.loads(js.read_text())["tables"].items()}
        return {t: TableProfile(t, method.get(t, "?"), z[f"{t}.ids"], z[f"{t}.counts"],
                                int(z[f"{t}.lookups"]), -1,
                                complete=bool(z[f"{t}.complete"]) if f"{t}.complete" in z.files else False)
                for t in names}


def format_profile(profiles: Dict[str, TableProfile]) -> str:
    lines = [f"{'table':<16} {'method':<7} {'lookups':>10} {'recorded':>9}  coverage by the hottest n rows"]
    for t, p in profiles.items():
        cov = "  ".join(f"{n}:{c:.1%}" for n, c in list(coverage_curve(p).items())[:6])
        lines.append(f"{t:<16} {p.method:<7} {p.lookups:>10,} {len(p.ids):>9,}  {cov}")
    return "\n".join(lines)
