"""One training step — MAML / first-order MAML outer step, or the ERM baseline — as one graph.

Both algorithms share the shape of a step: one lookup per table (support + query together),
a loss, gradients for the dense weights (all-reduced across ranks by ``sync``) and for the
TFRA shadow variables (applied straight to the tables by the TFRA-wrapped optimizer).

* MAML: per-task fast weights from ``inner_loop.adapt`` on the support set; the loss is the
  mean query loss of the batch's tasks under their fast weights.
* ERM: no inner loop; the same model on all support + query samples of the batch as one
  mini-batch, so the baseline sees exactly the samples MAML sees.
"""
from __future__ import annotations

import os
from typing import Dict, List, Tuple

import tensorflow as tf

import gmeta_tf  # noqa: F401
from gmeta_tf.config.schema import MetaConfig
from gmeta_tf.meta.inner_loop import adapt, initial_fast_weights, task_losses
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.model.heads import per_sample_loss
from gmeta_tf.model.sparse_features import lookup_batch


def adapts_embeddings(meta: MetaConfig) -> bool:
    return meta.adapt == "dense+embedding"


def maml_loss(model: DLRM, meta: MetaConfig, batch: dict) -> tf.Tensor:
    """Mean query loss after adapting on the support set (recorded by an enclosing tape)."""
    per_task = adapts_embeddings(meta)
    sparse = lookup_batch(model.tables, batch, model.cat_names, model.multi_names,
                          trainable=True, per_task=per_task)
    adapted = model.adapted_names(meta.adapt)
    num_tasks = tf.shape(batch["task_mask"])[0]
    fast = initial_fast_weights(model, sparse, adapted, num_tasks)
    fast = adapt(model, fast, batch, adapted=adapted, steps=meta.inner_steps, lr=meta.inner_lr,
                 adapt_embeddings=per_task, embedding_lr=meta.embedding_inner_lr,
                 second_order=meta.algo == "maml")
    q = task_losses(model, fast, batch, "query")
    tm = batch["task_mask"]
    return tf.reduce_sum(q * tm) / tf.maximum(tf.reduce_sum(tm), 1.0)


def erm_loss(model: DLRM, batch: dict) -> tf.Tensor:
    """Plain mini-batch loss over every support and query sample of the batch."""
    sparse = lookup_batch(model.tables, batch, model.cat_names, model.multi_names,
                          trainable=True, per_task=False)
    total, count = 0.0, 0.0
    for which in ("support", "query"):
        part = batch[which]
        scores = model.tower.forward(model.dense_variables, part["dense"], sparse.embed(which))
        losses = per_sample_loss(model.kind, scores, model.scale_labels(part["label"]))
        mask = part["mask"] * batch["task_mask"][:, None]
        total += tf.reduce_sum(losses * mask)
        count += tf.reduce_sum(mask)
    return total / tf.maximum(count, 1.0)


def loss_fn(model: DLRM, meta: MetaConfig):
    if meta.algo == "erm":
        return lambda batch: erm_loss(model, batch)
    return lambda batch: maml_loss(model, meta, batch)


class TrainStep:
    """Builds the compiled step. ``gradients`` is exposed (uncompiled) for the tests."""

    def __init__(self, model: DLRM, meta: MetaConfig, dense_opt, emb_opt, sync, hot=None):
        self.model = model
        # Hot/cold split (gmeta_tf/hot): worker-local hot rows, trained in the same step.
        self.hot = hot
        self.hot_vars: List[tf.Variable] = hot.variables if hot is not None else []
        self.meta = meta
        self.dense_opt = dense_opt
        self.emb_opt = emb_opt
        self.sync = sync
        self.dense_vars: List[tf.Variable] = list(model.dense_variables.values())
        self.shadows = model.trainable_shadows()
        if hot is not None:  # tables served wholly by hot rows have no TFRA apply
            self.shadows = hot.remote_shadows(self.shadows)
        self._loss = loss_fn(model, meta)
        # Create every optimizer slot now, outside the compiled step: a fresh run and a run
        # restored from a checkpoint then hold the same optimizer state in the same layout
        # (TFRA's optimizer builds its slot tables differently when created while tracing).
        dense_opt.build(self.dense_vars)
        emb_opt.build(model.shadows_by_table())
        # A name unique to this process: with PS tables the step's graph is partitioned and its
        # PS parts are registered on the parameter servers under names derived from this one,
        # so the functions different workers register on a shared PS never share a name (and a
        # PS log names the worker). The PS crashes we saw had another cause, see
        # trainer.build_serialized.
        def step(batch):
            return self._step(batch)

        step.__name__ = f"gmeta_train_step_r{sync.rank}_p{os.getpid()}"
        self.step = tf.function(step, reduce_retracing=True)

    def gradients(self, batch: dict) -> Tuple[tf.Tensor, List[tf.Tensor], List[tf.Tensor]]:
        loss, dense_grads, emb_grads, _ = self._gradients(batch)
        return loss, dense_grads, emb_grads

    def _gradients(self, batch: dict):
        with tf.GradientTape() as tape:
            loss = self._loss(batch)
        grads = tape.gradient(loss, self.dense_vars + self.shadows + self.hot_vars,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        n, m = len(self.dense_vars), len(self.dense_vars) + len(self.shadows)
        return loss, grads[:n], grads[n:m], grads[m:]

    def _step(self, batch: dict) -> Dict[str, tf.Tensor]:
        loss, dense_grads, emb_grads, hot_grads = self._gradients(batch)
        dense_grads = self.sync.allreduce(dense_grads)
        self.dense_opt.apply_gradients(zip(dense_grads, self.dense_vars))
        if self.hot is not None:  # before the tables' apply: it reads their step counters
            self.hot.apply(hot_grads, self.emb_opt)
        self.emb_opt.apply_gradients(zip(emb_grads, self.shadows))
        return {"loss": loss}
