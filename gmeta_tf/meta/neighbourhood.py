"""The neighbourhood head (``model.neighbourhood``): a user's support residuals reach the query
items most like the items they were on.

Why: the per-user head is a linear correction on features every user shares. It can move a
user's scores up or down, but it cannot say "this user rates higher than we predict what is
similar to what they rated higher than we predicted", which is what orders a person's items
(item-based neighbourhood models, Koren 2008). After the inner loop has fitted the head, each
query item q gains

    γ · Σ_s w_qs r_s / (Σ_s w_qs + λ),    w_qs = exp(β (cos(k_q, k_s) − 1))

over the task's support samples s, with r_s = y_s − ŷ_s the support residual left by the adapted
head (standardised units; for clicks y − p), k the item keys, cos their cosine, β a learned sharpness (NAIS-style
attention, He et al. 2018, with the weights unnormalised) and λ a learned shrinkage: a query item
with few similar support items gets a term near 0, one with many gets their weighted mean residual.

The keys are the tower's hidden features (what the head is fitted on) projected by a learned
matrix, so the similarity is learned jointly with the head by the outer loss. The term is part of
the adapted user's prediction, so training (``inner_loop.outer_losses``), evaluation and the export
(``evaluate.query_predictions``, run inside the SavedModel) all score with ``adapted_scores``.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf

# The dense weights of the head (in the tower's variables: averaged, checkpointed, exported).
KEY = "neighbourhood/key"  # [H, K]: hidden features → item key
LOG_SHARPNESS = "neighbourhood/log_sharpness"  # [1]: log β
LOG_SHRINK = "neighbourhood/log_shrink"  # [1]: log λ, in units of fully similar support items
WEIGHT = "neighbourhood/weight"  # [1]: γ
NAMES = (KEY, LOG_SHARPNESS, LOG_SHRINK, WEIGHT)


def add_neighbourhood(model, dim: int, seed: int = 0, sharpness: float = 5.0, shrink: float = 2.0,
                      weight: float = 0.5) -> None:
    """Give ``model``'s tower the head's weights (``model.neighbourhood``), keys of width ``dim``."""
    hidden = int(model.dense_variables[f"{model.tower.head_layer}/w"].shape[0])
    rng = np.random.default_rng(seed + 7919)
    key = rng.normal(0.0, 1.0 / np.sqrt(hidden), size=(hidden, dim)).astype(np.float32)
    v = model.dense_variables
    v[KEY] = tf.Variable(key, name="neighbourhood_key")
    v[LOG_SHARPNESS] = tf.Variable([np.log(sharpness)], dtype=tf.float32, name="neighbourhood_log_sharpness")
    v[LOG_SHRINK] = tf.Variable([np.log(shrink)], dtype=tf.float32, name="neighbourhood_log_shrink")
    v[WEIGHT] = tf.Variable([weight], dtype=tf.float32, name="neighbourhood_weight")


def enabled(params: Mapping[str, tf.Tensor]) -> bool:
    return KEY in params


def term(params: Mapping[str, tf.Tensor], query_hidden: tf.Tensor, support_hidden: tf.Tensor,
         residual: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """``[T, Q]``: each query item's share of the support residuals (module docstring).

    ``query_hidden [T, Q, H]``, ``support_hidden [T, S, H]``, ``residual`` / ``mask`` ``[T, S]``;
    padded support samples weigh 0, and a task with no support gets 0."""
    key = params[KEY]
    kq = tf.math.l2_normalize(tf.einsum("tqh,hk->tqk", query_hidden, key), axis=-1)
    ks = tf.math.l2_normalize(tf.einsum("tsh,hk->tsk", support_hidden, key), axis=-1)
    cos = tf.einsum("tqk,tsk->tqs", kq, ks)
    w = tf.exp(tf.exp(params[LOG_SHARPNESS][0]) * (cos - 1.0)) * mask[:, None, :]  # [T, Q, S]
    num = tf.einsum("tqs,ts->tq", w, residual * mask)
    return params[WEIGHT][0] * num / (tf.reduce_sum(w, axis=-1) + tf.exp(params[LOG_SHRINK][0]))


def adapted_scores(model, dense: Mapping[str, tf.Tensor], batch: dict, sparse) -> tf.Tensor:
    """``[T, Q]`` query scores (standardised units) under adapted weights ``dense``: the head's,
    plus the neighbourhood term when the model has one. ``sparse`` is the batch's (adapted)
    ``SparseState``."""
    q, s = batch["query"], batch["support"]
    hq = model.tower.hidden(dense, q["dense"], sparse.embed("query"))
    scores = model.tower.head(dense, hq)
    if not enabled(dense):
        return scores
    hs = model.tower.hidden(dense, s["dense"], sparse.embed("support"))
    fitted = model.tower.head(dense, hs)
    residual = model.scale_labels(s["label"]) - (tf.sigmoid(fitted) if model.kind == "click" else fitted)
    return scores + term(dense, hq, hs, residual, s["mask"])
