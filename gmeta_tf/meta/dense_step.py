"""The dense math of a meta step — inner loop, query loss, outer gradient — as one XLA program.

A meta step is TFRA work (unique ids, hash-table finds, the optimizer's inserts) around dense
math on the gathered rows. The dense part is hundreds of tiny ops at the quickstart shapes
(batched ``[T, ...]`` matmuls, their first and second derivatives), so TensorFlow's executor
spends more time scheduling them than computing; XLA fuses them into a few loops.

The split keeps TFRA out of the compiled program (its kernels have no XLA lowering, and a PS
lookup is an RPC): the caller looks the rows up under its own tape, passes the rows and the
dense weights' *values* to ``DenseStep.run``, which returns the loss and the gradients for the
rows and the dense weights; the caller chains the row gradients back to the shadow variables
(``tape.gradient(rows, shadows, output_gradients=...)``) and applies as before.

Static shapes: XLA compiles once per input shape. The number of unique rows changes every
step, so every table's rows are padded (with zeros nobody gathers) to the most rows the batch
could have — one per id position, plus the pad row — which depends only on the batch shape.
One compile per batch shape; a padded row gets a zero gradient and is sliced away by the pad's
own gradient.

``meta.jit_compile`` picks it (``jit_enabled``); the objectives below are also what the
uncompiled step runs, so both paths evaluate the same expressions.

``meta.hot_in_program`` (``ProgramStep``) moves more into the program: the hot tier's rows
(gathered from their worker-local variables inside it, ``hot_cold.py``'s ``hot_apart``), the
dense optimizer's apply and the hot rows' lazy Adam / Adagrad (``LazyRowOptimizer.apply_rows``).
What stays outside is TFRA's: the cold ids' lookup before it, their apply after.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from gmeta_tf.config.schema import MetaConfig
from gmeta_tf.embedding.lookup import FeatureRows, SparseState
from gmeta_tf.meta.inner_loop import InnerLoopSpec, adapt, initial_fast_weights, outer_losses
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.model.heads import per_sample_loss

# The per-sample fields of a task batch the dense math reads (ids never enter it: positions do).
_SAMPLE_KEYS = ("dense", "label", "mask")

# Where ``meta.jit_compile: auto`` compiles: the (algo, inner_solver) pairs where the compiled
# step measured faster in ``make bench`` (docs/profile.md has the numbers). None, on CPU: with
# the cores not oversubscribed the uncompiled step runs independent ops side by side and the
# XLA program loses (0.77-0.89x, every row; 2 workers + 2 PS 0.90x). It only won with
# inter-op parallelism off, or on a box loaded 6-7 by other jobs. Newton loses most: XLA's
# CPU lowering of the batched solve is much slower than TensorFlow's kernel. GPUs are not
# measured yet.
AUTO_JIT: frozenset = frozenset()


def jit_enabled(meta: MetaConfig) -> bool:
    if meta.jit_compile == "auto":
        return (meta.algo, meta.inner_solver) in AUTO_JIT
    return bool(meta.jit_compile)


def embedding_penalty(model: DLRM, sparse: SparseState, batch: dict) -> tf.Tensor:
    """``model.embedding_l2`` × the mean squared norm of every sample's embeddings (0 when off)."""
    l2 = float(model.cfg.embedding_l2)
    if l2 == 0.0:
        return tf.constant(0.0)
    total, count = 0.0, 0.0
    for which in ("support", "query"):
        mask = batch[which]["mask"] * batch["task_mask"][:, None]
        sq = tf.reduce_sum(tf.square(sparse.embed(which)), axis=[2, 3])  # [T, N]
        total += tf.reduce_sum(sq * mask)
        count += tf.reduce_sum(mask)
    return l2 * total / tf.maximum(count, 1.0)


