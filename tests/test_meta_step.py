"""The vectorized meta step against a per-task reference loop and against finite differences."""
import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.schema import MetaConfig, ModelConfig
from gmeta_tf.meta.meta_step import erm_loss, maml_loss
from gmeta_tf.meta.task_loop import maml_loss_task_loop, maml_loss_task_while_loop
from gmeta_tf.model.dlrm import DLRM

T = 4


def _model(schema, batch):
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1), schema)
    # Insert every id of the batch, so lookups are deterministic (no random default rows).
    for table, name in zip(model.tables, model.table_names):
        part = "cat" if name in model.cat_names else "multi"
        ids = np.unique(np.concatenate([batch[w][part][name].numpy().ravel() for w in ("support", "query")]))
        ids = ids[ids >= 0]
        vals = np.random.default_rng(len(ids)).normal(scale=0.3, size=(len(ids), 4)).astype(np.float32)
        table.variable.upsert(tf.constant(ids), tf.constant(vals))
    return model


def _grads(model, fn, batch):
    vs = list(model.dense_variables.values()) + model.trainable_shadows()
    with tf.GradientTape() as tape:
        loss = fn(batch)
    g = tape.gradient(loss, vs, unconnected_gradients="zero")
    return float(loss), [tf.convert_to_tensor(x).numpy() for x in g]


# Every algo x adapt x head runs in make test. The unit tier (make test-fast, a loop of minutes)
# keeps the click head's cases that trace in a few seconds: second-order MAML (the Newton head),
# first order with embedding rows adapting, and the Newton head first order. The others trace
# the task loop's second-order graph for 10-25 s each (measured on 2 cores) and run with the
# integration tier.
_SLOW_CLICK_CASES = {("maml", "top"), ("maml", "dense"), ("maml", "dense+embedding"), ("fomaml", "top"),
                     ("fomaml", "dense")}


def _task_loop_cases():
    for kind in ("click", "rating"):
        for adapt in ("top", "dense", "dense+embedding", "head-newton"):
            for algo in ("maml", "fomaml"):
                slow = kind == "rating" or (algo, adapt) in _SLOW_CLICK_CASES
                yield pytest.param(algo, adapt, kind, id=f"{algo}-{adapt}-{kind}",
                                   marks=[pytest.mark.integration] if slow else [])


@pytest.mark.parametrize("algo, adapt, kind", list(_task_loop_cases()))
def test_vectorized_matches_task_loop(algo, adapt, kind):
    schema = tiny_schema(kind)
    batch = random_batch(schema, T=T, seed=3, pad_tasks=1)
    model = _model(schema, batch)
    solver = {"inner_solver": "newton", "ridge_lambda": 2.0} if adapt == "head-newton" else {}
    meta = MetaConfig(algo=algo, inner_steps=2, inner_lr=0.3, adapt=adapt.split("-")[0],
                      embedding_inner_lr=0.5, **solver)
    loss_v, g_v = _grads(model, lambda b: maml_loss(model, meta, b), batch)
    references = [
        _grads(model, lambda b: maml_loss_task_loop(model, meta, b, T), batch),
        _grads(model, tf.function(lambda b: maml_loss_task_while_loop(model, meta, b)), batch),
    ]
    for loss_l, g_l in references:
        assert loss_v == pytest.approx(loss_l, rel=1e-5)
        for a, b in zip(g_v, g_l):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert max(np.abs(g).max() for g in g_v) > 1e-3  # not vacuously zero


def test_second_order_matches_finite_differences_and_differs_from_first_order():
    schema = tiny_schema("click")
    batch = random_batch(schema, T=T, seed=5)
    model = _model(schema, batch)
    meta2 = MetaConfig(algo="maml", inner_steps=1, inner_lr=1.0, adapt="dense")
    meta1 = MetaConfig(algo="fomaml", inner_steps=1, inner_lr=1.0, adapt="dense")
    names = list(model.dense_variables)
    _, g2 = _grads(model, lambda b: maml_loss(model, meta2, b), batch)
    _, g1 = _grads(model, lambda b: maml_loss(model, meta1, b), batch)
    var_name = "bottom/0/w"
    var = model.dense_variables[var_name]
    idx = names.index(var_name)
    eps = 1e-2
    checked = 0
    for coord in [(0, 0), (1, 2), (0, 5)]:
        base = var.numpy()
        vals = []
        for sign in (1, -1):
            w = base.copy()
            w[coord] += sign * eps
            var.assign(w)
            vals.append(float(maml_loss(model, meta2, batch)))
        var.assign(base)
        fd = (vals[0] - vals[1]) / (2 * eps)
        assert g2[idx][coord] == pytest.approx(fd, rel=0.05, abs=2e-4)
        checked += abs(g2[idx][coord] - g1[idx][coord]) > 5 * abs(g2[idx][coord] - fd)
    # Somewhere the second-order term matters more than the finite-difference error.
    assert checked >= 1


