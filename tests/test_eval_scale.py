"""``gmeta eval`` at scale (issue 51): the faster paths give the numbers of the paths they replaced,
and what they hold does not grow with the users.

* The paired bootstrap: one ``stats.bootstrap`` for every comparison, batched, with per-resample
  sums from user counts (``paired.paired_differences``) against one ``stats.bootstrap`` per
  comparison and metric (``paired.paired_difference``, the old path), users that hit the edges
  included (no part at all for a metric, a single user, NaN predictions).
* The bootstrap's working set: never ``resamples × users`` cells, whatever the number of users.
* Evaluation batches: larger batches than training's give the same predictions, bit for bit.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gmeta_tf.evaluation import paired
from gmeta_tf.evaluation.paired import Bootstrap
from gmeta_tf.evaluation.per_task import TaskScores

fast = pytest.mark.fast


def _scores(kind: str, users: int, seed: int, scorers=("m", "v", "b1", "b2")) -> TaskScores:
    """Per-user parts shaped like an eval's: counts as dens, some users without a part."""
    rng = np.random.default_rng(seed)
    size = rng.integers(0, 8, users).astype(np.float64)  # query sizes, some empty
    s = TaskScores(kind, [f"u{i}" for i in range(users)], {"split": "test", "support": 5, "query": 7},
                   {"query_size": size})
    metrics = ("auc", "logloss", "p_at_5", "ndcg_at_5") if kind == "click" else ("mae", "rmse", "p_at_5", "ndcg_at_5")
    for j, name in enumerate(scorers):
        parts = {}
        for m in metrics:
            if m in ("mae", "rmse", "logloss"):
                den = size.copy()
                num = rng.gamma(2.0, 0.3 + 0.05 * j, users) * den
            else:  # a ratio per user; 0 / 0 for users without one (one class, nothing relevant)
                den = (rng.random(users) < 0.6).astype(np.float64) * (size > 0)
                num = rng.random(users) * den
            parts[m] = (num, den)
        s.scorers[name] = parts
    s.roles = {"m": "model", "v": "variant", **{n: "baseline" for n in scorers[2:]}}
    return s


def _old_report(scores, models, baselines, boot, others=None):
    """The report as it was computed: one ``paired_difference`` per comparison and metric."""
    out = {}
    for a in models:
        for b in baselines:
            out[f"{a}_vs_{b}"] = {m: paired.paired_difference(m, scores.scorers[a][m], scores.scorers[b][m], boot)
                                  for m in scores.scorers[a] if m in scores.scorers[b]}
        for name, (other, theirs) in (others or {}).items():
            for b in theirs:
                out[f"{a}_vs_{b}@{name}"] = {m: paired.paired_difference(m, scores.scorers[a][m], other.scorers[b][m], boot)
                                             for m in scores.scorers[a] if m in other.scorers[b]}
    return out


def _assert_same_report(got, want, tol=1e-12):
    assert list(got) == list(want)
    for key in want:
        assert list(got[key]) == list(want[key]), key
        for m, w in want[key].items():
            g = got[key][m]
            assert g["diff"] == w["diff"] or np.isnan(g["diff"]) and np.isnan(w["diff"]), (key, m)  # bit for bit
            for f in ("ci_low", "ci_high"):
                if np.isnan(w[f]):
                    assert np.isnan(g[f]), (key, m, f)
                else:
                    assert abs(g[f] - w[f]) <= tol * max(1.0, abs(w[f])), (key, m, f, g[f], w[f])
            assert g["verdict"] == w["verdict"], (key, m)


@fast
@pytest.mark.parametrize("kind", ["click", "rating"])
def test_one_batched_bootstrap_equals_one_bootstrap_per_comparison(kind, monkeypatch):
    s = _scores(kind, 300, seed=1)
    other = _scores(kind, 300, seed=2, scorers=("m", "v"))
    boot = Bootstrap(resamples=400, seed=3)
    want = _old_report(s, ["m"], ["v", "b1", "b2"], boot, {"o": (other, ["m"])})
    monkeypatch.setattr(paired, "_BATCH_CELLS", 300 * 37)  # 37 resamples a batch: 11 batches, the last short
    got = paired.report(s, ["m"], ["v", "b1", "b2"], boot, {"o": (other, ["m"])})["comparisons"]
    _assert_same_report(got, want)
    assert len(got) == 4 and all(len(v) == 4 for v in got.values())


