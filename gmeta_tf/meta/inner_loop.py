"""The MAML inner loop: k SGD steps on every task's support set at once, no communication.

Adapted dense weights are tiled to ``[T, ...]`` (one copy per task) and the tower runs with a
batched matmul; since the task losses are independent, the gradient of their *sum* w.r.t. the
tiled weights is each task's own gradient. Embedding rows adapt the same way on per-task row
copies (``Embeddings.lookup(per_task=True)``), as ``e - α·∂L_support/∂e`` on the
looked-up tensor: an optimizer never runs in the inner loop, so the PS tables are untouched.

``second_order=True`` leaves the inner gradients differentiable, so an enclosing tape gets the
full MAML meta-gradient; ``False`` stops them (first-order MAML).

What the loop does is one typed value, ``InnerLoopSpec``, derived from the config in one place
(``InnerLoopSpec.from_meta``) and passed whole: the meta step, the task-loop variants, evaluation
and the benchmarks cannot drift apart on, say, which algorithm is second order.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from gmeta_tf.config.schema import ConfigError, MetaConfig
from gmeta_tf.embedding.lookup import SparseState
from gmeta_tf.meta import neighbourhood
from gmeta_tf.model.adaptable import AdaptableModel
from gmeta_tf.model.heads import per_task_loss, per_task_ranking_loss


@dataclass(frozen=True)
class InnerLoopSpec:
    """The inner loop's settings: which dense weights adapt, how many SGD steps, how fast."""

    adapted: Tuple[str, ...]  # dense weight names tiled per task and adapted
    steps: int
    lr: float
    adapt_embeddings: bool  # embedding rows adapt too (per-task row copies)
    embedding_lr: float
    second_order: bool  # differentiate through the inner gradients (MAML) or not (FOMAML, evaluation)
    solver: str = "sgd"  # "sgd" steps, or regularised "newton" steps on the head (meta.inner_solver)
    ridge_lambda: float = 5.0  # newton: the prior's λ when the model learns none
    support_loss: str = "squared"  # newton: "absolute" fits the head by IRLS (meta.support_loss)
    irls_steps: int = 3

    @classmethod
    def from_meta(cls, model: AdaptableModel, meta: MetaConfig) -> "InnerLoopSpec":
        """The training inner loop of ``meta`` (``meta.adapt``, ``inner_steps``, ``inner_lr``, ``algo``)."""
        if meta.support_loss == "absolute" and model.kind != "rating":
            raise ConfigError("config key 'meta.support_loss': 'absolute' fits rating labels; "
                              f"this data's labels are {model.kind}s")
        return cls(adapted=tuple(model.adapted_names(meta.adapt)), steps=meta.inner_steps, lr=meta.inner_lr,
                   adapt_embeddings=meta.adapt == "dense+embedding", embedding_lr=meta.embedding_inner_lr,
                   second_order=meta.algo == "maml", solver=meta.inner_solver, ridge_lambda=meta.ridge_lambda,
                   support_loss=meta.support_loss, irls_steps=meta.irls_steps)

    def for_evaluation(self, steps: int, lr: float) -> "InnerLoopSpec":
        """Adaptation on unseen tasks: first order (nothing differentiates through it), own steps/lr."""
        return replace(self, steps=steps, lr=lr, second_order=False)


@dataclass
class FastWeights:
    dense: Dict[str, tf.Tensor]  # every tower weight; adapted ones are [T, ...]
    sparse: SparseState  # rows are per-task copies when embeddings adapt


def initial_fast_weights(model: AdaptableModel, sparse: SparseState, adapted: Sequence[str],
                         num_tasks: tf.Tensor, params: Optional[Mapping[str, tf.Tensor]] = None) -> FastWeights:
    """``params`` (default: the model's variables) are the values to start from; the compiled
    dense step (``dense_step``) passes the variables' values as plain tensors."""
    dense = {}
    for name, var in (params if params is not None else model.dense_variables).items():
        if name in adapted:
            dense[name] = tf.tile(var[None], [num_tasks] + [1] * var.shape.rank)
        else:
            dense[name] = var
    return FastWeights(dense, sparse)


