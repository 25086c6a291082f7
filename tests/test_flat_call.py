"""``FlatCall`` (gmeta_tf/meta/flat_call.py): the traced step called through its concrete
function's flat call runs the same graph on the same inputs as the ``tf.function`` call: the same
outputs and side effects, a new concrete function for a new shape or structure, the
``tf.function`` path for what it cannot key; and the TF 2.16 internals it relies on."""
import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.meta.flat_call import FlatCall

pytestmark = pytest.mark.fast


def _fn():
    """A step-shaped function: reads a nested batch, updates a variable, returns a dict whose
    shape follows the input's."""
    v = tf.Variable(0.0)

    def step(batch):
        x = batch["support"]["x"] - 2.0 * batch["query"]["x"]
        v.assign_add(tf.reduce_sum(x))
        return {"out": x * v, "n": tf.shape(x)[0]}

    return tf.function(step, reduce_retracing=True, autograph=False), v


def _batch(n, seed):
    rng = np.random.default_rng(seed)
    return {"support": {"x": tf.constant(rng.normal(size=(n, 3)), tf.float32)},
            "query": {"x": tf.constant(rng.normal(size=(n, 3)), tf.float32)}}


def test_the_flat_call_gives_the_tf_function_s_outputs_and_side_effects():
    plain, v_plain = _fn()
    fn, v_flat = _fn()
    flat = FlatCall(fn)
    batches = [_batch(4, s) for s in range(3)] + [_batch(7, 9), _batch(4, 5), _batch(7, 6)]
    for b in batches:
        a, f = plain(b), flat(b)
        assert a.keys() == f.keys()
        np.testing.assert_array_equal(a["out"].numpy(), f["out"].numpy())
        assert int(f["n"]) == b["support"]["x"].shape[0]
        assert float(v_plain.numpy()) == float(v_flat.numpy())
    assert flat.fast_keys == 2  # one concrete function per shape; later calls took the flat path


def test_a_batch_with_other_keys_gets_its_own_concrete_function():
    fn = FlatCall(tf.function(lambda b: b["a"] - b[sorted(b)[1]], autograph=False))
    x, y = tf.constant([5.0]), tf.constant([1.0])
    assert fn({"a": x, "b": y}).numpy().tolist() == [4.0]
    assert fn({"a": x, "b": y}).numpy().tolist() == [4.0]
    # the same flat shapes under other keys: not the first batch's function
    assert fn({"a": y, "c": x}).numpy().tolist() == [-4.0]
    assert fn({"a": y, "c": x}).numpy().tolist() == [-4.0]
    assert fn.fast_keys == 2


def test_arguments_that_are_not_all_tensors_take_the_tf_function_call():
    fn = FlatCall(tf.function(lambda b: b["x"] * 2.0, autograph=False))
    for _ in range(2):
        assert fn({"x": np.ones(2, np.float32)}).numpy().tolist() == [2.0, 2.0]
    assert fn.fast_keys == 0
    assert fn._autograph is False  # the tf.function's own attributes read through


def test_the_tf_internals_it_relies_on():
    """TF 2.16's ``ConcreteFunction._call_flat(tensors, captured_inputs)``, and its binding lists
    a nested dict's tensors in ``tf.nest.flatten``'s order, the same objects."""
    fn, _ = _fn()
    b = _batch(2, 0)
    concrete = fn.get_concrete_function(b)
    assert callable(getattr(concrete, "_call_flat", None))
    bound = concrete.function_type.unpack_inputs(concrete.function_type.bind(b))
    flat = tf.nest.flatten((b,))
    assert len(bound) == len(flat) and all(x is y for x, y in zip(bound, flat))
    out = concrete._call_flat(flat, captured_inputs=concrete.captured_inputs)
    assert set(out) == {"out", "n"}


def test_the_train_step_calls_its_traced_step_flat():
    from test_hot_split_units import _model_with_rows

    from gmeta_tf.config.schema import MetaConfig, TrainConfig
    from gmeta_tf.meta.meta_step import TrainStep
    from gmeta_tf.meta.optimizers import make_optimizers
    from gmeta_tf.train.dense_sync import LocalSync

    schema = tiny_schema("click")
    batches = [random_batch(schema, T=3, S=4, Q=3, seed=s) for s in (1, 2, 3)]
    model = _model_with_rows(schema, batches)
    dense_opt, emb_opt = make_optimizers(TrainConfig())
    step = TrainStep(model, MetaConfig(algo="maml", adapt="dense"), dense_opt, emb_opt, LocalSync())
    losses = [float(step.step(b)["loss"]) for b in batches]
    assert all(np.isfinite(losses))
    fn = step._compiled_ahead if step.prefetching else step._compiled
    assert isinstance(fn, FlatCall) and fn.fast_keys == 1
