"""Predicted per-step cost of one PS from the set of shards it holds, fitted on measurements.

CONTRACT (shared by search, baselines, calibration and the bench suite)::

    model = load_cost_model(path_or_None)          # None -> the default shipped with the package
    ms = model.ps_cost(shards, samples_per_step)   # float, milliseconds per training step

What a millisecond is: the CPU time the PS process spends on the step's lookups and updates of
those shards, as ``gmeta plan calibrate`` measures it (``calibration.calibrate.COST``; see ``calibration/measure.py``).

``samples_per_step`` is how many samples' ids reach the PS tier per step (all workers together:
workers x tasks_per_batch x (support + query)); each shard gets ``pooling x samples_per_step``
lookups. An empty shard list costs 0.

The model (DreamShard style) sees a PS's shard *set* through reductions of per-shard terms
(``shard_terms``: lookups n, expected distinct ids u from the access skew, dim d):
the number of shards, the number of dims among them (``groups``: the fused tables the PS holds,
``model.fuse_tables`` fuses the tables of one dim and placement into one), sums of n, u, u*d,
n*d and u*d*log2(rows) (a distinct id costs more in a bigger hash table: held-out error 8.5%
with it, 11.9% without, on the fused calibration), and maxima. Two scikit-learn regressors compete
on held-out table sets (grouped k-fold over calibration configs) and the lower error wins:

* ``linear``: non-negative least squares on the additive sums, weighted by 1/ms^2 so it fits
  *relative* error. Each coefficient is a physical cost (ms per table, per id, per distinct
  float), so it extrapolates to sets larger than the calibrated ones.
* ``hgb``: gradient-boosted trees on log features predicting log ms, monotone increasing in
  every feature (more tables never cost less).

The model file is JSON: the measured table sets themselves (each shard's rows, dim, pooling,
skew; the step's samples; the measured ms) plus which regressor won. Loading recomputes the
features and refits (deterministic, well under a second), so no pickle ties the file to a
scikit-learn version and a better feature set can reuse old measurements.
Error reported: geometric mean over held-out sets of ``max(pred, meas) / min(pred, meas)``,
minus 1 (0.08 = typically 8% off).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from gmeta_tf.atomic_file import replace_file
from gmeta_tf.errors import UserError
from gmeta_tf.plan.access import expected_distinct, lookups_per_step
from gmeta_tf.plan.spec import Shard

DEFAULT_MODEL = Path(__file__).resolve().parent.parent / "resources" / "ps_cost_model.json"
FORMAT_VERSION = 1
LINEAR_FEATURES = ("count", "groups", "sum_n", "sum_u", "sum_ud", "sum_nd", "sum_ud_logr")
TREE_FEATURES = ("count", "groups", "sum_n", "sum_u", "sum_ud", "sum_nd", "sum_ud_logr", "sum_d", "max_ud", "max_n")


class CostModelError(UserError):
    """A cost-model file is missing, unreadable or from another format version."""


@functools.lru_cache(maxsize=65536)
def shard_terms(rows: int, dim: int, pooling: float, skew: tuple, samples_per_step: int):
    """What a shard does to its PS in one step: (lookups, expected distinct ids, dim, rows)."""
    n = lookups_per_step(pooling, samples_per_step)
    return (float(n), expected_distinct(rows, skew, n), float(dim), float(rows))


def row_terms(row: Dict) -> List[Tuple[float, ...]]:
    """Terms of a measured row: ``shards`` = [[rows, dim, pooling, skew], ...] (or given ``terms``)."""
    if "terms" in row:
        return [tuple(t) for t in row["terms"]]
    sps = int(row["samples_per_step"])
    return [shard_terms(int(r), int(d), float(p), tuple(sk), sps) for r, d, p, sk in row["shards"]]


def shard_record(s: Shard) -> list:
    return [int(s.rows), int(s.dim), float(s.pooling), [round(float(x), 6) for x in s.skew]]


def pairwise_sum(v: Sequence[float]) -> float:
    """``float(np.asarray(v, dtype=np.float64).sum())`` to the last bit, without numpy.

    Why: the search reduces tens of thousands of small shard sets, and numpy's per-call
    overhead is most of their cost. numpy sums float64 pairwise (8 accumulators per block of at
    most 128, halves above), so a plain ``sum`` would round differently and change plans.
    """
    n = len(v)
    if n < 8:
        res = 0.0
        for x in v:
            res += x
        return res
    if n > 128:
        half = n // 2
        half -= half % 8
        return pairwise_sum(v[:half]) + pairwise_sum(v[half:])
    r0, r1, r2, r3, r4, r5, r6, r7 = v[:8]
    end = n - n % 8
    for i in range(8, end, 8):
        r0 += v[i]
        r1 += v[i + 1]
        r2 += v[i + 2]
        r3 += v[i + 3]
        r4 += v[i + 4]
        r5 += v[i + 5]
        r6 += v[i + 6]
        r7 += v[i + 7]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for x in v[end:]:
        res += x
    return res


@functools.lru_cache(maxsize=65536)
def _log2_rows(rows: float) -> float:
    """``log2(max(rows, 2))`` as numpy's vector loop computes it (which differs from
    ``math.log2`` in the last bit for some values; numpy's result does not depend on where in
    an array the value sits)."""
    return float(np.log2(np.maximum(np.array([rows], dtype=np.float64), 2.0))[0])


def set_features(terms: Sequence[Sequence[float]]) -> Dict[str, float]:
    """Reductions over a PS's shards of their (lookups, distinct, dim, rows) terms.

    Computed in plain Python with numpy's arithmetic (``pairwise_sum``, ``_log2_rows``): the
    same floats a numpy version gives, at a fraction of its cost on a set of a few shards."""
    if not terms:
        return {k: 0.0 for k in TREE_FEATURES}
    n = [float(t[0]) for t in terms]
    u = [float(t[1]) for t in terms]
    d = [float(t[2]) for t in terms]
    ud = [a * b for a, b in zip(u, d)]
    return {"count": float(len(terms)), "groups": float(len(set(d))), "sum_n": pairwise_sum(n),
            "sum_u": pairwise_sum(u),
            "sum_ud_logr": pairwise_sum([x * _log2_rows(float(t[3])) for x, t in zip(ud, terms)]),
            "sum_ud": pairwise_sum(ud), "sum_nd": pairwise_sum([a * b for a, b in zip(n, d)]),
            "sum_d": pairwise_sum(d), "max_ud": max(ud), "max_n": max(n)}


class ShardColumns:
    """Per-shard columns of ``set_features`` (n, u, d, u*d, n*d, u*d*log2 rows), one row per shard
    id, and the feature matrix of many shard sets at once.

    Why: the search scores tens of thousands of sets per plan, and reducing each in its own call
    cost more than the model. Sets of one size are reduced together along rows of a C-ordered
    array, which numpy sums exactly as it sums one set (pairwise, per row), so the features,
    and every plan, are the same.
    """

    N_COLS = 6

    def __init__(self):
        self.cols = np.zeros((256, self.N_COLS))
        self.known: set = set()  # ids whose row is filled

    def put(self, i: int, terms: Sequence[float]) -> None:
        """Row ``i`` from a shard's ``shard_terms`` (lookups, distinct, dim, rows)."""
        while i >= len(self.cols):
            self.cols = np.concatenate([self.cols, np.zeros_like(self.cols)])
        n, u, d, r = (float(x) for x in terms)
        ud = u * d
        self.cols[i] = (n, u, d, ud, n * d, ud * _log2_rows(r))
        self.known.add(i)

    def matrix(self, sets: Sequence[Sequence[int]], names: Sequence[str]) -> np.ndarray:
        """``_terms_matrix`` of the sets of shard ids ``sets`` (each in cost-model order)."""
        out = np.zeros((len(sets), len(names)))
        by_size: Dict[int, List[int]] = {}
        for pos, ids in enumerate(sets):
            if ids:
                by_size.setdefault(len(ids), []).append(pos)
        col = {k: j for j, k in enumerate(names)}
        for pos in by_size.values():
            feats = self._reduce(self.cols[np.array([sets[q] for q in pos])])
            for k, j in col.items():
                out[pos, j] = feats[k]
        return out

    @staticmethod
    def _reduce(g: np.ndarray) -> Dict[str, np.ndarray]:
        """``set_features`` of each set of ``g`` (sets x shards x columns)."""
        n, u, d, ud, nd, udl = (np.ascontiguousarray(g[:, :, c]) for c in range(ShardColumns.N_COLS))
        ds = np.sort(d, axis=1)
        return {"count": np.full(len(g), float(g.shape[1])),
                "groups": 1.0 + (np.diff(ds, axis=1) != 0).sum(axis=1), "sum_n": n.sum(axis=1),
                "sum_u": u.sum(axis=1), "sum_ud_logr": udl.sum(axis=1), "sum_ud": ud.sum(axis=1),
                "sum_nd": nd.sum(axis=1), "sum_d": d.sum(axis=1), "max_ud": ud.max(axis=1), "max_n": n.max(axis=1)}


