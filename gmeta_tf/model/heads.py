"""Per-task losses for the two heads. Every loss is a masked *mean per task* (``[T]``).

A per-task mean (not a mean over the whole batch) keeps tasks of different sizes equally
weighted, which is what the MAML objective averages; and because tasks are independent, the
gradient of the *sum* of per-task losses w.r.t. tiled ``[T, ...]`` weights is exactly each
task's own gradient, which is what makes the vectorized inner loop correct.
"""
from __future__ import annotations

import tensorflow as tf


def per_sample_loss(kind: str, scores: tf.Tensor, labels: tf.Tensor, rating_loss: str = "squared") -> tf.Tensor:
    """Log loss for clicks; for ratings ``rating_loss`` (``model.rating_loss``): ``squared``
    makes the score a conditional mean (what RMSE rewards), ``absolute`` a conditional median
    (what MAE rewards: rating distributions are skewed, so the two differ)."""
    if kind == "click":
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=scores)
    if rating_loss == "absolute":
        return tf.abs(scores - labels)
    return tf.square(scores - labels)


def per_task_loss(kind: str, scores: tf.Tensor, labels: tf.Tensor, mask: tf.Tensor,
                  rating_loss: str = "squared") -> tf.Tensor:
    """``[T, N]`` scores / labels / mask → ``[T]`` masked mean (0 for a task with no samples)."""
    losses = per_sample_loss(kind, scores, labels, rating_loss) * mask
    return tf.reduce_sum(losses, axis=1) / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)


def predictions(kind: str, scores: tf.Tensor) -> tf.Tensor:
    return tf.sigmoid(scores) if kind == "click" else scores


def per_task_ranking_loss(how: str, scores: tf.Tensor, labels: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """``[T]`` loss of each task's *order* of its samples (``model.ranking_loss``), 0 for ``none``.

    A pointwise loss (squared, absolute) scores each sample on its own: a task's scores can all be
    off by the same amount and still order its items perfectly, or be close on average and order
    them badly. A cold user is shown an order, so these terms look only at differences within a
    task (a per-user bias adds nothing to them):

    * ``listnet``: cross-entropy between the softmax of the task's labels and of its scores (ListNet,
      Cao et al. 2007): the top-one probabilities of the labels' order, matched as a whole list.
    * ``pairwise``: mean over the task's pairs with different labels of log(1 + exp(−(s_i − s_j)))
      for y_i > y_j (RankNet, Burges et al. 2005), weighted by |y_i − y_j|.

    Labels and scores are in the model's standardised units; padded samples take no part.
    """
    if how == "none":
        return tf.zeros(tf.shape(scores)[:1])
    valid = mask > 0
    if how == "listnet":
        neg = tf.fill(tf.shape(scores), -1e9)
        target = tf.nn.softmax(tf.where(valid, labels, neg), axis=1)
        log_p = tf.nn.log_softmax(tf.where(valid, scores, neg), axis=1)
        has = tf.cast(tf.reduce_sum(mask, axis=1) > 1, scores.dtype)  # one sample has no order
        return -tf.reduce_sum(tf.where(valid, target * log_p, tf.zeros_like(log_p)), axis=1) * has
    if how == "pairwise":
        dy = labels[:, :, None] - labels[:, None, :]  # [T, N, N]: y_i − y_j
        ds = scores[:, :, None] - scores[:, None, :]
        pair = tf.cast(dy > 0, scores.dtype) * mask[:, :, None] * mask[:, None, :]
        weight = pair * dy
        loss = tf.nn.softplus(-ds) * weight
        return tf.reduce_sum(loss, axis=[1, 2]) / tf.maximum(tf.reduce_sum(weight, axis=[1, 2]), 1e-9)
    raise ValueError(f"unknown ranking loss {how!r}")
