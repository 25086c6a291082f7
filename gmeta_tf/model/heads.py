"""Per-task losses for the two heads. Every loss is a masked *mean per task* (``[T]``).

A per-task mean (not a mean over the whole batch) keeps tasks of different sizes equally
weighted, which is what the MAML objective averages; and because tasks are independent, the
gradient of the *sum* of per-task losses w.r.t. tiled ``[T, ...]`` weights is exactly each
task's own gradient, which is what makes the vectorized inner loop correct.
"""
from __future__ import annotations

import tensorflow as tf

import gmeta_tf  # noqa: F401


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