@fast
def test_batched_bootstrap_edges_nan_scorer_single_user_no_part():
    s = _scores("rating", 50, seed=4)
    s.scorers["b2"]["mae"] = (np.full(50, np.nan), s.scorers["b2"]["mae"][1])  # a NaN prediction somewhere
    s.scorers["b1"]["p_at_5"] = (np.zeros(50), np.zeros(50))  # no user has a part: NaN, can't tell
    boot = Bootstrap(resamples=300, seed=0)
    want = _old_report(s, ["m"], ["v", "b1", "b2"], boot)
    got = paired.report(s, ["m"], ["v", "b1", "b2"], boot)["comparisons"]
    _assert_same_report(got, want)
    assert np.isnan(got["m_vs_b2"]["mae"]["diff"]) and got["m_vs_b2"]["mae"]["verdict"] == paired.CANT_TELL
    assert np.isnan(got["m_vs_b1"]["p_at_5"]["ci_low"])
    one = _scores("click", 1, seed=5)  # one user: no interval, as before
    _assert_same_report(paired.report(one, ["m"], ["v"], boot)["comparisons"], _old_report(one, ["m"], ["v"], boot))


@fast
@pytest.mark.parametrize("users", [2_000, 200_000])
def test_bootstrap_working_set_does_not_grow_with_users(users, monkeypatch):
    """Every resampled block handed to the statistic holds at most ``_BATCH_CELLS`` cells (the old
    call held resamples × users per array: 2,000 × 200k = 400M cells), and all resamples are drawn."""
    seen = []
    real = paired._resampled_sums

    def spy(i, table):
        seen.append(i.shape)
        return real(i, table)

    monkeypatch.setattr(paired, "_resampled_sums", spy)
    s = _scores("click", users, seed=6, scorers=("m", "v"))
    r = paired.report(s, ["m"], ["v"], Bootstrap(resamples=40, seed=0))
    assert all(np.isfinite(r["comparisons"]["m_vs_v"]["logloss"][f]) for f in ("ci_low", "ci_high"))
    assert sum(rows for rows, _ in seen) == 40
    assert {n for _, n in seen} == {users}
    assert max(rows * n for rows, n in seen) <= max(paired._BATCH_CELLS, users)


@fast
def test_task_scores_takes_the_streams_parts_instead_of_copying_them():
    """The stream hands each scorer's parts over (one copy at the end, not two), and refuses to
    report from what it no longer holds."""
    from gmeta_tf.config.schema import Config
    from gmeta_tf.evaluation import segments
    from gmeta_tf.evaluation.stream import StreamScores, task_scores

    rng = np.random.default_rng(0)
    stream = StreamScores("click", 4.0)
    for c in range(3):
        offsets = segments.offsets_from_counts(rng.integers(0, 6, 100))
        y = (rng.random(offsets[-1]) < 0.3).astype(np.float64)
        stream.add([f"u{c}-{i}" for i in range(100)], y, offsets,
                   {"after": rng.random(offsets[-1]), "before": rng.random(offsets[-1])})
    want = {k: stream.parts(k) for k in ("after", "before")}
    tasks = task_scores(stream, {"m": ("after", "model"), "m_no_adapt": ("before", "variant")}, "test", Config())
    assert len(tasks.task_ids) == 300
    for name, key in (("m", "after"), ("m_no_adapt", "before")):
        for metric, (num, den) in want[key].items():
            assert np.array_equal(tasks.scorers[name][metric][0], num) and np.array_equal(tasks.scorers[name][metric][1], den)
    assert sum(len(chunks) for chunks in stream._parts.values()) == 0  # no second copy held
    with pytest.raises(ValueError, match="handed over"):
        stream.metrics("after")


