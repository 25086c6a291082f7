"""The MAML inner loop: k SGD steps on every task's support set at once, no communication.

Adapted dense weights are tiled to ``[T, ...]`` (one copy per task) and the tower runs with a
batched matmul; since the task losses are independent, the gradient of their *sum* w.r.t. the
tiled weights is each task's own gradient. Embedding rows adapt the same way on per-task row
copies (``sparse_features.lookup_batch(per_task=True)``), as ``e - α·∂L_support/∂e`` on the
looked-up tensor: an optimizer never runs in the inner loop, so the PS tables are untouched.

``second_order=True`` leaves the inner gradients differentiable, so an enclosing tape gets the
full MAML meta-gradient; ``False`` stops them (first-order MAML).

What the loop does is one typed value, ``InnerLoopSpec``, derived from the config in one place
(``InnerLoopSpec.from_meta``) and passed whole: the meta step, the task-loop variants, evaluation
and the benchmarks cannot drift apart on, say, which algorithm is second order.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Sequence, Tuple

import tensorflow as tf

import gmeta_tf  # noqa: F401
from gmeta_tf.config.schema import MetaConfig
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.model.heads import per_task_loss
from gmeta_tf.model.sparse_features import SparseState


@dataclass(frozen=True)
class InnerLoopSpec:
    """The inner loop's settings: which dense weights adapt, how many SGD steps, how fast."""

    adapted: Tuple[str, ...]  # dense weight names tiled per task and adapted
    steps: int
    lr: float
    adapt_embeddings: bool  # embedding rows adapt too (per-task row copies)
    embedding_lr: float
    second_order: bool  # differentiate through the inner gradients (MAML) or not (FOMAML, evaluation)

    @classmethod
    def from_meta(cls, model: DLRM, meta: MetaConfig) -> "InnerLoopSpec":
        """The training inner loop of ``meta`` (``meta.adapt``, ``inner_steps``, ``inner_lr``, ``algo``)."""
        return cls(adapted=tuple(model.adapted_names(meta.adapt)), steps=meta.inner_steps, lr=meta.inner_lr,
                   adapt_embeddings=meta.adapt == "dense+embedding", embedding_lr=meta.embedding_inner_lr,
                   second_order=meta.algo == "maml")

    def for_evaluation(self, steps: int, lr: float) -> "InnerLoopSpec":
        """Adaptation on unseen tasks: first order (nothing differentiates through it), own steps/lr."""
        return replace(self, steps=steps, lr=lr, second_order=False)


@dataclass
class FastWeights:
    dense: Dict[str, tf.Tensor]  # every tower weight; adapted ones are [T, ...]
    sparse: SparseState  # rows are per-task copies when embeddings adapt


def initial_fast_weights(model: DLRM, sparse: SparseState, adapted: Sequence[str],
                         num_tasks: tf.Tensor) -> FastWeights:
    dense = {}
    for name, var in model.dense_variables.items():
        if name in adapted:
            dense[name] = tf.tile(var[None], [num_tasks] + [1] * var.shape.rank)
        else:
            dense[name] = var
    return FastWeights(dense, sparse)


def task_losses(model: DLRM, fast: FastWeights, batch: dict, which: str) -> tf.Tensor:
    """Per-task mean loss ``[T]`` of the support or query samples under ``fast``."""
    part = batch[which]
    scores = model.tower.forward(fast.dense, part["dense"], fast.sparse.embed(which))
    labels = model.scale_labels(part["label"])
    return per_task_loss(model.kind, scores, labels, part["mask"])


def adapt(model: DLRM, fast: FastWeights, batch: dict, spec: InnerLoopSpec) -> FastWeights:
    """Run ``spec.steps`` inner SGD steps on the support set of every task in the batch."""
    adapted, lr, adapt_embeddings, embedding_lr = spec.adapted, spec.lr, spec.adapt_embeddings, spec.embedding_lr
    for _ in range(spec.steps):
        sources: List[tf.Tensor] = [fast.dense[n] for n in adapted]
        rows = fast.sparse.rows() if adapt_embeddings else []
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for s in sources + rows:
                tape.watch(s)
            loss = tf.reduce_sum(task_losses(model, fast, batch, "support"))
        grads = tape.gradient(loss, sources + rows,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = [tf.convert_to_tensor(g) for g in grads]  # gather → IndexedSlices for rows
        if not spec.second_order:
            grads = [tf.stop_gradient(g) for g in grads]
        dense = dict(fast.dense)
        for name, g in zip(adapted, grads[: len(sources)]):
            dense[name] = fast.dense[name] - lr * g
        sparse = fast.sparse
        if adapt_embeddings:
            new_rows = [r - embedding_lr * g for r, g in zip(rows, grads[len(sources):])]
            sparse = sparse.with_rows(new_rows)
        fast = FastWeights(dense, sparse)
    return fast
