"""The compiled step's first inner step adapts through zero offsets to the shared weights
(``InnerLoopSpec.offset_first_step``, ``dense_tower._offset_matmul``) instead of tiled copies:
the same loss and the same gradients, to second order, and no ``Tile`` left in the graph."""
import re

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema
from test_meta_step import T, _grads, _model

from gmeta_tf.config.schema import MetaConfig
from gmeta_tf.meta.dense_step import maml_objective
from gmeta_tf.meta.inner_loop import InnerLoopSpec


def _objective(model, spec):
    def fn(batch):
        sparse = model.embeddings.lookup(batch, trainable=True, per_task=spec.adapt_embeddings)
        return maml_objective(model, spec, model.dense_variables, sparse, batch)
    return fn


@pytest.mark.parametrize("meta", [dict(algo="maml", adapt="top", inner_steps=2),
                                  dict(algo="maml", adapt="dense+embedding", inner_steps=1),
                                  dict(algo="fomaml", adapt="dense", inner_steps=1)])
def test_offsets_give_the_tiled_loss_and_gradients(meta):
    schema = tiny_schema("click")
    batch = random_batch(schema, T=T, seed=5, pad_tasks=1)
    model = _model(schema, batch)
    tiled = InnerLoopSpec.from_meta(model, MetaConfig(inner_lr=0.4, **meta))
    offsets = InnerLoopSpec(**{**tiled.__dict__, "offset_first_step": True})
    assert offsets.offsets and not tiled.offsets
    loss_ref, g_ref = _grads(model, _objective(model, tiled), batch)
    loss, g = _grads(model, _objective(model, offsets), batch)
    assert loss == pytest.approx(loss_ref, rel=1e-6)
    for a, b in zip(g, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert max(np.abs(x).max() for x in g) > 1e-4


def test_offsets_leave_no_tiled_weights_in_the_graph():
    schema = tiny_schema("click")
    batch = random_batch(schema, T=T, seed=5)
    model = _model(schema, batch)
    tiled = InnerLoopSpec.from_meta(model, MetaConfig(algo="maml", adapt="top"))
    tiles = {}  # initial_fast_weights' tiles, one per adapted weight (the lookup's Repeat has its own)
    for name, spec in (("tiled", tiled), ("offsets", InnerLoopSpec(**{**tiled.__dict__, "offset_first_step": True}))):
        graph = tf.function(_objective(model, spec), autograph=False).get_concrete_function(batch).graph
        tiles[name] = [op.name for op in graph.get_operations() if op.type == "Tile" and re.fullmatch(r"Tile(_\d+)?", op.name)]
    assert len(tiles["tiled"]) == len(tiled.adapted) and tiles["offsets"] == []
