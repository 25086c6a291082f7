"""``model.hot_sync_every: k``: hot replicas that sync every k steps, not every step (HET-style).

With ``k = 1`` (the default) nothing here is used: every step all-gathers / all-reduces the hot
rows' gradients (``hot/sync.py``) and every rank applies the same mean, bit for bit as before
this key existed.

With ``k > 1`` a **window** is the steps since the last sync. Inside it each rank trains its own
replica: it applies *its own* gradient to the rows it touched with the lazy optimizer
(``LazyRowOptimizer``, the table's step counter as usual), so its next lookups see its own
progress, and it adds the same gradient to an accumulator beside the rows, marking them touched.
Nothing crosses a link. A step whose number is a multiple of ``k`` closes the window
(``HotRows.apply(sync=True)``), as does a **forced sync** between steps before anything reads
the replicas as the run's state: a checkpoint (so also a preemption's and the last step's), an
eviction (``HotRows.sync_now``). The schedule is the step number's, the same on every rank, and
a forced sync is asked for at the same step on every rank (the trainer's checkpoint points are
agreed), so every rank makes the same collective calls.

**What a sync does, per table** (every rank computes the same, from the same exchanged tensors):

1. the accumulated gradients of the window's touched rows cross with ``hot/sync.py``'s exchange
   (sparse all-gather of int32 ids and values in ``cluster.wire_dtype``, or dense all-reduce of
   the ``[K, dim + 1]`` accumulator, whichever moves fewer bytes for the rows a *window* is
   expected to touch); out come the union ``U`` of the rows any rank touched and, for each,
   ``G = (1/N) Σ_ranks Σ_window g``: the window's per-step gradients summed, averaged over
   ranks (a row a rank did not touch counts as zero, as in the every-step exchange);
2. the rows of ``U`` are reset, values *and* optimizer slots, to what they were at the last sync
   (the **anchor**), which discards each rank's local steps;
3. ``U`` takes **one** optimizer step with ``G``. Adam's (and the counter's) step number is
   ``t`` = the window's last step: the table's counter keeps advancing once every step, as the
   cold rows sharing it need, and bias correction uses ``1 - β^t`` of that step, exactly what a
   ``k = 1`` step at ``t`` uses. So over a window a hot row gets one moment update and one move,
   not one per step: for Adam (scale-free) the window's summed gradient moves the row about one
   step's length; for Adagrad the summed gradient's square enters the accumulator once;
4. the anchor of ``U`` becomes the new rows, the accumulator and touched marks are cleared.

Rows no rank touched in the window were moved by nobody: still their anchor everywhere. So at
every sync point the replicas are identical on every rank, and ``k = 1`` is this with a window
of one step (the reset is a no-op, ``G`` the step's mean gradient, ``t`` the step): the same
update as the every-step path, which keeps its own code so it stays bit for bit what it was.

**Why accumulated gradients and not the replicas' deltas** (by bytes): a sync must make the rows
*and their optimizer slots* identical. Averaging replicas sends, per touched row, the value's
delta and every slot (Adam: ``3·dim`` values; Adagrad: ``2·dim``) plus the id; sending the
accumulated gradient sends ``dim`` values plus the 4-byte id, and every rank recomputes values
and slots from it. Per window each rank sends ``(N-1)·U_k·(dim·b + 4)`` bytes (``b`` = 4, or 2
in bfloat16) against ``(N-1)·U_k·(3·dim·b + 4)``: about a third for Adam, half for Adagrad; and
against the every-step exchange, ``U_k ≤ k·U_1`` rows a window instead of ``U_1`` a step, fewer
the more the steps of a window share hot rows (they do: hot rows are the popular ones).

The state this adds (``anchor`` values and slots, the accumulator, the marks) is not
checkpointed: a checkpoint forces a sync first, after which the accumulator is empty and the
anchor equals the rows; a resumed run rebuilds that from the restored rows (``restart``).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import tensorflow as tf

from gmeta_tf.embedding.optimizers import first_hot_stands_in


class StaleWindow:
    """The per-table state of one window: anchors (values and slots at the last sync), the
    accumulated gradients and the touched marks."""

    def __init__(self, values: Dict[str, tf.Variable], slots: Dict[str, Dict[str, tf.Variable]]):
        self.values, self.slots = values, slots
        self.anchor = {t: tf.Variable(v, trainable=False, name=f"hot-{t}-anchor") for t, v in values.items()}
        self.anchor_slots = {t: {s: tf.Variable(v, trainable=False, name=f"hot-{t}-{s}-anchor")
                                 for s, v in slots[t].items()} for t in values}
        self.acc = {t: tf.Variable(tf.zeros_like(v), trainable=False, name=f"hot-{t}-acc") for t, v in values.items()}
        self.touched = {t: tf.Variable(tf.zeros([v.shape[0]], tf.bool), trainable=False, name=f"hot-{t}-touched")
                        for t, v in values.items()}

    def restart(self) -> None:
        """A window from the rows as they are now (eager; after load / the start broadcast)."""
        for t, v in self.values.items():
            self.anchor[t].assign(v)
            for s, var in self.slots[t].items():
                self.anchor_slots[t][s].assign(var)
            self.acc[t].assign(tf.zeros_like(v))
            self.touched[t].assign(tf.zeros_like(self.touched[t]))

    def add(self, table: str, slots: tf.Tensor, grad: tf.Tensor) -> None:
        """Accumulate one step's gradient of ``slots`` (unique, ``sync.touched_slots``)."""
        idx = slots[:, None]
        self.acc[table].scatter_nd_add(idx, grad)
        self.touched[table].scatter_nd_update(idx, tf.ones_like(slots, tf.bool))

    def add_rows(self, table: str, slot: tf.Tensor, grad: tf.Tensor) -> None:
        """``add`` inside the compiled step (``meta.hot_in_program``): ``slot`` [U] is each of the
        batch's unique ids' hot slot, -1 for a cold id or the pad (a hot slot appears once), and
        ``grad`` [U, dim] their gradients; static shapes, no unique op. An entry that is not hot
        adds zeros to slot 0, and marks what the first hot entry marks."""
        hot = slot >= 0
        at = tf.maximum(slot, 0)[:, None]
        self.acc[table].scatter_nd_add(at, tf.where(hot[:, None], grad, tf.zeros_like(grad)))
        marked = first_hot_stands_in(slot)[0]
        at = tf.maximum(marked, 0)
        self.touched[table].scatter_nd_update(at[:, None], (marked >= 0) | tf.gather(self.touched[table], at))

    def pending(self, table: str) -> tf.IndexedSlices:
        """The window's accumulated gradient, over the rows this rank touched."""
        idx = tf.reshape(tf.where(self.touched[table]), [-1])
        return tf.IndexedSlices(tf.gather(self.acc[table], idx), idx, tf.shape(self.acc[table], out_type=tf.int64))

    def rewind(self, table: str, rows: tf.Tensor) -> None:
        """Rows ``rows`` (values and slots) back to their anchor."""
        idx = rows[:, None]
        self.values[table].scatter_nd_update(idx, tf.gather(self.anchor[table], rows))
        for s, var in self.slots[table].items():
            var.scatter_nd_update(idx, tf.gather(self.anchor_slots[table][s], rows))

    def commit(self, table: str, rows: tf.Tensor) -> None:
        """The synced ``rows`` are the new anchor; the window starts empty."""
        idx = rows[:, None]
        self.anchor[table].scatter_nd_update(idx, tf.gather(self.values[table], rows))
        for s, var in self.slots[table].items():
            self.anchor_slots[table][s].scatter_nd_update(idx, tf.gather(var, rows))
        self.acc[table].assign(tf.zeros_like(self.acc[table]))
        self.touched[table].assign(tf.zeros_like(self.touched[table]))

    def merge(self, names: List[str], grad_sync, apply_fn) -> None:
        """Close the window (steps 1-4 of the module docstring): ``grad_sync`` exchanges, then
        per table ``apply_fn(table, rows, mean gradient)`` takes the one optimizer step."""
        merged: List[Tuple[tf.Tensor, tf.Tensor]] = grad_sync.aggregate(names, [self.pending(t) for t in names])
        for table, (rows, grad) in zip(names, merged):
            rows = tf.cast(rows, tf.int64)
            self.rewind(table, rows)
            apply_fn(table, rows, grad)
            self.commit(table, rows)
