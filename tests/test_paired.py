"""Paired comparisons over users (``gmeta eval``'s ``paired`` section) and the per-user parts.

The bootstrap interval is pinned two ways: on small cases whose percentile interval follows from
counting resamples by hand, and against a hand-written numpy resampling with the same seed (SciPy's
``bootstrap(paired=True)`` draws ``rng.integers(0, n, (resamples, n))`` user indices in one batch
and takes ``stats.quantile`` of the resampled statistic; ``_resampling.py`` in SciPy 1.17).
The per-user parts must pool to exactly the numbers ``metrics.py`` / ``ranking.py`` report.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from gmeta_tf.errors import DataError
from gmeta_tf.evaluation import metrics, paired, per_task, ranking
from gmeta_tf.evaluation.paired import Bootstrap
from gmeta_tf.evaluation.per_task import TaskScores

fast = pytest.mark.fast


def _mae_parts(err: np.ndarray):
    """One query rating per user: MAE parts (|error|, 1)."""
    return np.abs(np.asarray(err, np.float64)), np.ones(len(err))


@fast
def test_interval_of_a_constant_difference_is_that_constant():
    # Every user's absolute error is 0.3 lower under A: every resample's difference is -0.3.
    a, b = _mae_parts([0.1, 0.2, 0.5, 0.4]), _mae_parts([0.4, 0.5, 0.8, 0.7])
    r = paired.paired_difference("mae", a, b, Bootstrap(resamples=500))
    assert (r["diff"], r["ci_low"], r["ci_high"]) == pytest.approx((-0.3, -0.3, -0.3))
    assert r["verdict"] == "better"  # lower MAE


@fast
def test_percentile_interval_by_counting_resamples():
    # Four users; A's error is 1 higher than B's for three of them, equal for one. A resample's
    # difference is k/4 with k ~ Binomial(4, 3/4): P(k=0) = 1/256, P(k<=1) = 13/256 = 0.051 > 0.025,
    # so the 2.5th percentile is 1/4; P(k=4) = 81/256 = 0.32 > 0.025, so the 97.5th is 1.
    a, b = _mae_parts([1.0, 1.0, 1.0, 0.0]), _mae_parts([0.0, 0.0, 0.0, 0.0])
    r = paired.paired_difference("mae", a, b, Bootstrap(resamples=4000, seed=7))
    assert r["diff"] == pytest.approx(0.75)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((0.25, 1.0))
    assert r["verdict"] == "worse"
    # Two users, differences 0 and 1: resampled means 0, 1/2, 1 with P 1/4, 1/2, 1/4, so [0, 1],
    # an interval containing 0: nothing can be told from two users.
    r = paired.paired_difference("mae", _mae_parts([0.0, 1.0]), _mae_parts([0.0, 0.0]), Bootstrap(resamples=4000))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((0.0, 1.0)) and r["verdict"] == "can't tell"


@fast
def test_interval_equals_a_hand_written_paired_resampling_with_the_same_seed():
    rng = np.random.default_rng(1)
    n = 37
    a = (rng.random(n) * 10, rng.integers(1, 10, n).astype(float))  # RMSE parts: Σ err², query size
    b = (rng.random(n) * 10, a[1])
    boot = Bootstrap(resamples=1000, seed=3, confidence=0.9)
    got = paired.paired_difference("rmse", a, b, boot)

    idx = np.random.default_rng(3).integers(0, n, (1000, n))  # the same users for A and B

    def rmse(num, den):
        return np.sqrt(num[idx].sum(1) / den[idx].sum(1))

    dist = rmse(*a) - rmse(*b)
    low, high = np.quantile(dist, [0.05, 0.95])
    assert got["diff"] == pytest.approx(np.sqrt(a[0].sum() / a[1].sum()) - np.sqrt(b[0].sum() / b[1].sum()))
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((low, high), rel=1e-12)


@fast
def test_verdict_follows_the_metric_direction():
    assert paired.verdict("ndcg_at_5", 0.01, 0.03) == "better"
    assert paired.verdict("ndcg_at_5", -0.03, -0.01) == "worse"
    assert paired.verdict("mae", -0.03, -0.01) == "better"
    assert paired.verdict("logloss", 0.01, 0.02) == "worse"
    assert paired.verdict("auc", -0.01, 0.02) == "can't tell"
    assert paired.verdict("mae", float("nan"), float("nan")) == "can't tell"


@fast
@pytest.mark.parametrize("kind", ["rating", "click"])
def test_per_user_parts_pool_to_the_reported_metrics(kind):
    rng = np.random.default_rng(0)
    sizes = [10, 10, 7, 3, 10, 1]
    if kind == "rating":
        labels = [rng.integers(1, 11, s) / 2.0 for s in sizes]
        preds = [y + rng.normal(0, 1, y.size) for y in labels]
        preds[2] = np.full(7, 3.5)  # ties everywhere
    else:
        labels = [(rng.random(s) < 0.4).astype(float) for s in sizes]
        labels[0][:] = 0.0  # one class only: no AUC, no nDCG for this user
        preds = [rng.random(y.size) for y in labels]
    parts = per_task.task_parts(kind, labels, preds, 4.0)
    expect = {**metrics.compute(kind, labels, preds), **ranking.ranking_metrics(kind, labels, preds, 4.0)}
    assert set(parts) == set(per_task.metric_names(kind))
    for m, (num, den) in parts.items():
        assert float(per_task.pooled(m, num, den)) == pytest.approx(expect[m], rel=1e-9), m


def _scores(ids, err, setup=None):
    s = TaskScores("rating", list(ids), setup or {"split": "test", "support": 5, "query": 2},
                   {"query_size": np.ones(len(ids))})
    s.scorers = {"m": {"mae": _mae_parts(err)}, "base": {"mae": _mae_parts(np.asarray(err) + 1)}}
    s.roles = {"m": "model", "base": "baseline"}
    return s


@fast
def test_task_scores_round_trip_align_and_refuse_other_users():
    s = _scores(["u1", "u2", "u3"], [0.1, 0.2, 0.3])
    back = TaskScores.from_parquet(s.to_parquet())
    assert back.task_ids == s.task_ids and back.roles == s.roles and back.setup == s.setup
    assert np.array_equal(back.scorers["m"]["mae"][0], s.scorers["m"]["mae"][0])
    other = _scores(["u3", "u1", "u2"], [3.0, 1.0, 2.0])  # the same users in another order
    aligned = s.aligned(other)
    assert aligned.scorers["m"]["mae"][0].tolist() == [1.0, 2.0, 3.0]
    assert paired.compare(s, "m", "m", Bootstrap(), other=aligned)["mae"]["diff"] == pytest.approx(0.2 - 2.0)
    with pytest.raises(ValueError, match="not the same users"):
        s.aligned(_scores(["u1", "u2", "u9"], [0, 0, 0]))
    with pytest.raises(ValueError, match="support"):
        s.aligned(_scores(["u1", "u2", "u3"], [0, 0, 0], {"split": "test", "support": 10, "query": 2}))
    joined = per_task.concat([s, _scores(["u4"], [0.4])])
    assert joined.task_ids == ["u1", "u2", "u3", "u4"] and joined.metric("m", "mae") == pytest.approx(0.25)


@fast
def test_report_names_every_comparison_and_the_method():
    s = _scores([f"u{i}" for i in range(20)], np.linspace(0, 1, 20))
    rep = paired.report(s, s.named("model"), s.named("baseline"), Bootstrap(resamples=200, seed=1))
    assert rep["users"] == 20 and "percentile" in rep["method"] and rep["seed"] == 1
    r = rep["comparisons"]["m_vs_base"]["mae"]
    assert r["diff"] == pytest.approx(-1.0) and r["verdict"] == "better"
    from gmeta_tf.evaluation.report import format_paired

    text = format_paired(rep)
    assert "m_vs_base" in text and "better" in text and "[-1.0000, -1.0000]" in text


@pytest.mark.integration
def test_cli_eval_pairs_baselines_and_another_run(prepared_kinds, tmp_path):
    """``gmeta eval`` writes the paired section and eval_tasks.parquet; ``--compare`` pairs another
    run's users; a run scored on other users is refused and nothing is written."""
    from gmeta_tf.cli.main import cli

    data = prepared_kinds["rating"]
    runner = CliRunner()
    sets = ["data.tasks_per_batch=8", "data.support=8", "data.query=6", "train.log_every=2",
            "train.checkpoint_every=2", "eval.bootstrap_resamples=300"]
    for algo in ("maml", "erm"):
        args = ["train", "--config", "configs/quickstart.yaml", "--data", str(data), "--out",
                str(tmp_path / algo), "--steps", "2", "--algo", algo]
        r = runner.invoke(cli, args + [a for kv in sets for a in ("--set", kv)])
        assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["eval", "--run", str(tmp_path / "erm")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["eval", "--run", str(tmp_path / "maml"), "--compare", str(tmp_path / "erm")])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "maml" / "eval.json").read_text())
    erm = json.loads((tmp_path / "erm" / "eval.json").read_text())
    comp = res["paired"]["comparisons"]
    assert res["paired"]["users"] == res["tasks"] and res["paired"]["resamples"] == 300
    assert set(comp) == {"maml_vs_maml_no_adapt", "maml_vs_global_mean", "maml_vs_item_mean",
                         "maml_vs_item_mean_user_bias", f"maml_vs_erm@{tmp_path / 'erm'}",
                         f"maml_vs_erm_finetune@{tmp_path / 'erm'}"}
    for m in ("mae", "rmse", "p_at_5", "ndcg_at_5"):
        assert comp["maml_vs_item_mean"][m]["diff"] == pytest.approx(res[m] - res["baselines"]["item_mean"][m])
        assert comp[f"maml_vs_erm_finetune@{tmp_path / 'erm'}"][m]["diff"] == pytest.approx(res[m] - erm[f"{m}_finetune"])
        c = comp["maml_vs_item_mean"][m]
        assert c["ci_low"] <= c["diff"] <= c["ci_high"]
    assert "maml_vs_item_mean" in r.output and "95% interval" in r.output
    table = pq.read_table(tmp_path / "maml" / per_task.TASKS_FILE)
    assert table.num_rows == res["tasks"] and "item_mean/mae/num" in table.column_names

    # Another run scored on the valid split: refused with the command to run, eval.json unchanged.
    r = runner.invoke(cli, ["eval", "--run", str(tmp_path / "erm"), "--split", "valid"])
    assert r.exit_code == 0, r.output
    before = (tmp_path / "maml" / "eval.json").read_text()
    r = runner.invoke(cli, ["eval", "--run", str(tmp_path / "maml"), "--compare", str(tmp_path / "erm")])
    assert r.exit_code == 2 and "cannot compare" in r.output and "gmeta eval --run" in r.output
    assert "Traceback" not in r.output
    assert (tmp_path / "maml" / "eval.json").read_text() == before
    with pytest.raises(DataError, match="no eval_tasks.parquet"):
        per_task.load_for_comparison(str(tmp_path / "nowhere"), TaskScores.from_parquet(
            (tmp_path / "maml" / per_task.TASKS_FILE).read_bytes()))


