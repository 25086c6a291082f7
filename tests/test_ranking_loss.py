"""``model.ranking_loss``: a term on each task's query *order* added to the meta objective.

Checked by hand on two- and three-item lists, for what it must ignore (a per-task shift of the
scores, padded samples), and the vectorized meta step against the per-task loop with it on.
"""
import math

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema
from test_meta_step import T, _grads, _model

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, MetaConfig, ModelConfig
from gmeta_tf.meta.meta_step import maml_loss
from gmeta_tf.meta.task_loop import maml_loss_task_loop
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.model.heads import per_task_ranking_loss


def _loss(how, scores, labels, mask=None):
    scores, labels = tf.constant(scores, tf.float32), tf.constant(labels, tf.float32)
    mask = tf.ones_like(scores) if mask is None else tf.constant(mask, tf.float32)
    return per_task_ranking_loss(how, scores, labels, mask).numpy()


def test_listnet_and_pairwise_by_hand():
    # Two items, labels 1 > 0, equal scores: ListNet = −Σ softmax(y) log(1/2) = log 2; RankNet's
    # one pair = log(1 + e^0) = log 2.
    assert _loss("listnet", [[0.0, 0.0]], [[1.0, 0.0]]) == pytest.approx([math.log(2)])
    assert _loss("pairwise", [[0.0, 0.0]], [[1.0, 0.0]]) == pytest.approx([math.log(2)])
    # Three items, labels 2, 1, 0, scores 1, 0, 0: pairs (0,1) w=1 d=1, (0,2) w=2 d=1, (1,2) w=1 d=0.
    sp = lambda x: math.log1p(math.exp(x))  # noqa: E731
    want = (1 * sp(-1) + 2 * sp(-1) + 1 * sp(0)) / 4
    assert _loss("pairwise", [[1.0, 0.0, 0.0]], [[2.0, 1.0, 0.0]]) == pytest.approx([want])
    py = np.exp([2.0, 1.0, 0.0]) / np.exp([2.0, 1.0, 0.0]).sum()
    ls = np.array([1.0, 0.0, 0.0]) - math.log(math.e + 2)
    assert _loss("listnet", [[1.0, 0.0, 0.0]], [[2.0, 1.0, 0.0]]) == pytest.approx([-(py * ls).sum()], rel=1e-5)
    assert _loss("none", [[1.0, 0.0]], [[0.0, 1.0]]) == pytest.approx([0.0])


@pytest.mark.parametrize("how", ["listnet", "pairwise"])
def test_ranking_loss_ignores_a_user_bias_and_padding(how):
    rng = np.random.default_rng(0)
    s, y = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
    mask = np.ones((3, 6))
    mask[1, 4:] = 0
    base = _loss(how, s, y, mask)
    shifted = s + np.array([[5.0], [-2.0], [0.3]])  # one shift per task: the same order
    assert _loss(how, shifted, y, mask) == pytest.approx(base, rel=1e-5)
    junk = s.copy()
    junk[1, 4:] = 100.0  # padded samples' scores and labels do not count
    y2 = y.copy()
    y2[1, 4:] = -100.0
    assert _loss(how, junk, y2, mask) == pytest.approx(base, rel=1e-5)
    better = y.copy()  # scores in the labels' order lose less than scores in the reverse order
    assert np.all(_loss(how, better, y) < _loss(how, -better, y))


@pytest.mark.parametrize("how", ["listnet", "pairwise"])
def test_vectorized_step_equals_the_task_loop_with_a_ranking_loss(how):
    schema = tiny_schema("rating")
    batch = random_batch(schema, T=T, seed=5, pad_tasks=1)
    model = _model(schema, batch)
    model.outer_loss, model.ranking_loss = "absolute", (how, 0.5)
    meta = MetaConfig(algo="maml", adapt="head", inner_solver="newton", ridge_lambda=2.0)
    loss_v, g_v = _grads(model, lambda b: maml_loss(model, meta, b), batch)
    loss_l, g_l = _grads(model, lambda b: maml_loss_task_loop(model, meta, b, T), batch)
    assert loss_v == pytest.approx(loss_l, rel=1e-5)
    for a, b in zip(g_v, g_l):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    model.ranking_loss = ("none", 0.5)
    assert loss_v > float(maml_loss(model, meta, batch))  # the term is added, and positive


def test_ranking_loss_keys_are_checked():
    with pytest.raises(ConfigError, match="model.ranking_loss"):
        load_config(None, ["model.ranking_loss=lambdamart"])
    with pytest.raises(ConfigError, match="model.ranking_loss_weight"):
        load_config(None, ["model.ranking_loss_weight=-1"])
    model = DLRM(ModelConfig(embedding_dim=4, ranking_loss="listnet", ranking_loss_weight=0.3), tiny_schema("rating"))
    assert model.ranking_loss == ("listnet", 0.3)