def maml_objective(model: DLRM, spec: InnerLoopSpec, params: Mapping[str, tf.Tensor],
                   sparse: SparseState, batch: dict) -> tf.Tensor:
    """Mean query loss after adapting ``params`` on the support set, plus the embedding penalty."""
    num_tasks = tf.shape(batch["task_mask"])[0]
    fast = initial_fast_weights(model, sparse, spec.adapted, num_tasks, params)
    fast = adapt(model, fast, batch, spec)
    q = outer_losses(model, fast, batch)
    tm = batch["task_mask"]
    return tf.reduce_sum(q * tm) / tf.maximum(tf.reduce_sum(tm), 1.0) + embedding_penalty(model, sparse, batch)


def erm_objective(model: DLRM, params: Mapping[str, tf.Tensor], sparse: SparseState, batch: dict) -> tf.Tensor:
    """Plain mini-batch loss over every support and query sample of the batch."""
    total, count = 0.0, 0.0
    for which in ("support", "query"):
        part = batch[which]
        scores = model.tower.forward(params, part["dense"], sparse.embed(which))
        losses = per_sample_loss(model.kind, scores, model.scale_labels(part["label"]), model.outer_loss)
        mask = part["mask"] * batch["task_mask"][:, None]
        total += tf.reduce_sum(losses * mask)
        count += tf.reduce_sum(mask)
    return total / tf.maximum(count, 1.0) + embedding_penalty(model, sparse, batch)


def padded_rows(sparse: SparseState) -> List[tf.Tensor]:
    """Every feature's rows zero-padded to its static bound (one row per id position + the pad row)."""
    out = []
    for f in sparse.features:
        s, q = f.support_pos.shape.num_elements(), f.query_pos.shape.num_elements()
        if s is None or q is None:  # a retraced step with relaxed batch shapes: still correct, compiled per shape
            bound = tf.size(f.support_pos) + tf.size(f.query_pos) + 1
            out.append(tf.pad(f.rows, [[0, bound - tf.shape(f.rows)[0]], [0, 0]]))
            continue
        r = f.rows
        out.append(tf.ensure_shape(tf.pad(r, [[0, s + q + 1 - tf.shape(r)[0]], [0, 0]]), [s + q + 1, r.shape[-1]]))
    return out