@pytest.mark.integration
def test_the_cached_eval_function_follows_the_config_and_goes_with_the_model(prepared_kinds):
    """``evaluate`` reuses one traced function per model and adaptation (validation calls it every
    ``train.eval_every`` steps). A cached function must never answer for a changed config, and the
    cache must not keep a model alive."""
    import gc
    import weakref

    from gmeta_tf.config.loader import load_config
    from gmeta_tf.evaluation import evaluate as ev
    from gmeta_tf.metaio.reader import load_schema
    from gmeta_tf.train.model_build import build_model
    from gmeta_tf.train.runtime import Runtime

    data = prepared_kinds["rating"]
    cfg = load_config("configs/quickstart.yaml", [f"data.path={data}", "data.support=8", "data.query=6",
                                                  "meta.algo=fomaml", "meta.adapt=head", "meta.inner_solver=newton"])
    model = build_model(cfg, load_schema(str(data)), Runtime())

    def mae(m):
        return ev.evaluate(m, cfg, "fomaml", "valid", with_baselines=False)["mae"]

    stiff = mae(model)
    assert mae(model) == stiff and len(ev._PREDICTION_FNS[model]) == 1  # traced once, reused
    cfg.meta.ridge_lambda = 0.01
    loose = mae(model)
    assert loose != stiff and len(ev._PREDICTION_FNS[model]) == 2
    ev._PREDICTION_FNS.clear()
    assert mae(model) == pytest.approx(loose, abs=1e-7)  # what a fresh trace gives: nothing stale
    cfg.data.support = 4  # a new batch shape retraces inside the same function, with its own config
    assert mae(model) != loose
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None and len(ev._PREDICTION_FNS) == 0