@pytest.mark.parametrize("rating_loss", ["squared", "absolute"])
def test_erm_loss_is_the_mean_sample_loss(rating_loss):
    schema = tiny_schema("rating", n_dense=0)
    batch = random_batch(schema, T=T, seed=7)
    model = _model(schema, batch)
    model.outer_loss = rating_loss  # model.rating_loss
    loss = float(erm_loss(model, batch))
    # Same number by hand: unadapted model on every real sample, squared (or absolute) error on
    # scaled labels.
    sparse = model.embeddings.lookup(batch, trainable=False, per_task=False)
    errs = []
    for w in ("support", "query"):
        s = model.tower.forward(model.dense_variables, batch[w]["dense"], sparse.embed(w)).numpy()
        y = (batch[w]["label"].numpy() - 3.0) / 1.0
        m = batch[w]["mask"].numpy() > 0
        errs.append(((s - y) ** 2 if rating_loss == "squared" else np.abs(s - y))[m])
    assert loss == pytest.approx(float(np.concatenate(errs).mean()), rel=1e-5)


def _newton_head_setup(half_life, lam):
    """A rating model whose head one Newton (ridge) step adapts, and the support's hidden features,
    base scores and scaled labels that a numpy fit of that step needs."""
    from gmeta_tf.meta.inner_loop import InnerLoopSpec, add_support_recency, initial_fast_weights

    schema = tiny_schema("rating")
    batch = random_batch(schema, T=T, seed=5)
    model = _model(schema, batch)
    if half_life:
        add_support_recency(model, half_life)
    sparse = model.embeddings.lookup(batch, trainable=False, per_task=False)
    adapted = model.adapted_names("head")
    fast0 = initial_fast_weights(model, sparse, adapted, T)
    spec = InnerLoopSpec(adapted=tuple(adapted), steps=1, lr=0.0, adapt_embeddings=False, embedding_lr=0.0,
                         second_order=False, solver="newton", ridge_lambda=lam)
    s = batch["support"]
    hidden = model.tower.hidden(fast0.dense, s["dense"], sparse.embed("support")).numpy()
    base = model.tower.forward(fast0.dense, s["dense"], sparse.embed("support")).numpy()
    y = model.scale_labels(s["label"]).numpy()
    return model, batch, sparse, fast0, spec, hidden, base, y


