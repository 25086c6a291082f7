"""The vectorized, streaming ``gmeta eval`` metrics against the per-user code they replaced.

The reference is the old implementation, kept verbatim in ``tests/eval_reference.py`` (``_old_*``: one sklearn
``roc_auc_score`` / one ``np.unique`` / one ``TaskItems`` per user), and sklearn itself. Users
are built to hit every edge: tied scores (within and across classes), one-class users, one-sample
users, empty users, all-equal scores, ties across the top-5 cut-off; both label kinds.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from gmeta_tf.config.schema import Config
from gmeta_tf.evaluation import baselines, metrics, per_task, pooled_auc, ranking, segments
from gmeta_tf.evaluation.baselines import FlatItems, ItemStats, TaskItems
from gmeta_tf.evaluation.stream import QueryChunk, StreamScores, score_chunks, task_scores
from tests.eval_reference import (  # the old per-user code (reference)
    _CLIP,
    _old_compute,
    _old_error_parts,
    _old_evaluate,
    _old_expected_hits_dcg,
    _old_predict,
    _old_ranking_parts,
    _old_relevance_summary,
    _old_task_parts,
)

fast = pytest.mark.fast
TOL = 1e-12


# ------------------------------------------------------------------ users that hit every edge

def _users(kind: str, n: int, seed: int) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """Hand-made edge users, then ``n`` random ones with coarse (often tied) scores."""
    rng = np.random.default_rng(seed)
    if kind == "click":
        edge = [
            (np.array([1, 0, 1, 0.0]), np.array([0.5, 0.5, 0.5, 0.5])),       # all equal, both classes
            (np.array([1, 1, 1.0]), np.array([0.1, 0.9, 0.3])),                # one class (positive)
            (np.array([0, 0.0]), np.array([0.2, 0.2])),                        # one class (negative), tied
            (np.array([1.0]), np.array([0.7])),                                 # one sample
            (np.zeros(0), np.zeros(0)),                                         # empty
            (np.array([1, 0, 0, 1, 0, 1, 0.0]), np.array([.9, .9, .4, .4, .4, .1, .1])),  # ties across classes
            (np.array([0, 1.0]), np.array([0.0, 1.0])),                         # scores that the clip moves
            (np.array([0, 1, 0, 1, 0, 0, 1, 0.0]), np.array([.3, .8, .8, .8, .8, .8, .8, .1])),  # tie over the top 5
        ]
    else:
        edge = [
            (np.array([5, 3, 4, 2, 1, 4.5]), np.full(6, 3.5)),                 # all equal
            (np.array([4.0]), np.array([3.9])),                                 # one sample
            (np.zeros(0), np.zeros(0)),                                         # empty
            (np.array([1, 2, 3.0]), np.array([3, 2, 1.0])),                     # no relevant item
            (np.array([5, 1, 4, 4, 2, 5, 1, 3.0]), np.array([2, 2, 4, 4, 4, 4, 1, 4.0])),  # tie over the top 5
        ]
    labels, preds = [y for y, _ in edge], [p for _, p in edge]
    for _ in range(n):
        size = int(rng.choice([0, 1, 2, 3, 5, 7, 16]))
        if kind == "click":
            y = (rng.random(size) < rng.random()).astype(np.float64)
            p = np.round(rng.random(size), int(rng.integers(1, 4)))
        else:
            y = rng.integers(1, 11, size) / 2.0
            p = np.round(y + rng.normal(0, 1, size), int(rng.integers(0, 3)))
        labels.append(y)
        preds.append(p)
    order = rng.permutation(len(labels))
    return [labels[i] for i in order], [preds[i] for i in order]


def _assert_parts(got: Dict, want: Dict, tol: float = TOL):
    assert set(got) == set(want)
    for m in want:
        for j in (0, 1):
            np.testing.assert_allclose(got[m][j], want[m][j], rtol=tol, atol=tol, err_msg=f"{m}[{j}]")


# ------------------------------------------------------------------ per-user parts

@fast
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_user_auc_equals_sklearn_per_user(seed):
    labels, preds = _users("click", 300, seed)
    y, offsets = segments.flatten(labels)
    p, _ = segments.flatten(preds)
    num, den = metrics.user_auc_parts(y, p, offsets)
    checked = 0
    for i, (yi, pi) in enumerate(zip(labels, preds)):
        if 0 < yi.sum() < yi.size:
            assert den[i] == 1.0 and num[i] == pytest.approx(roc_auc_score(yi, pi), rel=TOL, abs=TOL), i
            checked += 1
        else:  # one class, one sample or empty: no AUC
            assert den[i] == 0.0 and num[i] == 0.0, i
    assert checked > 50


@fast
@pytest.mark.parametrize("kind", ["rating", "click"])
def test_error_and_ranking_parts_equal_the_per_user_code(kind):
    labels, preds = _users(kind, 400, 3)
    _assert_parts(metrics.error_parts(kind, labels, preds), _old_error_parts(kind, labels, preds))
    for threshold in (4.0, 3.0):
        _assert_parts(ranking.ranking_parts(kind, labels, preds, threshold),
                      _old_ranking_parts(kind, labels, preds, threshold))
        _assert_parts(ranking.ranking_parts(kind, labels, preds, threshold, k=3),
                      _old_ranking_parts(kind, labels, preds, threshold, k=3))
        _assert_parts(per_task.task_parts(kind, labels, preds, threshold),
                      _old_task_parts(kind, labels, preds, threshold))
        assert ranking.relevance_summary(kind, labels, threshold) == _old_relevance_summary(kind, labels, threshold)
    got, want = metrics.compute(kind, labels, preds), _old_compute(kind, labels, preds)
    assert list(got) == list(want) and got == pytest.approx(want, rel=1e-12)


@fast
def test_one_user_hits_and_dcg_equal_the_per_user_code():
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(0, 12))
        scores = rng.integers(0, 4, n).astype(np.float64)
        rel = rng.random(n) < 0.4
        for k in (1, 5, 20):
            assert ranking.expected_hits_dcg(scores, rel, k) == pytest.approx(
                _old_expected_hits_dcg(scores, rel, k), rel=TOL, abs=TOL)


@fast
def test_no_user_at_all_gives_empty_parts_and_nan():
    parts = per_task.task_parts_flat("click", np.zeros(0), np.zeros(0), np.zeros(1, np.int64), 4.0)
    assert all(num.size == 0 and den.size == 0 for num, den in parts.values())
    assert math.isnan(metrics.compute("rating", [], [])["mae"])


# ------------------------------------------------------------------ pooled AUC

@fast
def test_streamed_pooled_auc_equals_sklearn_over_all_samples():
    rng = np.random.default_rng(7)
    auc = pooled_auc.PooledAUC()
    auc.MERGE_AT = 50  # merge often: every path (pending, merged, both) is taken
    ys, ps = [], []
    for size in (0, 1, 30, 200, 5, 900, 64, 3000):
        y = (rng.random(size) < 0.3).astype(np.float64)
        p = np.round(rng.random(size), 3)  # many ties, within and across chunks
        p[: size // 10] = 0.0  # clipped together to 1e-7
        p[size // 10: size // 5] = 1.0
        auc.add(y, p)
        ys.append(y)
        ps.append(p)
    want = roc_auc_score(np.concatenate(ys), np.clip(np.concatenate(ps), _CLIP, 1 - _CLIP))
    assert auc.value() == pytest.approx(want, rel=1e-12)
    one_class = pooled_auc.PooledAUC()
    one_class.add(np.ones(4), np.arange(4.0))
    assert math.isnan(one_class.value()) and math.isnan(pooled_auc.PooledAUC().value())


@fast
def test_pooled_auc_keeps_a_models_float32_scores_in_12_bytes_each():
    """The histogram is what grows with users (one entry per distinct model score): a float32
    key and two int32 counts, not float64 and int64 twice, and the AUC unchanged."""
    rng = np.random.default_rng(3)
    auc = pooled_auc.PooledAUC()
    ys, ps = [], []
    for _ in range(6):
        y = (rng.random(20_000) < 0.4).astype(np.float64)
        p = rng.random(20_000).astype(np.float32)
        p[:50] = np.float32(1.0)  # clipped in float32, as before
        auc.add(y, p)
        ys.append(y)
        ps.append(p)
    auc._merge()
    (u, pos, cnt), = auc._parts
    assert (u.nbytes + pos.nbytes + cnt.nbytes) / u.size == 12
    want = roc_auc_score(np.concatenate(ys), np.clip(np.concatenate(ps), _CLIP, 1 - _CLIP))
    assert auc.value() == pytest.approx(want, rel=1e-12)



@fast
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pooled_auc_past_its_memory_bound_goes_to_disk_and_gives_the_same_auc(dtype):
    """Past ``SPILL_AT`` distinct scores the histograms go to Parquet files and DuckDB ranks them:
    equal to the in-memory histogram's value bit for bit (the same integers) and to sklearn's,
    with ties across spilled files, the clipped ends and one class; the files go with the object."""
    import gc

    rng = np.random.default_rng(11)
    spilled, held = pooled_auc.PooledAUC(), pooled_auc.PooledAUC()
    spilled.MERGE_AT, spilled.SPILL_AT = 40, 100
    held.SPILL_AT = 1 << 30
    ys, ps = [], []
    for size in (0, 1, 30, 200, 5, 900, 64, 3000, 2500):
        y = (rng.random(size) < 0.3).astype(np.float64)
        p = np.round(rng.random(size), 3).astype(dtype)  # ~1000 distinct: each file repeats the others'
        p[: size // 10] = 0.0
        p[size // 10: size // 5] = 1.0
        for auc in (spilled, held):
            auc.add(y, p)
        ys.append(y)
        ps.append(p)
    assert spilled._spilled >= 3 and held._spilled == 0
    spill_dir = spilled._spill
    assert spill_dir.is_dir()
    want = roc_auc_score(np.concatenate(ys), np.clip(np.concatenate(ps), dtype(_CLIP), dtype(1 - _CLIP)))
    assert spilled.value() == held.value() == pytest.approx(want, rel=1e-12)
    assert spilled.value() == held.value()  # twice: the files are still there
    del spilled
    gc.collect()
    assert not spill_dir.exists()
    one_class = pooled_auc.PooledAUC()
    one_class.MERGE_AT, one_class.SPILL_AT = 1, 2
    for k in range(5):
        one_class.add(np.ones(3), (np.arange(3.0) + 3 * k + 1) / 100)
    assert one_class._spilled and math.isnan(one_class.value())


# ------------------------------------------------------------------ baselines

def _stats(kind: str) -> ItemStats:
    ids = np.array([3, 5, 8, 13, 21], np.int64)
    if kind == "click":
        return ItemStats(0.3, 50, ids, np.array([1, 0, 4, 9, 2.0]), np.array([4, 2, 10, 12, 22], np.int64))
    return ItemStats(3.4, 50, ids, np.array([8, 3, 40, 35, 60.0]), np.array([2, 1, 10, 12, 20], np.int64))


def _tasks(kind: str, labels: List[np.ndarray], seed: int) -> List[TaskItems]:
    rng = np.random.default_rng(seed)
    out = []
    for y in labels:
        s = int(rng.choice([0, 0, 1, 2, 4, 8]))
        sup_y = (rng.random(s) < 0.5).astype(float) if kind == "click" else rng.integers(1, 11, s) / 2.0
        out.append(TaskItems(rng.choice([1, 3, 5, 8, 13, 21, 34], s).astype(np.int64), sup_y,
                             rng.choice([1, 3, 5, 8, 13, 21, 34], y.size).astype(np.int64)))
    return out


@fast
@pytest.mark.parametrize("kind", ["rating", "click"])
@pytest.mark.parametrize("k_item,k_user", [(5.0, 2.0), (0.0, 0.0), (1.0, 0.0)])
def test_flat_baselines_equal_the_per_user_code(kind, k_item, k_user):
    labels, _ = _users(kind, 200, 11)
    tasks = _tasks(kind, labels, 12)
    stats = _stats(kind)
    for with_items in (True, False):
        got = baselines.predict(kind, stats, tasks, k_item, k_user, with_items)
        want = _old_predict(kind, stats, tasks, k_item, k_user, with_items)
        assert list(got) == list(want)
        flat = baselines.predict_flat(kind, stats, FlatItems.from_tasks(tasks), k_item, k_user, with_items)
        for name in want:
            assert len(got[name]) == len(want[name])
            np.testing.assert_allclose(np.concatenate(got[name]), np.concatenate(want[name]), rtol=TOL, atol=TOL)
            np.testing.assert_allclose(flat[name], np.concatenate(want[name]), rtol=TOL, atol=TOL)


# ------------------------------------------------------------------ the whole eval result

def _chunked(task_ids, labels, before, after, tasks: Optional[List[TaskItems]], sizes) -> List[QueryChunk]:
    """The users cut into chunks of ``sizes`` users (cycled), as ``_chunks`` streams them."""
    out, i, j = [], 0, 0
    while i < len(labels):
        n = sizes[j % len(sizes)]
        sl = slice(i, i + n)
        y, offsets = segments.flatten(labels[sl])
        items = FlatItems.from_tasks(tasks[sl]) if tasks is not None else None
        out.append(QueryChunk(np.array(task_ids[sl], dtype=object), offsets, y,  # predictions keep their dtype
                              segments.flatten(before[sl], None)[0], segments.flatten(after[sl], None)[0], items))
        i, j = i + n, j + 1
    return out


def _assert_same(got, want, path="result"):
    if isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            _assert_same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, float):
        assert isinstance(got, float), path
        assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-9, abs=1e-12), path
    else:
        assert type(got) is type(want) and got == want, path


@fast
@pytest.mark.parametrize("kind", ["rating", "click"])
@pytest.mark.parametrize("algo,steps,item", [("maml", 3, "item"), ("erm", 2, "item"), ("erm", 0, "item"),
                                             ("fomaml", 1, None), ("maml", 3, "no baselines")])
def test_streamed_eval_equals_the_old_code_path(kind, algo, steps, item):
    labels, after = _users(kind, 500, 21)
    rng = np.random.default_rng(22)
    before = [np.round(p + rng.normal(0, 0.2, p.size), 1) if kind == "rating" else
              np.clip(np.round(p + rng.normal(0, 0.2, p.size), 1), 0, 1) for p in after]
    # a model's predictions are float32; clicks saturate at both ends (the clip's float32 ties)
    saturated = np.array([1.0, 0.99999994, 0.9999999, 0.99999988, 0.0, 1e-8, 1.0000000117e-07])
    before, after = ([np.asarray(p, np.float32) for p in ps] for ps in (before, after))
    if kind == "click":
        for i in range(0, len(labels), 9):
            after[i] = saturated[np.arange(after[i].size) % saturated.size].astype(np.float32)
            before[i + 1] = after[i][::-1][: before[i + 1].size].copy() if after[i].size >= before[i + 1].size \
                else before[i + 1]
    task_ids = [f"u{i}" for i in range(len(labels))]
    with_baselines = item != "no baselines"
    item = item if with_baselines else "item"
    stats = _stats(kind) if with_baselines else None
    tasks = _tasks(kind, labels, 23) if with_baselines else None
    cfg = Config()
    cfg.eval.baseline_shrinkage, cfg.eval.baseline_user_shrinkage = 3.0, 1.0

    want, want_parts, want_roles, want_checks = _old_evaluate(
        cfg, algo, kind, "test", steps, 0.1, item, stats, task_ids, labels, before, after, tasks)
    seen = []
    chunks = _chunked(task_ids, labels, before, after, tasks, sizes=[1, 7, 64, 0, 150])
    got, stream, scorers = score_chunks(iter(chunks), cfg, algo, kind, "test", steps, 0.1, item, stats,
                                        progress=seen.append)
    _assert_same(got, want)
    assert sum(seen) == len(labels)
    scores = task_scores(stream, scorers, "test", cfg)
    assert scores.task_ids == task_ids and scores.roles == want_roles
    assert list(scores.scorers) == list(want_parts)
    for name in want_parts:
        _assert_parts(scores.scorers[name], want_parts[name])
    for k in want_checks:
        np.testing.assert_allclose(scores.checks[k], want_checks[k], rtol=TOL, atol=TOL)


@fast
def test_chunking_does_not_change_the_parts():
    labels, preds = _users("click", 300, 31)
    ids = [str(i) for i in range(len(labels))]
    whole = StreamScores("click", 4.0)
    y, offsets = segments.flatten(labels)
    whole.add(ids, y, offsets, {"m": segments.flatten(preds)[0]})
    parts = StreamScores("click", 4.0)
    for c in _chunked(ids, labels, preds, preds, None, sizes=[3, 1, 40]):
        parts.add(c.task_ids, c.labels, c.offsets, {"m": c.before})
    assert parts.task_ids() == whole.task_ids() == ids
    assert parts.metrics("m") == whole.metrics("m")
    _assert_parts(parts.parts("m"), whole.parts("m"), tol=0)


# ------------------------------------------------------------------ masking a padded batch

def test_padded_batch_flattens_like_the_per_task_loop():
    """``_batch_chunk``'s one mask against the old loop over real tasks (``_collect`` / ``_task_items``)."""
    import tensorflow as tf

    from gmeta_tf.evaluation.evaluate import _batch_chunk

    rng = np.random.default_rng(41)
    T, S, Q = 6, 4, 5
    task_mask = np.array([1, 1, 0, 1, 1, 0], np.float32)
    q_mask = (rng.random((T, Q)) < 0.7).astype(np.float32)
    q_mask[1] = 0  # a real task with an empty query
    s_mask = (rng.random((T, S)) < 0.6).astype(np.float32)
    batch = {
        "task_mask": tf.constant(task_mask),
        "task_id": tf.constant([f"t{i}".encode() for i in range(T)]),
        "query": {"mask": tf.constant(q_mask), "label": tf.constant(rng.random((T, Q)).astype(np.float32)),
                  "cat": {"item": tf.constant(rng.integers(0, 9, (T, Q)))},
                  "raw_cat": {"item": tf.constant(rng.integers(100, 109, (T, Q)))}},
        "support": {"mask": tf.constant(s_mask), "label": tf.constant(rng.random((T, S)).astype(np.float32)),
                    "cat": {"item": tf.constant(rng.integers(0, 9, (T, S)))},
                    "raw_cat": {"item": tf.constant(rng.integers(100, 109, (T, S)))}},
    }
    b, a = rng.random((T, Q)).astype(np.float32), rng.random((T, Q)).astype(np.float32)
    rows = np.flatnonzero(task_mask > 0)
    chunk = _batch_chunk(batch, b, a, rows, "item", True)
    assert chunk.task_ids.tolist() == ["t0", "t1", "t3", "t4"]
    y = batch["query"]["label"].numpy()
    sup_ids, qry_ids = batch["support"]["raw_cat"]["item"].numpy(), batch["query"]["raw_cat"]["item"].numpy()
    sup_y = batch["support"]["label"].numpy().astype(np.float64)
    for u, t in enumerate(rows):  # the old per-task slicing
        keep, sup = q_mask[t] > 0, s_mask[t] > 0
        sl = slice(chunk.offsets[u], chunk.offsets[u + 1])
        np.testing.assert_array_equal(chunk.labels[sl], y[t][keep])
        np.testing.assert_array_equal(chunk.before[sl], b[t][keep])
        np.testing.assert_array_equal(chunk.after[sl], a[t][keep])
        np.testing.assert_array_equal(chunk.items.query_items[sl], qry_ids[t][keep])
        ss = slice(chunk.items.support_offsets[u], chunk.items.support_offsets[u + 1])
        np.testing.assert_array_equal(chunk.items.support_items[ss], sup_ids[t][sup])
        np.testing.assert_array_equal(chunk.items.support_labels[ss], sup_y[t][sup])
    whole = QueryChunk.concat([chunk, _batch_chunk(batch, b, a, rows[:2], None, True)])
    assert whole.users == 6 and whole.items.query_items[whole.offsets[4]:].tolist() == [-1] * int(q_mask[0].sum())


# ------------------------------------------------------------------ the progress line of gmeta eval

@fast
def test_eval_progress_counts_users_against_the_split_and_prints_a_final_line_off_a_terminal():
    import io

    from gmeta_tf.cli.train_cmd import split_tasks, users_progress

    schema = {"splits": {"test": {"tasks": 27}, "valid": {}}}
    assert split_tasks(schema, "test") == 27 and split_tasks(schema, "test", max_tasks=10) == 10
    assert split_tasks(schema, "valid") is None and split_tasks({}, "test", 5) == 5

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, live in ((io.StringIO(), False), (Terminal(), True)):
        with users_progress(27, "eval test", stream) as step:
            for n in (10, 10, 7):
                step(n)
        text = stream.getvalue()
        last = text.replace("\r", "\n").strip().splitlines()[-1]
        assert "eval test" in last and "27/27" in last and "users" in last, text
        assert (text.count("\r") > 0) == live  # live updates only on a terminal
