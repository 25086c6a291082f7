"""The hot rows' optimizer: the same lazy Adam / Adagrad the PS tables get, on local variables.

Why not a Keras optimizer: Keras' Adam applied to an ``IndexedSlices`` decays the moments of
*every* row and moves every row (dense update), while TFRA's wrapper updates only the rows
looked up in the step (their slots are read from and written back to the slot tables). A row
must train the same whether it is hot or cold, so this applies Keras' formulas (same
defaults: ``beta_1=0.9, beta_2=0.999, epsilon=1e-7``) to the touched rows only, with the table's own step counter (``iterations`` of its TFRA
optimizer) for Adam's bias correction. New slot rows start at 0 for every slot, Adagrad's
accumulator included: that is what TFRA's slot tables give a new row (measured; Keras' own
``initial_accumulator_value=0.1`` does not reach them). Slot names match TFRA's slot tables (``m``, ``v``,
``accumulator``) so checkpoints can write them back.

Deterministic and identical on every rank: the inputs (aggregated slots and gradients from
``hot/sync.py``) are identical, the slots are unique (plain scatter updates, no accumulation
order), and there is no randomness.
"""
from __future__ import annotations

from typing import Dict, Tuple

import tensorflow as tf

import gmeta_tf  # noqa: F401

BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7
SLOT_NAMES = {"adam": ("m", "v"), "adagrad": ("accumulator",)}
SLOT_INIT = {"m": 0.0, "v": 0.0, "accumulator": 0.0}


class LazyRowOptimizer:
    def __init__(self, kind: str, lr: float, values: Dict[str, tf.Variable]):
        if kind not in SLOT_NAMES:
            raise ValueError(f"hot rows: unsupported optimizer {kind!r}")
        self.kind, self.lr = kind, float(lr)
        self.slots: Dict[str, Dict[str, tf.Variable]] = {
            t: {s: tf.Variable(tf.fill(tf.shape(v), SLOT_INIT[s]), name=f"hot-{t}-{s}", trainable=False)
                for s in SLOT_NAMES[kind]}
            for t, v in values.items()}

    def apply(self, var: tf.Variable, table: str, slots: tf.Tensor, grad: tf.Tensor,
              iterations: tf.Variable) -> None:
        s = self.slots[table]
        idx = slots[:, None]
        w, new_slots = row_update(self.kind, self.lr, tf.gather(var, slots),
                                  {n: tf.gather(v, slots) for n, v in s.items()}, grad, iterations)
        for name, value in new_slots.items():
            s[name].scatter_nd_update(idx, value)
        var.scatter_nd_update(idx, w)


def row_update(kind: str, lr: float, w: tf.Tensor, slots: Dict[str, tf.Tensor], grad: tf.Tensor,
               iterations) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
    """New values and slots of rows ``w`` given their gradient: Keras' Adam / Adagrad formulas
    (what TFRA's wrapped optimizer computes for a looked-up row), as pure tensors so the hot rows
    (scattered into local variables) and the prefetched cold rows (written to the PS later,
    ``hot/prefetch.py``) share one definition."""
    if kind == "adam":
        t = tf.cast(iterations + 1, tf.float32)
        alpha = lr * tf.sqrt(1.0 - tf.pow(BETA_2, t)) / (1.0 - tf.pow(BETA_1, t))
        m = slots["m"] + (grad - slots["m"]) * (1.0 - BETA_1)
        v = slots["v"] + (tf.square(grad) - slots["v"]) * (1.0 - BETA_2)
        return w - (m * alpha) / (tf.sqrt(v) + EPSILON), {"m": m, "v": v}
    acc = slots["accumulator"] + tf.square(grad)
    return w - lr * grad / tf.sqrt(acc + EPSILON), {"accumulator": acc}