def _terms_matrix(terms_list: Sequence[Sequence[Sequence[float]]], names: Sequence[str]) -> np.ndarray:
    """One row of ``names`` features per PS shard set; each set reduced once (the search scores
    thousands of sets per plan)."""
    feats = [set_features(t) for t in terms_list]
    return np.array([[f[k] for k in names] for f in feats], dtype=np.float64)


def _matrix(rows: Sequence[Dict], names: Sequence[str]) -> np.ndarray:
    return _terms_matrix([row_terms(r) for r in rows], names)


class _Linear:
    """ms = b + sum_k c_k x_k with b, c >= 0, fitted on relative error."""

    name = "linear"

    def fit(self, rows, seed=0):
        from sklearn.linear_model import LinearRegression

        x, y = _matrix(rows, LINEAR_FEATURES), np.array([r["ms"] for r in rows])
        scale = np.maximum(x.max(axis=0), 1e-9)  # conditioning only; undone below
        reg = LinearRegression(positive=True).fit(x / scale, y, sample_weight=1.0 / y ** 2)
        self.coef = reg.coef_ / scale
        self.intercept = max(float(reg.intercept_), 0.0)
        return self

    def predict(self, x_rows: np.ndarray) -> np.ndarray:
        return self.intercept + x_rows @ self.coef

    def predict_features(self, f: Dict[str, float]) -> float:
        return self.intercept + sum(c * f[k] for c, k in zip(self.coef, LINEAR_FEATURES))

    features = LINEAR_FEATURES


