"""Per-table optimizers and everything the package knows about an optimizer kind, defined once.

One ``OptimizerKind`` per supported optimizer holds its slot names (what TFRA calls the slot
tables it creates next to a table, and what the checkpoint's ``<table>.<slot>.npz`` files are
named), so the slot count, the bytes a row costs (``row_bytes``, used by the hot-set budget and
the benchmark) and the hot rows' re-implementation (``row_update``) cannot disagree.

Embeddings get their own optimizers because they must be wrapped by
``de.DynamicEmbeddingOptimizer`` (their slots become TFRA tables that live next to their rows
on the PS) and usually want a larger learning rate than the tower.

There is one wrapped optimizer *per table*, not one for all: TFRA's wrapper, when it applies a
gradient to one table, re-reads and re-writes the slot buffers of *every* table the optimizer
has seen (``_distributed_apply_gradients_fn``), so one shared optimizer costs O(tables²) slot
lookups and upserts per step and lets one table's apply touch another's slot buffers. One
optimizer per table keeps that O(tables) and each apply to its own table.

**Rows trained off the TFRA path** (hot rows, prefetched cold rows). Keras' Adam applied to an
``IndexedSlices`` decays the moments of *every* row and moves every row (dense update), while
TFRA's wrapper updates only the rows looked up in the step. A row must train the same whether
it is hot or cold, so ``row_update`` applies Keras' formulas (same defaults: ``beta_1=0.9,
beta_2=0.999, epsilon=1e-7``) to the touched rows only, with the table's own step counter
(``iterations`` of its TFRA optimizer) for Adam's bias correction. New slot rows start at 0 for
every slot, Adagrad's accumulator included: that is what TFRA's slot tables give a new row
(measured; Keras' own ``initial_accumulator_value=0.1`` does not reach them).
``LazyRowOptimizer`` is deterministic and identical on every rank: the inputs (aggregated slots
and gradients from ``hot/sync.py``) are identical, the slots are unique (plain scatter updates,
no accumulation order), and there is no randomness.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Tuple

import tensorflow as tf

from gmeta_tf.embedding.tfra import tfra

BETA_1, BETA_2, EPSILON = 0.9, 0.999, 1e-7
FLOAT_BYTES = 4


@dataclass(frozen=True)
class OptimizerKind:
    name: str
    slots: Tuple[str, ...]  # TFRA's slot-table names, in the order the checkpoint lists them
    slot_init: float = 0.0  # a new row's slot value in TFRA's slot tables (measured)


KINDS: Dict[str, OptimizerKind] = {
    "adam": OptimizerKind("adam", ("m", "v")),
    "adagrad": OptimizerKind("adagrad", ("accumulator",)),
}


def optimizer_kind(kind: str) -> OptimizerKind:
    if kind not in KINDS:
        raise ValueError(f"unknown embedding optimizer {kind!r} (known: {', '.join(KINDS)})")
    return KINDS[kind]


def slot_names(kind: str) -> Tuple[str, ...]:
    return optimizer_kind(kind).slots


def slot_count(kind: str) -> int:
    return len(slot_names(kind))


def row_bytes(dim: int, kind: str) -> int:
    """Bytes of one embedding row with its optimizer state: the value plus one dim-wide slot each
    (Adam: m and v, 3 × dim floats; Adagrad: 2 ×)."""
    return FLOAT_BYTES * dim * (1 + slot_count(kind))


def slot_init(slot: str) -> float:
    """A missing slot row's value, as TFRA's slot table gives it."""
    return next(k.slot_init for k in KINDS.values() if slot in k.slots)


def keras_optimizer(kind: str, lr: float):
    if kind == "adam":
        return tf.keras.optimizers.Adam(learning_rate=lr)
    if kind == "adagrad":
        return tf.keras.optimizers.Adagrad(learning_rate=lr)
    raise ValueError(f"unknown optimizer {kind!r}")


class TableOptimizers:
    """One ``DynamicEmbeddingOptimizer`` per TFRA shadow variable, created by ``build``."""

    def __init__(self, kind: str, lr: float):
        self.kind = kind
        self.lr = lr
        self.by_shadow: Dict[str, object] = {}
        self.by_table: Dict[str, object] = {}

    def build(self, shadows_by_table: Dict[str, tf.Variable]) -> None:
        """``{table name: shadow}``; the table name keys the checkpointed step counters."""
        for table, shadow in shadows_by_table.items():
            if shadow.name not in self.by_shadow:
                opt = tfra.dynamic_embedding.DynamicEmbeddingOptimizer(keras_optimizer(self.kind, self.lr))
                opt.build([shadow])
                self.by_shadow[shadow.name] = opt
                self.by_table[table] = opt

    def for_shadow(self, shadow):
        return self.by_shadow[shadow.name]

    def apply_gradients(self, grads_and_vars: Iterable[Tuple[tf.Tensor, tf.Variable]]) -> None:
        for grad, shadow in grads_and_vars:
            self.by_shadow[shadow.name].apply_gradients([(grad, shadow)])

    def iterations(self) -> Dict[str, tf.Variable]:
        """Step counters by table (Adam's bias correction needs them after a restore)."""
        return {table: opt.iterations for table, opt in self.by_table.items()}

    @property
    def variables(self) -> List[tf.Variable]:
        return [v for opt in self.by_shadow.values() for v in opt.variables if isinstance(v, tf.Variable)]


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


def first_hot_stands_in(slot: tf.Tensor, *values: tf.Tensor) -> Tuple[tf.Tensor, ...]:
    """``slot`` [U] (-1: not hot) and ``values`` (each [U, ...]) with every entry that is not hot
    replaced by the first hot one. A scatter *update* inside XLA (no unique op, static shapes)
    writes every entry; after this the entries that are not hot write what the first hot one
    writes, so duplicates agree. With no hot entry, every slot stays -1 (the caller writes slot
    0's old value back). Not for scatter-adds: a stand-in would add its value twice."""
    hot = slot >= 0
    first = tf.argmax(tf.cast(hot, tf.int32), output_type=tf.int32)
    src = tf.where(hot, tf.range(tf.shape(slot)[0]), first)
    return (tf.gather(slot, src), *(tf.gather(v, src) for v in values))


class LazyRowOptimizer:
    """``row_update`` on worker-local variables (the hot rows), with their slots beside them."""

    def __init__(self, kind: str, lr: float, values: Dict[str, tf.Variable]):
        if kind not in KINDS:
            raise ValueError(f"hot rows: unsupported optimizer {kind!r}")
        self.kind, self.lr = kind, float(lr)
        self.slots: Dict[str, Dict[str, tf.Variable]] = {
            t: {s: tf.Variable(tf.fill(tf.shape(v), slot_init(s)), name=f"hot-{t}-{s}", trainable=False)
                for s in slot_names(kind)}
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

    def apply_rows(self, var: tf.Variable, table: str, slot: tf.Tensor, grad: tf.Tensor,
                   iterations: tf.Tensor) -> None:
        """``apply`` as the compiled step has its gradients: ``slot`` [U] (each unique id's slot,
        -1 where it is not hot; a hot slot appears once) and ``grad`` [U, dim], static shapes
        and no unique op (XLA has none). A scatter writes every row, so each row that is not
        hot stands in for the first hot row (same slot, same gradient, the same values
        written); untouched slots keep their values and slots: lazy, as ``apply``. Costs the
        batch's rows, not the table's."""
        slot, grad = first_hot_stands_in(slot, grad)
        keep = (slot >= 0)[:, None]
        at = tf.maximum(slot, 0)
        s = self.slots[table]
        old_w = tf.gather(var, at)
        old_slots = {n: tf.gather(v, at) for n, v in s.items()}
        w, new_slots = row_update(self.kind, self.lr, old_w, old_slots, grad, iterations)
        idx = at[:, None]
        for name, value in new_slots.items():
            s[name].scatter_nd_update(idx, tf.where(keep, value, old_slots[name]))
        var.scatter_nd_update(idx, tf.where(keep, w, old_w))