def task_losses(model: AdaptableModel, fast: FastWeights, batch: dict, which: str,
                rating_loss: str = "squared") -> tf.Tensor:
    """Per-task mean loss ``[T]`` of the support or query samples under ``fast``. The inner loop
    always fits the support with squared error (the Newton head is a ridge solve); the outer,
    query loss is the model's ``outer_loss`` (``model.rating_loss``)."""
    part = batch[which]
    scores = model.tower.forward(fast.dense, part["dense"], fast.sparse.embed(which))
    labels = model.scale_labels(part["label"])
    return per_task_loss(model.kind, scores, labels, part["mask"], rating_loss)


def outer_losses(model: AdaptableModel, fast: FastWeights, batch: dict) -> tf.Tensor:
    """Per-task outer objective ``[T]`` on the query under the adapted ``fast`` weights (with the
    neighbourhood term when the model has one, ``neighbourhood.adapted_scores``): the
    model's pointwise ``outer_loss`` plus ``model.ranking_loss_weight`` × its ranking loss on the
    task's query order (``heads.per_task_ranking_loss``; ``model.ranking_loss: none`` adds 0)."""
    part = batch["query"]
    scores = neighbourhood.adapted_scores(model, fast.dense, batch, fast.sparse)
    labels = model.scale_labels(part["label"])
    loss = per_task_loss(model.kind, scores, labels, part["mask"], model.outer_loss)
    how, weight = getattr(model, "ranking_loss", ("none", 0.0))
    if how != "none" and weight:
        loss += weight * per_task_ranking_loss(how, scores, labels, part["mask"])
    return loss


def adapt(model: AdaptableModel, fast: FastWeights, batch: dict, spec: InnerLoopSpec) -> FastWeights:
    """Run ``spec.steps`` inner steps (SGD, or Newton on the head) on every task's support set."""
    with tf.name_scope("inner_loop"):  # bench/profile_step.py tells inner from outer ops by it
        return _adapt(model, fast, batch, spec)


def _adapt(model: AdaptableModel, fast: FastWeights, batch: dict, spec: InnerLoopSpec) -> FastWeights:
    if spec.solver == "newton":
        for _ in range(spec.steps):
            fast = newton_head_step(model, fast, batch, spec.ridge_lambda, spec.second_order,
                                    irls_steps=spec.irls_steps if spec.support_loss == "absolute" else 0)
        return fast
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


# The dense weight holding log λ per head feature (+ bias), learned in the outer loop like
# Meta-SGD's per-parameter inner learning rates: how far each direction of a user's head may
# move from the shared one. Added by ``add_ridge_prior`` when ``meta.learn_ridge_lambda``.
RIDGE_PRIOR = "head/log_ridge_lambda"


def add_ridge_prior(model: AdaptableModel, lam: float) -> None:
    """Give the tower a trainable per-feature λ, initialised to ``lam`` (a dense weight like any
    other: averaged across ranks, checkpointed, exported)."""
    width = int(model.dense_variables[f"{model.tower.head_layer}/w"].shape[0]) + 1
    model.dense_variables[RIDGE_PRIOR] = tf.Variable(
        tf.fill([width], tf.math.log(tf.constant(lam, tf.float32))), name="head_log_ridge_lambda")


# The dense weight holding log h, the support samples' recency half-life (meta.support_half_life),
# learned in the outer loop like the ridge prior. Added by ``add_support_recency``.
SUPPORT_HALF_LIFE = "head/log_support_half_life"


def add_support_recency(model: AdaptableModel, half_life: float) -> None:
    model.dense_variables[SUPPORT_HALF_LIFE] = tf.Variable(
        tf.math.log(tf.constant([half_life], tf.float32)), name="head_log_support_half_life")


def support_weights(mask: tf.Tensor, log_half_life: tf.Tensor) -> tf.Tensor:
    """``[T, S]`` weights 0.5^(age / h) of the support samples, age = the number of the task's
    support samples after this one (valid samples fill the first slots, oldest first)."""
    valid = tf.reduce_sum(mask, axis=1, keepdims=True)  # [T, 1]
    age = tf.maximum(valid - 1.0 - tf.range(tf.shape(mask)[1], dtype=mask.dtype)[None, :], 0.0)
    return tf.exp(-age * tf.math.log(2.0) * tf.exp(-log_half_life)) * mask