class _Trees:
    """log ms from log features, boosted trees, monotone increasing in every feature."""

    name = "hgb"
    features = TREE_FEATURES

    def fit(self, rows, seed=0):
        from sklearn.ensemble import HistGradientBoostingRegressor

        x, y = _matrix(rows, TREE_FEATURES), np.array([r["ms"] for r in rows])
        self.reg = HistGradientBoostingRegressor(
            max_iter=300, learning_rate=0.05, max_leaf_nodes=8, min_samples_leaf=4,
            monotonic_cst=[1] * len(TREE_FEATURES), random_state=seed).fit(np.log1p(x), np.log(y))
        return self

    def predict(self, x_rows: np.ndarray) -> np.ndarray:
        return np.exp(self.reg.predict(np.log1p(x_rows)))

    def predict_features(self, f: Dict[str, float]) -> float:
        return float(self.predict(np.array([[f[k] for k in TREE_FEATURES]]))[0])


REGRESSORS = {"linear": _Linear, "hgb": _Trees}


def ratio_error(pred: np.ndarray, meas: np.ndarray) -> float:
    """Geometric mean of max(p, m) / min(p, m), minus 1."""
    pred = np.maximum(np.asarray(pred, dtype=np.float64), 1e-6)
    return float(np.exp(np.mean(np.abs(np.log(pred / np.asarray(meas, dtype=np.float64))))) - 1.0)


