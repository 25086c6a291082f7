"""The cold-start choices the MovieLens example ships (examples/movielens/config.yaml):

* ``model.rating_loss: absolute``: the outer objective is MAE's own loss (a conditional median);
* ``meta.support_half_life``: the Newton head's fit weighs recent support samples more, with a
  learned half-life.

Each is checked against a hand computation, and the vectorized step against the per-task loop
(test_meta_step.py has the ERM loss, the weighted ridge fit and the learned half-life's gradient).
"""
import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema
from test_meta_step import T, _grads, _model

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, MetaConfig, ModelConfig
from gmeta_tf.meta.inner_loop import InnerLoopSpec, adapt, initial_fast_weights, support_weights
from gmeta_tf.meta.meta_step import maml_loss
from gmeta_tf.meta.task_loop import maml_loss_task_loop
from gmeta_tf.model.dlrm import DLRM


def _absolute_model(schema, batch):
    model = _model(schema, batch)
    model.outer_loss = "absolute"
    return model


# -- model.rating_loss ------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["maml", "fomaml"])
def test_absolute_loss_scores_the_query_only_and_the_vectorized_step_equals_the_task_loop(algo):
    """The support is still fitted by ridge (squared error); only the query loss is absolute."""
    schema = tiny_schema("rating")
    batch = random_batch(schema, T=T, seed=3, pad_tasks=1)
    model = _absolute_model(schema, batch)
    meta = MetaConfig(algo=algo, adapt="head", inner_solver="newton", ridge_lambda=2.0)
    loss_v, g_v = _grads(model, lambda b: maml_loss(model, meta, b), batch)
    loss_l, g_l = _grads(model, lambda b: maml_loss_task_loop(model, meta, b, T), batch)
    assert loss_v == pytest.approx(loss_l, rel=1e-5)
    for a, b in zip(g_v, g_l):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # By hand: adapt as with squared error, then the mean absolute query error per real task.
    spec = InnerLoopSpec.from_meta(model, meta)
    sparse = model.embeddings.lookup(batch, trainable=False, per_task=False)
    fast = adapt(model, initial_fast_weights(model, sparse, spec.adapted, T), batch, spec)
    q = batch["query"]
    s = model.tower.forward(fast.dense, q["dense"], sparse.embed("query")).numpy()
    err = np.abs(s - model.scale_labels(q["label"]).numpy()) * q["mask"].numpy()
    per_task = err.sum(1) / np.maximum(q["mask"].numpy().sum(1), 1)
    tm = batch["task_mask"].numpy()
    assert loss_v == pytest.approx(float((per_task * tm).sum() / tm.sum()), rel=1e-5)


def test_rating_loss_is_checked_by_the_config():
    with pytest.raises(ConfigError, match="model.rating_loss"):
        load_config(None, ["model.rating_loss=huber"])
    assert DLRM(ModelConfig(embedding_dim=4, rating_loss="absolute"), tiny_schema("rating")).outer_loss == "absolute"


# -- meta.support_half_life -------------------------------------------------------------------
def test_support_weights_halve_every_half_life_counted_from_the_newest_sample():
    mask = tf.constant([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]], tf.float32)
    w = support_weights(mask, tf.math.log(2.0)).numpy()  # h = 2
    np.testing.assert_allclose(w[0], [0.5 ** 1.5, 0.5, 0.5 ** 0.5, 1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(w[1], [0.5 ** 0.5, 1.0, 0, 0, 0], rtol=1e-6)


def test_support_half_life_needs_the_newton_head():
    with pytest.raises(ConfigError, match="meta.support_half_life"):
        load_config(None, ["meta.support_half_life=10", "meta.inner_solver=sgd"])
    with pytest.raises(ConfigError, match="meta.support_half_life"):
        load_config(None, ["meta.support_half_life=-1", "meta.adapt=head", "meta.inner_solver=newton"])


def test_the_movielens_example_config_and_every_erm_fine_tuning_choice_are_valid():
    """``make quality`` applies each ERM fine-tuning candidate to the example's config: every one
    must be a config the schema accepts (an SGD candidate with the example's support half-life
    was not, and ``make quality`` died after an hour of training)."""
    import dataclasses
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "movielens" / "run.py"
    spec = importlib.util.spec_from_file_location("movielens_run", path)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    cfg = load_config(run.CONFIG)
    assert cfg.model.rating_loss == "absolute" and cfg.meta.support_half_life > 0
    assert cfg.meta.support_loss == "absolute"
    for choice in run.FINETUNE_CANDIDATES:
        meta = {k: v for k, v in choice.items() if not k.startswith("finetune")}
        dataclasses.replace(cfg.meta, **meta)  # raises ConfigError on a combination the schema refuses
    newton = [c for c in run.FINETUNE_CANDIDATES if c["inner_solver"] == "newton"]
    assert {c["support_half_life"] for c in newton} == {0.0, 5.0}
    assert {c["support_loss"] for c in newton} == {"squared", "absolute"}  # ERM may fit as the meta-learner does


def test_the_movielens_comparison_pools_the_folds_test_users_and_pairs_them():
    """``run.py`` pools every fold's test users into one table per support size, pairs each
    meta-learner with every reference over those users, and reads the issue's targets off it."""
    import importlib.util
    from pathlib import Path

    from gmeta_tf.evaluation.paired import Bootstrap
    from gmeta_tf.evaluation.per_task import TaskScores, concat

    path = Path(__file__).resolve().parents[1] / "examples" / "movielens" / "run.py"
    spec = importlib.util.spec_from_file_location("movielens_run", path)
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)

    def fold(ids, err):  # one query rating per user; every scorer's absolute error is `err` + offset
        s = TaskScores("rating", ids, {"split": "test", "support": 10, "query": 1}, {})
        offsets = {"fomaml": 0.0, "maml": 0.05, "erm": 0.3, "erm_finetune": 0.1, "global_mean": 0.5,
                   "item_mean": 0.4, "item_mean_user_bias": 0.2}
        for name, off in offsets.items():
            parts = (np.asarray(err) + off, np.ones(len(ids)))
            s.scorers[name] = {m: parts for m in run.METRICS}
        return s

    pooled = {10: concat([fold(["a", "b"], [0.5, 0.7]), fold(["c", "d", "e"], [0.6, 0.6, 0.6])])}
    by = run.summarize(pooled, Bootstrap(resamples=200), [n for n, _, _ in run.MODELS] + run.BASELINES)
    assert by["10"]["fomaml"]["mae"] == pytest.approx(0.6)  # all five users, pooled
    assert by["10"]["item_mean"]["mae"] == pytest.approx(1.0)
    d = by["10"]["paired"]["fomaml_vs_erm_finetune"]["mae"]
    assert (d["diff"], d["ci_low"], d["ci_high"], d["verdict"]) == pytest.approx((-0.1, -0.1, -0.1, "better"))
    assert set(by["10"]["paired"]) == {f"{a}_vs_{b}" for a in ("maml", "fomaml") for b in run.REFERENCES}
    t = run.targets(by, "fomaml")
    assert t["mae_support_10"]["reference"] == "erm_finetune"
    assert t["mae_support_10"]["gain"] == pytest.approx(1 - 0.6 / 0.7) and t["mae_support_10"]["met"]
    assert t["ndcg_support_10"]["diff"] == pytest.approx(-0.4) and not t["ndcg_support_10"]["met"]
