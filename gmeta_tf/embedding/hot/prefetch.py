"""Cold rows read one step ahead and written one step behind, so PS round-trips overlap compute.

With the hot rows local, what is left of a step's PS work is the cold rows: TFRA's shadow path
reads them at the start of the step (values), reads their optimizer slots after the backward
pass and writes values and slots at the end: three round-trips, each on the step's critical
path. A ``ColdPrefetch`` per hot/cold table takes all three off it:

* **read ahead**: step t's graph also looks up batch t+1's cold ids (values *and* slots, one
  round-trip) on the PS. Nothing in step t's compute depends on that lookup, so it runs while
  the worker computes;
* **apply locally**: the gradient of the buffered rows is applied on the worker with the same
  Adam / Adagrad formulas TFRA's optimizer uses (``embedding/optimizers.row_update``), with the table's
  own step counter;
* **write behind**: the new values and slots are written at the *start* of step t+1 (before
  its read-ahead of batch t+2), again overlapping compute. ``flush`` writes them at once; the
  trainer calls it on every rank before a checkpoint.

Where this is safe, and why it is exact for one worker: batch t+1's rows are read before step t
writes its update, so a row that both batches touch would be read stale. Step t knows that
row's new value (it computed it), so before step t+1 runs, those rows are **patched** with
step t's values and slots. Rows step t did not touch were written by step t-1 before the read
(the write-behind is ordered before the read-ahead), so every row step t+1 sees is what the
plain path would have read: one worker trains bit-for-bit the same rows (tested). With several
workers the rows of *other* workers' updates arrive up to one step later than on the plain path,
the staleness an asynchronous PS already has within a step; with ``bp_v2`` tables (the
distributed default) the write is TFRA's ``accum`` (add ``new - old``, insert when absent), so
concurrent workers' updates still add up instead of overwriting each other, as with TFRA's
own apply. Tables served wholly by hot rows (``local_only``) have no PS work and no prefetch.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import tensorflow as tf

from gmeta_tf.embedding.optimizers import row_update, slot_init

Fields = Dict[str, Tuple[tf.Tensor, tf.Tensor]]  # field ("value", "m", ...) -> (rows, exists)


def _buffer(name: str, dtype, dim: Optional[int], trainable: bool = False) -> tf.Variable:
    shape = [0] if dim is None else [0, dim]
    return tf.Variable(tf.zeros(shape, dtype), shape=[None] + shape[1:], trainable=trainable, name=name)


def read_rows(sources: Dict[str, object], ids: tf.Tensor, dim: int, table) -> Fields:
    """``ids``' rows in each table of ``sources`` (field -> de.Variable: "value", then slots).
    A missing row gets its initial row (``table.fill_missing``, ``table`` the ``EmbeddingTable``
    of "value") and a missing slot its optimizer's initial value, as through the table's
    trainable lookup; hot rows load the same way (``HotRows.load``)."""
    out = {}
    for f, src in sources.items():
        rows, exists = src.lookup(ids, return_exists=True)
        rows = tf.reshape(rows, [-1, dim])
        if f == "value":
            rows = table.fill_missing(ids, rows, exists)
        else:
            rows = tf.where(exists[:, None], rows, tf.fill(tf.shape(rows), slot_init(f)))
        out[f] = (rows, exists)
    return out


class ColdPrefetch:
    """Buffers of one table: the next batch's cold rows (``cur``) and the last update (``pend``)."""

    def __init__(self, table, kind: str, lr: float, slot_tables: Dict[str, object]):
        self.table = table
        self.kind, self.lr = kind, float(lr)
        self.dim = table.dim
        # field -> the de.Variable (PS table) it lives in: the embedding, then its optimizer slots
        self.sources = {"value": table.base.variable, **slot_tables}
        n = table.name
        self.ids = _buffer(f"pf-{n}-ids", tf.int64, None)
        # The rows the next step trains on; the tape watches "value" (it is the cold lookup).
        self.cur = {f: _buffer(f"pf-{n}-{f}", tf.float32, self.dim, trainable=f == "value") for f in self.sources}
        self.cur_exists = {f: _buffer(f"pf-{n}-{f}-exists", tf.bool, None) for f in self.sources}
        self.pend_ids = _buffer(f"pf-{n}-pend-ids", tf.int64, None)
        self.pend_old = {f: _buffer(f"pf-{n}-pend-{f}-old", tf.float32, self.dim) for f in self.sources}
        self.pend_new = {f: _buffer(f"pf-{n}-pend-{f}-new", tf.float32, self.dim) for f in self.sources}
        self.pend_exists = {f: _buffer(f"pf-{n}-pend-{f}-exists", tf.bool, None) for f in self.sources}

    @property
    def trainable(self) -> tf.Variable:
        return self.cur["value"]

    # -- PS side ---------------------------------------------------------------------------------
    def fetch(self, ids: tf.Tensor) -> Fields:
        """Values and slots of ``ids`` from the PS: one round-trip (the lookups run in parallel)."""
        return read_rows(self.sources, ids, self.dim, self.table.base)

    def flush(self) -> None:
        """Write the pending update to the PS (TFRA's ``update_op``: ``accum`` for bp_v2 tables,
        ``upsert`` otherwise), then forget it, so a second flush writes nothing (a delta written
        twice would count twice)."""
        ids = self.pend_ids.read_value()
        for f, src in self.sources.items():
            if src.bp_v2:
                src.accum(ids, self.pend_old[f].read_value(), self.pend_new[f].read_value(),
                          self.pend_exists[f].read_value())
            else:
                src.upsert(ids, self.pend_new[f].read_value())
        self.pend_ids.assign(tf.zeros([0], tf.int64))
        for f in self.sources:
            for buf in (self.pend_old[f], self.pend_new[f]):
                buf.assign(tf.zeros([0, self.dim]))
            self.pend_exists[f].assign(tf.zeros([0], tf.bool))

    # -- worker side -----------------------------------------------------------------------------
    def rows(self, ids: tf.Tensor) -> tf.Tensor:
        """The buffered rows of ``ids`` (the cold ids of the batch being trained, in lookup order)."""
        have = self.ids.read_value()
        # Counts by reduction, not tf.size: in this graph grappler folded tf.size of these
        # dynamically shaped tensors to 0 (seen on TF 2.16), which made the check vacuous.
        n_have = tf.reduce_sum(tf.ones_like(have, tf.int32))
        n_ids = tf.reduce_sum(tf.ones_like(ids, tf.int32))
        same = tf.cond(tf.equal(n_have, n_ids),
                       lambda: tf.reduce_all(tf.equal(have, ids)), lambda: tf.constant(False))
        check = tf.debugging.Assert(same, [f"table {self.table.name}: the prefetched cold rows belong to another "
                                           f"batch; TrainStep.step(batch, next_batch) must next be called "
                                           f"with the next_batch it was given"])
        with tf.control_dependencies([check]):
            return tf.identity(self.cur["value"].read_value())

    def update(self, grad: tf.Tensor, iterations) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
        """Apply ``grad`` (dense, one row per buffered row: every cold row of a batch is used, as
        on the shadow path) and queue the write. Returns (ids, new fields) for ``store``'s patch."""
        slots = {f: self.cur[f].read_value() for f in self.sources if f != "value"}
        w, new_slots = row_update(self.kind, self.lr, self.cur["value"].read_value(), slots,
                                  tf.reshape(grad, [-1, self.dim]), iterations)
        new = {"value": w, **new_slots}
        ids = self.ids.read_value()
        # All or nothing: a step that fails (say, the batch check in ``rows``) must not leave a
        # half-queued write for the next flush.
        with tf.control_dependencies(list(new.values())):
            self.pend_ids.assign(ids)
            for f in self.sources:
                self.pend_old[f].assign(self.cur[f].read_value())
                self.pend_new[f].assign(new[f])
                self.pend_exists[f].assign(self.cur_exists[f].read_value())
        return ids, new

    def store(self, ids: tf.Tensor, fetched: Fields, done: Optional[Tuple[tf.Tensor, Dict[str, tf.Tensor]]]) -> None:
        """Make ``fetched`` the next step's rows, first replacing the rows this step updated
        (``done``: read before this step's write, so stale) with their new values."""
        if done is not None:
            done_ids, new = done
            order = tf.argsort(done_ids)
            # A sentinel past every id keeps the gathers valid when this step had no cold rows.
            keys = tf.concat([tf.gather(done_ids, order), tf.constant([tf.int64.max], tf.int64)], 0)
            pos = tf.searchsorted(keys, ids)
            found = tf.equal(tf.gather(keys, pos), ids)
            src = tf.gather(tf.concat([order, [0]], 0), pos)
        self.ids.assign(ids)
        for f in self.sources:
            rows, exists = fetched[f]
            if done is not None:
                patched = tf.gather(tf.concat([new[f], tf.zeros([1, self.dim])], 0), src)
                rows = tf.where(found[:, None], patched, rows)
                exists = exists | found  # written by the flush before the next step uses it
            self.cur[f].assign(rows)
            self.cur_exists[f].assign(exists)