def held_out_error(rows: List[Dict], algo: str, folds: int = 5, seed: int = 0) -> Dict:
    """Grouped k-fold: every row of a calibration config (same tables) is held out together."""
    from sklearn.model_selection import GroupKFold

    groups = np.array([r.get("group", i) for i, r in enumerate(rows)])
    folds = max(2, min(folds, len(set(groups.tolist()))))
    pred = np.zeros(len(rows))
    for train, test in GroupKFold(n_splits=folds).split(rows, groups=groups):
        reg = REGRESSORS[algo]().fit([rows[i] for i in train], seed)
        pred[test] = reg.predict(_matrix([rows[i] for i in test], reg.features))
    meas = np.array([r["ms"] for r in rows])
    return {"error": ratio_error(pred, meas), "pred": pred.tolist()}


def fit_document(rows: List[Dict], seed: int = 0, algos: Sequence[str] = ("linear", "hgb")) -> Dict:
    """Pick the regressor with the lower held-out error; the document ``CostModel`` loads."""
    if len(rows) < 4:
        raise CostModelError(f"need at least 4 measured table sets to fit a cost model (got {len(rows)})")
    cv = {a: held_out_error(rows, a, seed=seed)["error"] for a in algos}
    best = min(cv, key=cv.get)
    return {"version": FORMAT_VERSION, "algo": best, "seed": seed, "held_out_error": cv[best],
            "held_out_error_by_algo": cv, "rows": rows}


class CostModel:
    def __init__(self, doc: Dict, source: str = "<memory>"):
        if doc.get("version") != FORMAT_VERSION or doc.get("algo") not in REGRESSORS:
            raise CostModelError(f"cost model {source}: unsupported format (version {doc.get('version')!r}, "
                                 f"algo {doc.get('algo')!r}); re-run 'gmeta plan calibrate'")
        self.doc = doc
        self.source = source
        self.algo = doc["algo"]
        self.error = float(doc.get("held_out_error", math.nan))
        self._reg = REGRESSORS[self.algo]().fit(doc["rows"], int(doc.get("seed", 0)))

    def ps_cost(self, shards: Sequence[Shard], samples_per_step: int) -> float:
        if not shards:
            return 0.0
        terms = [shard_terms(s.rows, s.dim, s.pooling, s.skew, int(samples_per_step)) for s in shards]
        return float(self._reg.predict_features(set_features(terms)))

    def ps_costs(self, shard_lists: Sequence[Sequence[Shard]], samples_per_step: int) -> List[float]:
        """``ps_cost`` of many PS shard sets in one ``predict`` (the search scores many)."""
        sps = int(samples_per_step)
        return self.predict_terms([[shard_terms(s.rows, s.dim, s.pooling, s.skew, sps) for s in shards]
                                   for shards in shard_lists]).tolist()

    def predict_columns(self, columns: ShardColumns, sets: Sequence[Sequence[int]]) -> np.ndarray:
        """``predict_terms`` of sets of shard ids whose terms ``columns`` holds."""
        if not sets:
            return np.zeros(0)
        out = self._reg.predict(columns.matrix(sets, self._reg.features))
        return np.where([len(s) == 0 for s in sets], 0.0, out)

    def predict_terms(self, terms_list: Sequence[Sequence[Sequence[float]]]) -> np.ndarray:
        if not terms_list:
            return np.zeros(0)
        out = self._reg.predict(_terms_matrix(terms_list, self._reg.features))
        return np.where([len(t) == 0 for t in terms_list], 0.0, out)


def save_model(doc: Dict, path: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    replace_file(p, json.dumps(doc, indent=None, separators=(",", ":")))


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime: float) -> CostModel:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise CostModelError(f"cost model {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CostModelError(f"cost model {path}: not JSON ({e.msg}, line {e.lineno})") from None
    return CostModel(doc, source=path)


def load_cost_model(path: Optional[str] = None) -> CostModel:
    p = Path(path) if path else DEFAULT_MODEL
    try:
        mtime = p.stat().st_mtime
    except OSError as e:
        raise CostModelError(f"cost model {p}: {e.strerror}") from None
    return _load_cached(str(p), mtime)
