"""The XLA-compiled dense step (meta.jit_compile) is the same step as the uncompiled one."""
import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema
from test_meta_step import T, _grads, _model

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ConfigError, MetaConfig, TrainConfig
from gmeta_tf.meta.dense_step import jit_enabled
from gmeta_tf.meta.meta_step import TrainStep, erm_loss, maml_loss
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.train.dense_sync import LocalSync

CASES = {
    "maml-top": dict(algo="maml", adapt="top"),
    "fomaml-dense": dict(algo="fomaml", adapt="dense"),
    "maml-dense+embedding": dict(algo="maml", adapt="dense+embedding"),
    "erm": dict(algo="erm"),
    "maml-newton": dict(algo="maml", adapt="head", inner_solver="newton", ridge_lambda=2.0),
    "fomaml-newton": dict(algo="fomaml", adapt="head", inner_solver="newton", ridge_lambda=2.0),
}


# The unit tier checks every case on the click head; the rating head adds the full matrix.
@pytest.mark.parametrize("kind", ["click", pytest.param("rating", marks=pytest.mark.integration)])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_step_gives_the_uncompiled_loss_and_gradients(case, kind):
    schema = tiny_schema(kind)
    batch = random_batch(schema, T=T, seed=11, pad_tasks=1)
    model = _model(schema, batch)
    meta = MetaConfig(inner_steps=2, inner_lr=0.3, embedding_inner_lr=0.5, jit_compile=True, **CASES[case])
    reference = (lambda b: erm_loss(model, b)) if meta.algo == "erm" else (lambda b: maml_loss(model, meta, b))
    loss_ref, g_ref = _grads(model, reference, batch)  # uncompiled: dense variables, then shadows

    dense_opt, emb_opt = make_optimizers(TrainConfig())
    step = TrainStep(model, meta, dense_opt, emb_opt, LocalSync())
    assert step._dense_step is not None  # the compiled path is what runs
    loss, dense_grads, emb_grads = step.gradients(batch)
    g = [tf.convert_to_tensor(x).numpy() for x in dense_grads + emb_grads]

    assert float(loss) == pytest.approx(loss_ref, rel=1e-5)
    assert len(g) == len(g_ref)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert max(np.abs(x).max() for x in g[len(dense_grads):]) > 1e-4  # row gradients reach the shadows


@pytest.mark.integration  # several training steps compiled and not (15 s on 2 cores)
def test_compiled_training_steps_track_the_uncompiled_ones():
    """Three applied steps each way from the same start: same losses, same dense weights after."""
    schema = tiny_schema("click")
    batches = [random_batch(schema, T=T, seed=s) for s in (1, 2, 3)]
    runs = []
    for jit in (False, True):
        model = _model(schema, batches[0])
        dense_opt, emb_opt = make_optimizers(TrainConfig())
        step = TrainStep(model, MetaConfig(algo="maml", adapt="dense", jit_compile=jit), dense_opt, emb_opt, LocalSync())
        losses = [float(step.step(b)["loss"]) for b in batches]
        runs.append((losses, [v.numpy() for v in model.dense_variables.values()]))
    (l0, w0), (l1, w1) = runs
    np.testing.assert_allclose(l1, l0, rtol=1e-5)
    for a, b in zip(w1, w0):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_jit_compile_key():
    assert load_config("configs/quickstart.yaml", ["meta.jit_compile=false"]).meta.jit_compile is False
    assert jit_enabled(load_config("configs/quickstart.yaml", ["meta.jit_compile=true"]).meta)
    assert not jit_enabled(load_config("configs/quickstart.yaml", ["meta.jit_compile=false"]).meta)
    assert load_config("configs/quickstart.yaml", []).meta.jit_compile == "auto"
    # auto follows make bench: on CPU the uncompiled step measured faster in every row
    # (docs/profile.md), so auto compiles nothing, whatever the algorithm or solver.
    for sets in ([], ["meta.algo=fomaml"], ["meta.algo=erm"], ["meta.adapt=head", "meta.inner_solver=newton"]):
        assert not jit_enabled(load_config("configs/quickstart.yaml", sets).meta), sets
    with pytest.raises(ConfigError, match="meta.jit_compile"):
        load_config("configs/quickstart.yaml", ["meta.jit_compile=xla"])


def test_the_step_is_traced_without_autograph():
    """The step's code has no tensor-dependent Python control flow, so autograph has nothing to
    convert in it; but with autograph on, ``tf.function`` rewrote the AST of every function the
    step calls, Keras' and TFRA's included (~300 of them): two thirds of a rank's start-up
    (docs/startup.md, "Autograph"). Every compiled function of the step is traced as written."""
    schema = tiny_schema("click")
    batch = random_batch(schema, T=T, seed=11)
    model = _model(schema, batch)
    dense_opt, emb_opt = make_optimizers(TrainConfig())
    step = TrainStep(model, MetaConfig(algo="maml", adapt="dense"), dense_opt, emb_opt, LocalSync())
    compiled = [f for f in (step._compiled, getattr(step, "_compiled_ahead", None), getattr(step, "_prime", None)) if f]
    assert compiled and all(f._autograph is False for f in compiled)
    from gmeta_tf.config.schema import Config
    from gmeta_tf.evaluation.evaluate import _prediction_fn
    assert _prediction_fn(model, Config(), 1, 0.1)._autograph is False