class DenseStep:
    """``run(sparse, batch)`` → loss and gradients for the rows and the dense weights, compiled."""

    def __init__(self, model: DLRM, meta: MetaConfig):
        self.model = model
        self.spec = InnerLoopSpec.from_meta(model, meta)
        self.erm = meta.algo == "erm"
        self.names = list(model.dense_variables)
        self.multi = [False] * len(model.cat_names) + [True] * len(model.multi_names)  # lookup_batch's order
        # No AutoGraph: the dense math has no tensor-dependent Python control flow to convert.
        self._compiled = tf.function(self._loss_and_grads, jit_compile=True, reduce_retracing=True, autograph=False)

    def objective(self, params: Mapping[str, tf.Tensor], sparse: SparseState, batch: dict) -> tf.Tensor:
        if self.erm:
            return erm_objective(self.model, params, sparse, batch)
        return maml_objective(self.model, self.spec, params, sparse, batch)

    def run(self, rows: Sequence[tf.Tensor], sparse: SparseState, batch: dict
            ) -> Tuple[tf.Tensor, List[tf.Tensor], List[tf.Tensor]]:
        """Loss, gradients w.r.t. ``rows`` (``sparse``'s rows, padded by ``padded_rows``) and
        w.r.t. the dense weights (in ``model.dense_variables`` order)."""
        params = [self.model.dense_variables[n].read_value() for n in self.names]
        positions = [(f.support_pos, f.query_pos, f.support_valid, f.query_valid) for f in sparse.features]
        samples = {w: {k: batch[w][k] for k in _SAMPLE_KEYS if k in batch[w]} for w in ("support", "query")}
        samples["task_mask"] = batch["task_mask"]
        loss, row_grads, dense_grads = self._compiled(list(rows), params, positions, samples)
        return loss, row_grads, dense_grads

    def _loss_and_grads(self, rows, params, positions, batch):
        sparse = SparseState([FeatureRows(r, *p, multi=m) for r, p, m in zip(rows, positions, self.multi)])
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(rows + params)
            loss = self.objective(dict(zip(self.names, params)), sparse, batch)
        grads = tape.gradient(loss, rows + params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = [tf.convert_to_tensor(g) for g in grads]
        return loss, grads[: len(rows)], grads[len(rows):]


def _padded(x: tf.Tensor, f: FeatureRows, value: int) -> tf.Tensor:
    """``x`` [n] padded with ``value`` to the bound ``padded_rows`` pads ``f``'s rows to."""
    s, q = f.support_pos.shape.num_elements(), f.query_pos.shape.num_elements()
    if s is None or q is None:
        bound = tf.size(f.support_pos) + tf.size(f.query_pos) + 1
        return tf.pad(x, [[0, bound - tf.shape(x)[0]]], constant_values=value)
    return tf.ensure_shape(tf.pad(x, [[0, s + q + 1 - tf.shape(x)[0]]], constant_values=value), [s + q + 1])


def padded_slots(sparse: SparseState, features: Sequence[int]) -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
    """``features``' hot slots per unique id (``FeatureRows.hot_slot``, padded with -1: not hot)
    and, with per-task rows, each row's unique id (``hot_source``, padded with 0: a pad row is
    never gathered, its gradient is zero), both to the rows' bound."""
    slots = [_padded(sparse.features[i].hot_slot, sparse.features[i], -1) for i in features]
    sources = [_padded(sparse.features[i].hot_source, sparse.features[i], 0) for i in features
               if sparse.features[i].hot_source is not None]
    return slots, sources


# What the program does with the hot rows' gradients this step (``ProgramStep.run``):
# "apply": one process, no window: the rank's own gradient is the mean, applied in the program;
# "exchange": several workers, the hot rows synced every step: the gradients leave the program
#   (per unique id, with its slot) for ``hot/sync.py``'s exchange and the apply after it;
# "local": a step inside a ``model.hot_sync_every`` window: accumulate, and apply the rank's own;
# "close": the step that closes the window: accumulate only; the exchange, the rewind to the
#   anchor and the one optimizer step follow outside (``StaleWindow.merge``).
HOT_STEPS = ("apply", "exchange", "local", "close")


@dataclass(frozen=True)
class HotFeature:
    """A feature whose table has hot rows the program gathers and trains itself: its index in the
    lookup's feature order, the hot rows' variable, how to apply their update
    (``HotRows.apply_rows(table, slot, row_grads, iterations)``, bound to the table) and how to
    add it to the window's accumulator (``StaleWindow.add_rows``, bound; None without a window)."""

    index: int
    values: tf.Variable
    apply_rows: Callable[[tf.Tensor, tf.Tensor, tf.Tensor], None]
    add_rows: Optional[Callable[[tf.Tensor, tf.Tensor], None]] = None


class ProgramStep:
    """``meta.hot_in_program``: the hot rows' gather, the dense math, the dense optimizer and the
    hot rows' lazy optimizer as one XLA program. ``DenseStep`` leaves the applies outside, which
    keeps two hops over the program's edge per step (row values in, row gradients out, each
    a scatter or a gather on the hot variables run op by op); here the hot variables are read
    and written where the math runs, and the caller is left with the cold rows (TFRA's, looked
    up before, their gradients chained back and applied after).

    Horovod's collectives have no XLA lowering on CPU, so what crosses workers leaves the
    program: with several workers (``apply_dense`` false) the dense gradients come out for the
    all-reduce and the dense optimizer's apply after it, and the hot rows do what ``HOT_STEPS``
    says. Inside a ``model.hot_sync_every`` window nothing crosses, so there the hot rows' whole
    step (accumulate, apply) stays in the program."""

    def __init__(self, dense: DenseStep, dense_opt, hot: Sequence[HotFeature], apply_dense: bool = True):
        self.dense = dense
        self.dense_opt = dense_opt
        self.apply_dense = bool(apply_dense)
        self.variables = [dense.model.dense_variables[n] for n in dense.names]
        self.hot = list(hot)
        self.hot_features = [h.index for h in self.hot]
        self._compiled = tf.function(self._train, jit_compile=True, reduce_retracing=True, autograph=False)

    def run(self, rows: Sequence[tf.Tensor], slots: Sequence[tf.Tensor], sources: Sequence[tf.Tensor],
            counters: Sequence[tf.Tensor], sparse: SparseState, batch: dict, hot_step: str = "apply"
            ) -> Tuple[tf.Tensor, List[tf.Tensor], List[tf.Tensor], List[Tuple[tf.Tensor, tf.Tensor]]]:
        """Train on ``batch``: ``rows`` are the padded rows (zeros at the hot ones), ``slots`` and
        ``sources`` the hot features' (``padded_slots``; no sources: row i is unique id i),
        ``counters`` their tables' step counters read before the step (Adam's bias correction),
        ``hot_step`` one of ``HOT_STEPS``. Returns the loss, every row's gradient (for the caller
        to chain to the cold rows; a hot row's is zero there: its row is a constant), the dense
        gradients when the program did not apply them (else []), and with ``exchange`` each hot
        feature's (slot, gradient) per unique id (else [])."""
        positions = [(f.support_pos, f.query_pos, f.support_valid, f.query_valid) for f in sparse.features]
        samples = {w: {k: batch[w][k] for k in _SAMPLE_KEYS if k in batch[w]} for w in ("support", "query")}
        samples["task_mask"] = batch["task_mask"]
        return self._compiled(list(rows), list(slots), list(sources), list(counters), positions, samples, hot_step)

    def _train(self, rows, slots, sources, counters, positions, batch, hot_step):
        rows = list(rows)
        sources = list(sources) or [None] * len(slots)
        for h, slot, source in zip(self.hot, slots, sources):
            row_slot = slot if source is None else tf.gather(slot, source)
            gathered = tf.gather(h.values, tf.maximum(row_slot, 0))
            rows[h.index] = tf.where((row_slot >= 0)[:, None], gathered, rows[h.index])
        dense = self.dense
        sparse = SparseState([FeatureRows(r, *p, multi=m) for r, p, m in zip(rows, positions, dense.multi)])
        params = [v.read_value() for v in self.variables]
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(rows + params)
            loss = dense.objective(dict(zip(dense.names, params)), sparse, batch)
        grads = tape.gradient(loss, rows + params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads = [tf.convert_to_tensor(g) for g in grads]
        row_grads, dense_grads = grads[: len(rows)], grads[len(rows):]
        if self.apply_dense:
            self.dense_opt.apply_gradients(zip(dense_grads, self.variables))
            dense_grads = []
        exchanged = []
        for h, slot, source, iterations in zip(self.hot, slots, sources, counters):
            grad = row_grads[h.index]
            if source is not None:  # a task's copies of a row: their gradients summed, per unique id
                grad = tf.math.unsorted_segment_sum(grad, source, tf.shape(slot)[0])
            if hot_step == "exchange":
                exchanged.append((slot, grad))
                continue
            if hot_step in ("local", "close"):
                h.add_rows(slot, grad)
            if hot_step in ("apply", "local"):
                h.apply_rows(slot, grad, iterations)
        return loss, row_grads, dense_grads, exchanged


def hot_slices(slot: tf.Tensor, grad: tf.Tensor, num_hot: int) -> tf.IndexedSlices:
    """An ``exchange`` step's (slot, gradient) per unique id as the tape's gradient of the hot
    rows would be: the hot entries only (slot >= 0), indexed by slot."""
    hot = slot >= 0
    return tf.IndexedSlices(tf.boolean_mask(grad, hot), tf.cast(tf.boolean_mask(slot, hot), tf.int64),
                            tf.constant([num_hot, grad.shape[-1]], tf.int64))
