"""The per-task reference: the same MAML objective as ``meta_step.maml_loss``, one task at a time.

It exists for two reasons: the tests check the vectorized step's gradients against it (a
vectorization bug would show up as a mismatch), and ``make bench`` measures how much faster
the vectorized step is than this loop (both compiled with ``tf.function``). It shares the
one-lookup-per-table rule: the batch's rows are looked up once, each task then adapts its own
copy of the whole row matrix (only the rows it touches get a non-zero gradient).
"""
from __future__ import annotations

from dataclasses import replace

import tensorflow as tf

from gmeta_tf.config.schema import MetaConfig
from gmeta_tf.embedding.lookup import SparseState
from gmeta_tf.meta.inner_loop import FastWeights, InnerLoopSpec, adapt, outer_losses
from gmeta_tf.model.dlrm import DLRM


def _task_slice(tree, t: int):
    if isinstance(tree, dict):
        return {k: _task_slice(v, t) for k, v in tree.items()}
    return tree[t: t + 1]


def _task_sparse(sparse: SparseState, t: int) -> SparseState:
    return SparseState([
        replace(f, support_pos=f.support_pos[t: t + 1], query_pos=f.query_pos[t: t + 1],
                support_valid=f.support_valid[t: t + 1], query_valid=f.query_valid[t: t + 1])
        for f in sparse.features
    ])


def maml_loss_task_loop(model: DLRM, meta: MetaConfig, batch: dict, num_tasks: int) -> tf.Tensor:
    sparse = model.embeddings.lookup(batch, trainable=True, per_task=False)
    spec = InnerLoopSpec.from_meta(model, meta)
    total = 0.0
    for t in range(num_tasks):  # the Python loop over tasks this module exists to measure
        sub = _task_slice(batch, t)
        fast = FastWeights(dict(model.dense_variables), _task_sparse(sparse, t))
        fast = adapt(model, fast, sub, spec)
        total += outer_losses(model, fast, sub)[0] * batch["task_mask"][t]
    return total / tf.maximum(tf.reduce_sum(batch["task_mask"]), 1.0)


def maml_loss_task_while_loop(model: DLRM, meta: MetaConfig, batch: dict) -> tf.Tensor:
    """The same objective as a run-time loop (``tf.while_loop``): one task per iteration.

    This is what ``for t in tf.range(T)`` in a ``tf.function`` becomes, and what a port of
    single-task MAML code runs: tasks one after another, with no unrolling that would let the
    runtime execute several tasks' ops side by side.
    """
    sparse = model.embeddings.lookup(batch, trainable=True, per_task=False)
    spec = InnerLoopSpec.from_meta(model, meta)
    num_tasks = tf.shape(batch["task_mask"])[0]
    rows = sparse.rows()
    dense = dict(model.dense_variables)

    def body(t, total):
        sub = tf.nest.map_structure(lambda x: x[t: t + 1], batch)
        task_sparse = SparseState([
            replace(f, rows=r, support_pos=f.support_pos[t: t + 1], query_pos=f.query_pos[t: t + 1],
                    support_valid=f.support_valid[t: t + 1], query_valid=f.query_valid[t: t + 1])
            for f, r in zip(sparse.features, rows)
        ])
        fast = adapt(model, FastWeights(dense, task_sparse), sub, spec)
        return t + 1, total + outer_losses(model, fast, sub)[0] * batch["task_mask"][t]

    _, total = tf.while_loop(lambda t, _: t < num_tasks, body, (tf.constant(0), tf.constant(0.0)))
    return total / tf.maximum(tf.reduce_sum(batch["task_mask"]), 1.0)