# meta.support_loss: absolute. A support sample's IRLS weight is 1 / max(|residual|, δ), δ in
# standardised label units (a quarter of the label std): below it a residual counts as exact,
# which keeps the re-weighted solve finite and the fit from chasing single ratings.
IRLS_DELTA = 0.25


def newton_head_step(model: AdaptableModel, fast: FastWeights, batch: dict, lam: float,
                     second_order: bool, irls_steps: int = 0) -> FastWeights:
    """One regularised Newton step on every task's last layer, all tasks at once.

    With X the support's last hidden features plus a constant, W the loss curvature (1 for
    squared error, p(1 − p) for clicks) and r = y − ŷ: Δ = (XᵀWX + λI)⁻¹ Xᵀr, a batched
    ``[T, H+1, H+1]`` solve. Padded samples are masked out of X, so they add nothing. The
    solve is differentiable: with ``second_order`` the outer gradient reaches the hidden
    features (and through them every lower weight and embedding), as in MAML.

    ``irls_steps`` > 0 (ratings) turns the least-squares fit into a least-absolute-deviations
    one by iteratively re-weighted least squares: each round weighs a sample by
    1 / max(|r − XΔ|, δ), normalised to mean 1 over the task's (recency-weighted) support so
    that λ keeps its meaning as a pseudo-count, and solves again from the shared head. The
    weights are treated as constants by the outer gradient (they only say which samples to trust).
    """
    part = batch["support"]
    hidden = model.tower.hidden(fast.dense, part["dense"], fast.sparse.embed("support"))  # [T, S, H]
    last = model.tower.head_layer
    w, b = fast.dense[f"{last}/w"], fast.dense[f"{last}/b"]  # [T, H, 1], [T, 1] (adapted: tiled)
    scores = model.tower.head(fast.dense, hidden)
    labels = model.scale_labels(part["label"])
    mask = part["mask"]
    if model.kind == "click":
        p = tf.sigmoid(scores)
        residual, curvature = labels - p, p * (1.0 - p)
    else:
        residual, curvature = labels - scores, tf.ones_like(scores)
    x = tf.concat([hidden, tf.ones_like(hidden[..., :1])], axis=-1) * mask[..., None]  # [T, S, H+1]
    if not second_order:  # first order: no gradient through the support's features
        x, curvature, residual = (tf.stop_gradient(v) for v in (x, curvature, residual))
    recency = fast.dense.get(SUPPORT_HALF_LIFE)  # learned recency half-life, when the model has one
    if recency is not None:  # a weighted fit: a sample's weight multiplies its curvature and residual
        weight = support_weights(mask, recency[0])
        curvature, residual = curvature * weight, residual * weight
    prior = fast.dense.get(RIDGE_PRIOR)  # learned per-feature λ (log), when the model has one
    lam_vec = tf.exp(prior) if prior is not None else lam * tf.ones(tf.shape(x)[-1:], x.dtype)
    gram = tf.matmul(x * curvature[..., None], x, transpose_a=True) + tf.linalg.diag(lam_vec)
    rhs = tf.matmul(x, (residual * mask)[..., None], transpose_a=True)  # [T, H+1, 1]
    delta = tf.linalg.solve(gram, rhs)
    if irls_steps:
        sample_weight = weight if recency is not None else mask  # residual below is the unweighted one
        plain = (labels - scores) if second_order else tf.stop_gradient(labels - scores)
        for _ in range(irls_steps):
            fit = tf.matmul(x, delta)[..., 0]  # [T, S]: XΔ
            robust = tf.stop_gradient(1.0 / tf.maximum(tf.abs(plain - fit), IRLS_DELTA))
            total = sample_weight * mask
            robust = robust * tf.reduce_sum(total, 1, keepdims=True) / tf.maximum(
                tf.reduce_sum(robust * total, 1, keepdims=True), 1e-12)
            w_fit = robust * total
            gram = tf.matmul(x * w_fit[..., None], x, transpose_a=True) + tf.linalg.diag(lam_vec)
            delta = tf.linalg.solve(gram, tf.matmul(x, (w_fit * plain)[..., None], transpose_a=True))
    dense = dict(fast.dense)
    dense[f"{last}/w"] = w + delta[:, :-1, :]
    dense[f"{last}/b"] = b + delta[:, -1, :]
    return FastWeights(dense, fast.sparse)