@fast
def test_aligning_another_runs_users_matches_the_per_user_lookup():
    """``--compare``'s alignment (numpy, sorted ids) puts the other run's users in this run's
    order exactly as the dict lookup it replaced."""
    s = _scores("rating", 1000, seed=7)
    perm = np.random.default_rng(8).permutation(1000)
    other = _scores("rating", 1000, seed=9)
    other.task_ids = [s.task_ids[i] for i in perm]
    other.checks = {"query_size": s.checks["query_size"][perm]}
    got = s.aligned(other)
    pos = {t: i for i, t in enumerate(other.task_ids)}
    order = np.array([pos[t] for t in s.task_ids])
    assert got.task_ids == s.task_ids
    assert np.array_equal(got.scorers["m"]["mae"][0], other.scorers["m"]["mae"][0][order])
    back = TaskScores.from_parquet(other.to_parquet())
    assert back.task_ids == other.task_ids and all(isinstance(t, str) for t in back.task_ids)


# ------------------------------------------------------------------ evaluation batches


def _cfg(support=16, query=16, tasks=32, max_tasks=0):
    from gmeta_tf.config.schema import Config

    cfg = Config()
    return replace(cfg, data=replace(cfg.data, support=support, query=query, tasks_per_batch=tasks),
                   eval=replace(cfg.eval, max_tasks=max_tasks))


def test_eval_batch_is_large_capped_by_the_split_and_training_batch_for_several_steps():
    from gmeta_tf.evaluation.evaluate import eval_batch_tasks

    schema = {"splits": {"test": {"tasks": 26_971}, "valid": {"tasks": 61}}}
    assert eval_batch_tasks(_cfg(), schema, "test", 1) == 512  # 16 training batches: 16384 slots / 32 a task
    assert eval_batch_tasks(_cfg(support=50, query=10), schema, "test", 1) == 256  # 8 of 32 (273 would not divide)
    assert eval_batch_tasks(_cfg(), schema, "valid", 1) == 64  # the split in batches of 32, as before: not 512
    assert eval_batch_tasks(_cfg(tasks=8), {"splits": {"test": {"tasks": 3}}}, "test", 1) == 8  # never below training's
    assert eval_batch_tasks(_cfg(max_tasks=100), schema, "test", 1) == 128
    assert eval_batch_tasks(_cfg(), {}, "test", 0) == 512  # the schema does not say
    assert eval_batch_tasks(_cfg(), schema, "test", 5) == 32  # several inner steps: training's batch


@pytest.mark.integration
@pytest.mark.parametrize("kind", ["click", "rating"])
def test_larger_eval_batches_give_the_same_predictions_and_metrics(kind, prepared_kinds, tmp_path, monkeypatch):
    """The same model scored at training's batch (8 tasks, the old path) and in one batch of the
    split rounded up to a multiple of 8: every prediction equal bit for bit, and so every metric."""
    from click.testing import CliRunner

    from gmeta_tf.cli.main import cli
    from gmeta_tf.evaluation import evaluate as ev
    from gmeta_tf.train.trained_run import load_trained

    sets = ["data.tasks_per_batch=8", "data.support=8", "data.query=6", "train.log_every=2",
            "train.checkpoint_every=2", "train.eval_every=0"]
    r = CliRunner().invoke(cli, ["train", "--config", "configs/quickstart.yaml", "--data", str(prepared_kinds[kind]),
                                 "--out", str(tmp_path / "run"), "--steps", "2"]
                           + [a for kv in sets for a in ("--set", kv)])
    assert r.exit_code == 0, r.output
    from gmeta_tf.metaio.reader import load_schema

    cfg, model, _ = load_trained(tmp_path / "run")
    users = load_schema(cfg.data.path)["splits"]["test"]["tasks"]
    assert users > 8 and ev.eval_batch_tasks(cfg, load_schema(cfg.data.path), "test", 1) == -(-users // 8) * 8
    big = ev.query_scores(model, cfg)
    big_result = ev.evaluate(model, cfg, cfg.meta.algo)
    monkeypatch.setattr(ev, "EVAL_BATCH_SAMPLES", 1)  # training's batch: what eval used before
    assert ev.eval_batch_tasks(cfg, load_schema(cfg.data.path), "test", 1) == 8
    small = ev.query_scores(model, cfg)
    small_result = ev.evaluate(model, cfg, cfg.meta.algo)
    assert small["task_ids"] == big["task_ids"] and len(big["task_ids"]) == users
    for key in ("labels", "before", "after"):
        assert all(np.array_equal(a, b) for a, b in zip(small[key], big[key])), key
    assert small_result == big_result