@pytest.mark.parametrize("half_life", [None, 2.0])
def test_newton_head_is_the_ridge_fit_of_each_task(half_life):
    """One Newton step on the head for ratings is, per task, the ridge regression of the
    support residuals on [hidden, 1] with penalty λ‖Δ‖² (numpy's lstsq on the stacked system);
    with a support half-life h (``meta.support_half_life``) it is the *weighted* ridge fit, the
    sample that k newer support samples follow weighing 0.5^(k/h)."""
    from gmeta_tf.meta.inner_loop import adapt

    lam = 3.0
    model, batch, sparse, fast0, spec, hidden, base, y = _newton_head_setup(half_life, lam)
    fast = adapt(model, fast0, batch, spec)
    s = batch["support"]
    last = model.tower.head_layer
    reweighted = 0.0
    for t in range(T):
        keep = s["mask"].numpy()[t] > 0
        n = int(keep.sum())
        # valid samples fill the first slots, oldest first
        root_w = np.sqrt(0.5 ** ((n - 1 - np.arange(n)) / half_life))[:, None] if half_life else np.ones((n, 1))
        x = np.concatenate([hidden[t][keep], np.ones((n, 1))], axis=1)
        ridge = np.sqrt(lam) * np.eye(x.shape[1])
        r = (y[t] - base[t])[keep]
        delta = np.linalg.lstsq(np.concatenate([root_w * x, ridge]),
                                np.concatenate([root_w[:, 0] * r, np.zeros(x.shape[1])]), rcond=None)[0]
        w0 = model.dense_variables[f"{last}/w"].numpy()[:, 0]
        b0 = model.dense_variables[f"{last}/b"].numpy()[0]
        np.testing.assert_allclose(fast.dense[f"{last}/w"].numpy()[t, :, 0], w0 + delta[:-1], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(fast.dense[f"{last}/b"].numpy()[t, 0], b0 + delta[-1], rtol=1e-4, atol=1e-5)
        assert np.abs(delta).max() > 1e-3
        plain = np.linalg.lstsq(np.concatenate([x, ridge]), np.concatenate([r, np.zeros(x.shape[1])]), rcond=None)[0]
        reweighted = max(reweighted, float(np.abs(delta - plain).max()))
    assert (reweighted > 1e-3) == bool(half_life)  # the weights really change the fit


@pytest.mark.parametrize("half_life", [None, 2.0])
def test_absolute_support_loss_is_the_irls_fit_of_each_task(half_life):
    """``meta.support_loss: absolute``: per task, ``irls_steps`` re-weighted ridge solves from the
    shared head, each sample weighing (recency ×) 1 / max(|r − XΔ|, δ) normalised to mean 1 --
    computed here by hand in numpy; a planted outlier rating moves the fit far less than it moves
    the least-squares fit."""
    from gmeta_tf.meta.inner_loop import IRLS_DELTA, InnerLoopSpec, adapt

    lam, steps = 3.0, 3
    model, batch, sparse, fast0, spec, hidden, base, y = _newton_head_setup(half_life, lam)
    fast_abs = adapt(model, fast0, batch, InnerLoopSpec(**{**spec.__dict__, "support_loss": "absolute",
                                                            "irls_steps": steps}))
    s = batch["support"]
    last = model.tower.head_layer
    w0 = model.dense_variables[f"{last}/w"].numpy()[:, 0]
    b0 = model.dense_variables[f"{last}/b"].numpy()[0]
    for t in range(T):
        keep = s["mask"].numpy()[t] > 0
        n = int(keep.sum())
        recency = 0.5 ** ((n - 1 - np.arange(n)) / half_life) if half_life else np.ones(n)
        x = np.concatenate([hidden[t][keep], np.ones((n, 1))], axis=1).astype(np.float64)
        r = (y[t] - base[t])[keep].astype(np.float64)

        def solve(w):
            return np.linalg.solve(x.T @ (w[:, None] * x) + lam * np.eye(x.shape[1]), x.T @ (w * r))

        delta = solve(recency)
        for _ in range(steps):
            robust = 1.0 / np.maximum(np.abs(r - x @ delta), IRLS_DELTA)
            robust *= recency.sum() / (robust * recency).sum()
            delta = solve(recency * robust)
        np.testing.assert_allclose(fast_abs.dense[f"{last}/w"].numpy()[t, :, 0], w0 + delta[:-1], rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(fast_abs.dense[f"{last}/b"].numpy()[t, 0], b0 + delta[-1], rtol=1e-3, atol=1e-4)
    # One outlier (each task's oldest support rating + 6 std) moves the robust fit's query scores,
    # summed over the tasks with a few support samples, less than half as far as it moves the least-squares fit's.
    label = s["label"].numpy().copy()
    label[:, 0] += 6.0 * model.label_std
    spoiled = {**batch, "support": {**s, "label": tf.constant(label)}}
    q = batch["query"]

    def query_shift(spec_):
        clean = model.tower.forward(adapt(model, fast0, batch, spec_).dense, q["dense"], sparse.embed("query"))
        moved = model.tower.forward(adapt(model, fast0, spoiled, spec_).dense, q["dense"], sparse.embed("query"))
        return np.abs((moved - clean).numpy() * q["mask"].numpy()).sum(axis=1)

    robust = InnerLoopSpec(**{**spec.__dict__, "support_loss": "absolute", "irls_steps": steps})
    several = s["mask"].numpy().sum(axis=1) >= 4  # a task of 1 support sample has nothing to weigh against
    assert several.sum() >= 2
    assert query_shift(robust)[several].sum() < 0.5 * query_shift(spec)[several].sum()


@pytest.mark.parametrize("learned", ["ridge_lambda", "support_half_life", "support_loss"])
@pytest.mark.parametrize("algo", ["maml", "fomaml"])
def test_learned_head_priors_get_a_gradient_and_match_the_task_loop(algo, learned):
    """λ per head feature and the support half-life are dense weights: both orders train them
    (first order stops the gradient through the support features, not through them), and the
    vectorized step equals the per-task loop for them too."""
    from gmeta_tf.meta.inner_loop import RIDGE_PRIOR, SUPPORT_HALF_LIFE, add_ridge_prior, add_support_recency

    schema = tiny_schema("rating")
    batch = random_batch(schema, T=T, seed=7, pad_tasks=1)
    model = _model(schema, batch)
    if learned == "ridge_lambda":
        add_ridge_prior(model, 2.0)
        meta = MetaConfig(algo=algo, adapt="head", inner_solver="newton", ridge_lambda=2.0, learn_ridge_lambda=True)
    else:  # support_loss: the robust (IRLS) fit, with the learned half-life
        add_support_recency(model, 3.0)
        meta = MetaConfig(algo=algo, adapt="head", inner_solver="newton", ridge_lambda=2.0, support_half_life=3.0,
                          support_loss="absolute" if learned == "support_loss" else "squared")
    names = list(model.dense_variables)
    loss_v, g_v = _grads(model, lambda b: maml_loss(model, meta, b), batch)
    loss_l, g_l = _grads(model, lambda b: maml_loss_task_loop(model, meta, b, T), batch)
    assert loss_v == pytest.approx(loss_l, rel=1e-5)
    for a, b in zip(g_v, g_l):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    weight = RIDGE_PRIOR if learned == "ridge_lambda" else SUPPORT_HALF_LIFE
    assert np.abs(g_v[names.index(weight)]).max() > 1e-5


@pytest.mark.parametrize("algo, adapt, second, emb", [("maml", "top", True, False), ("fomaml", "dense", False, False),
                                                      ("maml", "dense+embedding", True, True)])
def test_inner_loop_spec_is_derived_from_the_config_in_one_place(algo, adapt, second, emb):
    from gmeta_tf.meta.inner_loop import InnerLoopSpec

    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1), tiny_schema("click"))
    meta = MetaConfig(algo=algo, adapt=adapt, inner_steps=3, inner_lr=0.25, embedding_inner_lr=0.5)
    spec = InnerLoopSpec.from_meta(model, meta)
    assert (spec.steps, spec.lr, spec.embedding_lr) == (3, 0.25, 0.5)
    assert (spec.second_order, spec.adapt_embeddings) == (second, emb)
    assert spec.adapted == tuple(model.adapted_names(adapt)) and len(spec.adapted) > 0
    ev = spec.for_evaluation(steps=7, lr=0.1)
    assert (ev.steps, ev.lr, ev.second_order, ev.adapted) == (7, 0.1, False, spec.adapted)
    with pytest.raises(AttributeError):  # frozen: a spec passed down cannot be changed underway
        spec.steps = 1


def test_absolute_support_loss_is_refused_where_it_cannot_apply():
    """It re-weights the Newton head's fit of rating labels: with SGD, or on click labels, the
    config error names the key."""
    from gmeta_tf.config.schema import ConfigError
    from gmeta_tf.meta.inner_loop import InnerLoopSpec

    with pytest.raises(ConfigError, match="meta.support_loss"):
        MetaConfig(adapt="head", support_loss="absolute")
    with pytest.raises(ConfigError, match="meta.irls_steps"):
        MetaConfig(adapt="head", inner_solver="newton", support_loss="absolute", irls_steps=0)
    clicks = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1), tiny_schema("click"))
    with pytest.raises(ConfigError, match="meta.support_loss"):
        InnerLoopSpec.from_meta(clicks, MetaConfig(adapt="head", inner_solver="newton", support_loss="absolute"))
