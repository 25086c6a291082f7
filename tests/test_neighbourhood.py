"""``model.neighbourhood``: a user's support residuals reach the query items most like theirs.

The term by hand on a two-item support, what it must ignore (padded support samples), that it
vanishes with no support and shrinks toward 0 with few similar items, and the vectorized meta
step against the per-task loop with it on. Export parity with ``gmeta eval`` is the export
tests' ``rating_te_rare`` run (tests/serve_fixture.py), which trains with the head on.
"""
import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema
from test_meta_step import T, _grads, _model

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, MetaConfig
from gmeta_tf.meta import neighbourhood as nb
from gmeta_tf.meta.meta_step import maml_loss
from gmeta_tf.meta.task_loop import maml_loss_task_loop


def _params(key, sharpness=2.0, shrink=0.5, weight=0.7):
    return {nb.KEY: tf.constant(key, tf.float32), nb.LOG_SHARPNESS: tf.constant([np.log(sharpness)], tf.float32),
            nb.LOG_SHRINK: tf.constant([np.log(shrink)], tf.float32), nb.WEIGHT: tf.constant([weight], tf.float32)}


def _term(params, hq, hs, r, mask):
    f = lambda x: tf.constant(np.asarray(x, np.float32))  # noqa: E731
    return nb.term(params, f(hq), f(hs), f(r), f(mask)).numpy()


def test_term_by_hand():
    # Identity keys; query [1, 0]; support items [1, 0] (cos 1) and [0, 1] (cos 0), residuals 2, -1.
    p = _params(np.eye(2))
    w1, w2 = 1.0, np.exp(2.0 * (0.0 - 1.0))
    want = 0.7 * (w1 * 2.0 + w2 * -1.0) / (w1 + w2 + 0.5)
    got = _term(p, [[[1.0, 0.0]]], [[[3.0, 0.0], [0.0, 1.0]]], [[2.0, -1.0]], [[1.0, 1.0]])
    np.testing.assert_allclose(got, [[want]], rtol=1e-5)  # cosine, not dot product: the 3 does not count


def test_padding_ignored_no_support_gives_zero_and_few_similar_items_shrink():
    rng = np.random.default_rng(0)
    p = _params(rng.normal(size=(5, 3)))
    hq, hs, r = rng.normal(size=(2, 4, 5)), rng.normal(size=(2, 6, 5)), rng.normal(size=(2, 6))
    mask = np.ones((2, 6))
    mask[1, 3:] = 0
    base = _term(p, hq, hs, r, mask)
    hs2, r2 = hs.copy(), r.copy()
    hs2[1, 3:], r2[1, 3:] = 100.0, -50.0
    np.testing.assert_allclose(_term(p, hq, hs2, r2, mask), base, rtol=1e-5)
    np.testing.assert_allclose(_term(p, hq, hs, r, np.zeros((2, 6))), 0.0)
    # One support item equal to the query item, residual 1: γ · 1 / (1 + λ) — the shrinkage.
    one = _term(_params(np.eye(2), shrink=3.0, weight=1.0), [[[1.0, 1.0]]], [[[2.0, 2.0]]], [[1.0]], [[1.0]])
    np.testing.assert_allclose(one, [[0.25]], rtol=1e-5)
    # Four such items: 4 / (4 + 3), nearer their mean residual.
    four = _term(_params(np.eye(2), shrink=3.0, weight=1.0), [[[1.0, 1.0]]], [[[2.0, 2.0]] * 4], [[1.0] * 4],
                 [[1.0] * 4])
    np.testing.assert_allclose(four, [[4 / 7]], rtol=1e-5)


@pytest.mark.parametrize("algo", ["maml", "fomaml"])
def test_vectorized_step_equals_the_task_loop_with_the_neighbourhood(algo):
    schema = tiny_schema("rating")
    batch = random_batch(schema, T=T, seed=5, pad_tasks=1)
    model = _model(schema, batch)
    model.outer_loss = "absolute"
    meta = MetaConfig(algo=algo, adapt="head", inner_solver="newton", ridge_lambda=2.0)
    without = float(maml_loss(model, meta, batch))
    nb.add_neighbourhood(model, 3, seed=1)
    loss_v, g_v = _grads(model, lambda b: maml_loss(model, meta, b), batch)
    loss_l, g_l = _grads(model, lambda b: maml_loss_task_loop(model, meta, b, T), batch)
    assert loss_v == pytest.approx(loss_l, rel=1e-5)
    for a, b in zip(g_v, g_l):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert loss_v != pytest.approx(without, rel=1e-4)  # the term is really in the objective
    names = list(model.dense_variables)
    for name in nb.NAMES:  # and the outer loss trains every weight of the head
        assert np.any(np.abs(g_v[names.index(name)]) > 0), name


def test_config_keys():
    assert load_config(None, []).model.neighbourhood is False  # off by default
    with pytest.raises(ConfigError, match="model.neighbourhood_dim"):
        load_config(None, ["model.neighbourhood_dim=0"])
