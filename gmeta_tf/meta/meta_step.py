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
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from gmeta_tf.config.schema import MetaConfig
from gmeta_tf.meta.dense_step import (
    DenseStep,
    HotFeature,
    ProgramStep,
    erm_objective,
    hot_slices,
    jit_enabled,
    maml_objective,
    padded_rows,
    padded_slots,
)
from gmeta_tf.meta.flat_call import FlatCall
from gmeta_tf.meta.inner_loop import InnerLoopSpec
from gmeta_tf.model.dlrm import DLRM


def maml_loss(model: DLRM, meta: MetaConfig, batch: dict) -> tf.Tensor:
    """Mean query loss after adapting on the support set (recorded by an enclosing tape)."""
    spec = InnerLoopSpec.from_meta(model, meta)
    sparse = model.embeddings.lookup(batch, trainable=True, per_task=spec.adapt_embeddings)
    return maml_objective(model, spec, model.dense_variables, sparse, batch)


def erm_loss(model: DLRM, batch: dict) -> tf.Tensor:
    """Plain mini-batch loss over every support and query sample of the batch."""
    sparse = model.embeddings.lookup(batch, trainable=True, per_task=False)
    return erm_objective(model, model.dense_variables, sparse, batch)


def loss_fn(model: DLRM, meta: MetaConfig):
    if meta.algo == "erm":
        return lambda batch: erm_loss(model, batch)
    return lambda batch: maml_loss(model, meta, batch)


class TrainStep:
    """Builds the compiled step. ``gradients`` is exposed (uncompiled) for the tests."""

    def __init__(self, model: DLRM, meta: MetaConfig, dense_opt, emb_opt, sync):
        self.model = model
        # Every table, its hot tier (worker-local hot rows, trained in the same step) and the
        # cold-row prefetch: gmeta_tf/embedding/collection.py.
        self.embeddings = model.embeddings
        self.meta = meta
        self.dense_opt = dense_opt
        self.emb_opt = emb_opt
        self.sync = sync
        self.dense_vars: List[tf.Variable] = list(model.dense_variables.values())
        # This rank's vote to stop after the step (train/preemption.py): it rides in the dense
        # gradients' all-reduce, so every rank reads the same verdict in the step's ``stop``.
        self.stop_vote = tf.Variable(0.0, trainable=False, dtype=tf.float32, name="gmeta_stop_vote")
        self._loss = loss_fn(model, meta)
        # meta.jit_compile: the dense math between the lookups and the applies as one XLA program.
        self._dense_step = DenseStep(model, meta) if jit_enabled(meta) else None
        # Create every optimizer slot now, outside the compiled step: a fresh run and a run
        # restored from a checkpoint then hold the same optimizer state in the same layout
        # (TFRA's optimizer builds its slot tables differently when created while tracing).
        dense_opt.build(self.dense_vars)
        model.embeddings.build_slots(emb_opt)  # and the hot tier's prefetch, which reads them
        self.rows = model.embeddings.trainable()
        self.shadows, self.hot_vars, self.cold_vars = self.rows.shadows, self.rows.hot, self.rows.cold
        # meta.hot_in_program: the hot rows and both optimizers' applies inside the XLA program too.
        self._program = self._hot_program(meta, sync) if meta.hot_in_program else None
        # model.hot_sync_every > 1 (embedding/hot/stale.py): a step either closes the hot rows'
        # window (exchanges) or trains them locally; two traces, picked by the step number.
        hot = model.embeddings.hot
        self.hot_sync_every = hot.sync_every if hot is not None else 1
        self._calls = 0  # steps taken through ``step`` (the schedule when no step number is given)
        self.prefetching = bool(self.cold_vars)
        # A name unique to this process: with PS tables the step's graph is partitioned and its
        # PS parts are registered on the parameter servers under names derived from this one,
        # so the functions different workers register on a shared PS never share a name (and a
        # PS log names the worker). The PS crashes we saw had another cause, see
        # docs/startup.md.
        tag = f"r{sync.rank}_p{os.getpid()}"
        self._compiled = self._trace(tag, ahead=False, hot_sync=True)
        self._compiled_steps = self._trace_steps(tag, ahead=False)
        if self.prefetching:
            self._compiled_ahead = self._trace(tag, ahead=True, hot_sync=True)
            self._compiled_steps_ahead = self._trace_steps(tag, ahead=True)

            def prime(batch):
                self.embeddings.write_behind()
                self.embeddings.keep_ahead(self.embeddings.read_ahead(batch))

            prime.__name__ = f"gmeta_prefetch_prime_{tag}"
            self._prime = FlatCall(tf.function(prime, reduce_retracing=True, autograph=False))
        if self.hot_sync_every > 1:
            self._compiled_local = self._trace(tag, ahead=self.prefetching, hot_sync=False)
        self._primed = False

    def _trace(self, tag: str, ahead: bool, hot_sync: bool):
        """The compiled step; ``ahead``: the one that also reads the next batch's cold rows;
        ``hot_sync``: whether it closes the hot rows' window."""
        def step(batch):
            return self._step(batch, hot_sync)

        def step_ahead(batch, next_batch):
            return self._step_ahead(batch, next_batch, hot_sync)

        fn = step_ahead if ahead else step
        fn.__name__ = f"gmeta_train_step{'_ahead' if ahead else ''}{'' if hot_sync else '_local'}_{tag}"
        return FlatCall(tf.function(fn, reduce_retracing=True, autograph=False))

    def _trace_steps(self, tag: str, ahead: bool):
        """train.steps_per_call: a Python loop, unrolled while tracing (no autograph, no
        tf.while_loop), so each step in it is the single step's graph, TFRA lookups and the
        prefetch's buffers included. One trace per call length. Every step of it closes the hot
        window: the config refuses ``steps_per_call`` > 1 with ``hot_sync_every`` > 1."""
        def steps(batches):
            return _stacked([self._step(b, True) for b in batches])

        def steps_ahead(batches, next_batch):
            # Step i reads step i+1's cold rows, the last one the next call's first batch's.
            return _stacked([self._step_ahead(b, nxt, True) for b, nxt in zip(batches, [*batches[1:], next_batch])])

        fn = steps_ahead if ahead else steps
        fn.__name__ = f"gmeta_train_steps{'_ahead' if ahead else ''}_{tag}"
        return FlatCall(tf.function(fn, reduce_retracing=True, autograph=False))

    def _hot_program(self, meta: MetaConfig, sync) -> ProgramStep:
        """The ``ProgramStep`` over this model's hot tables (none without a hot tier: then only the
        dense optimizer joins the program). ``MetaConfig`` already requires ``meta.jit_compile: true``.
        With several workers the dense gradients leave the program for the all-reduce."""
        hot = self.embeddings.hot
        feats = []
        if hot is not None:
            for i, table in enumerate(self.embeddings.tables):
                if any(table is t for t in hot.tables):
                    add = None if hot.window is None else (lambda slot, g, t=table: hot.window.add_rows(t.name, slot, g))
                    feats.append(HotFeature(i, table.values, lambda slot, g, it, t=table: hot.apply_rows(t, slot, g, it),
                                            add))
        return ProgramStep(self._dense_step, self.dense_opt, feats, apply_dense=sync.size == 1)

    def _hot_step(self, hot_sync: bool) -> str:
        """What the program does with the hot rows this step (``dense_step.HOT_STEPS``)."""
        hot = self.embeddings.hot
        if hot is not None and hot.window is not None:
            return "close" if hot_sync else "local"
        if hot is not None and hot.grad_sync.size > 1:
            return "exchange"
        return "apply"

    def hot_sync_due(self, step: int) -> bool:
        """Whether step ``step`` (1-based) closes the hot window: every ``hot_sync_every``-th
        step, from the step number alone, so every rank exchanges at the same steps."""
        return step % self.hot_sync_every == 0

    def step(self, batch: dict, next_batch: Optional[dict] = None, step: Optional[int] = None) -> Dict[str, tf.Tensor]:
        """Train on ``batch``. With prefetching tables, pass the batch the next call will train
        on as ``next_batch``: its cold rows are read during this step (without it, the next
        call reads them first, off the overlap). ``step``: the global step number (1-based; the
        hot window's schedule), by default the count of calls."""
        self._calls += 1
        sync = self.hot_sync_due(step if step is not None else self._calls)
        if not self.prefetching:
            out = (self._compiled if sync else self._compiled_local)(batch)
        else:
            compiled = self._compiled_ahead if sync else self._compiled_local
            if not self._primed:
                self._prime(batch)
            try:
                out = compiled(batch, next_batch if next_batch is not None else batch)
            except Exception:
                self._primed = False  # a failed step may leave the read-ahead half stored
                raise
            self._primed = next_batch is not None
        if self.embeddings.hot is not None:
            self.embeddings.hot.window_open = not sync
        return out

    def steps(self, batches: Sequence[dict], next_batch: Optional[dict] = None,
              first_step: Optional[int] = None) -> Dict[str, tf.Tensor]:
        """Train on ``batches`` in order in one compiled call (``train.steps_per_call``): the
        same as ``step`` on each batch in turn, without a return to Python between them. Returns
        ``loss`` and ``stop`` per step, ``[len(batches)]``. ``stop`` reads the vote set before
        the call (``vote_stop``), so it is the same for every step of a call. ``next_batch``:
        as in ``step``, the batch the next call starts with. One batch is ``step`` itself."""
        batches = list(batches)
        if not batches:
            raise ValueError("TrainStep.steps needs at least one batch")
        if len(batches) == 1:
            return {k: v[None] for k, v in self.step(batches[0], next_batch, step=first_step).items()}
        self._calls += len(batches)
        if not self.prefetching:
            return self._compiled_steps(batches)
        if not self._primed:
            self._prime(batches[0])
        try:
            out = self._compiled_steps_ahead(batches, next_batch if next_batch is not None else batches[-1])
        except Exception:
            self._primed = False
            raise
        self._primed = next_batch is not None
        return out

    def gradients(self, batch: dict) -> Tuple[tf.Tensor, List[tf.Tensor], List[tf.Tensor]]:
        loss, dense_grads, emb_grads, _, _ = self._gradients(batch)
        return loss, dense_grads, emb_grads

    def _gradients(self, batch: dict):
        if self._dense_step is not None:
            return self._compiled_gradients(batch)
        with tf.GradientTape() as tape:
            loss = self._loss(batch)
        grads = tape.gradient(loss, self.dense_vars + self.shadows + self.hot_vars + self.cold_vars,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        n, m = len(self.dense_vars), len(self.dense_vars) + len(self.shadows)
        h = m + len(self.hot_vars)
        return loss, grads[:n], grads[n:m], grads[m:h], grads[h:]

    def _compiled_gradients(self, batch: dict):
        """``_gradients`` with the dense math in XLA (``dense_step``): the tape records only the
        lookups, and the compiled row gradients are chained back through them."""
        dense = self._dense_step
        with tf.GradientTape() as tape:
            sparse = self.embeddings.lookup(batch, trainable=True,
                                            per_task=dense.spec.adapt_embeddings and not dense.erm)
            rows = padded_rows(sparse)
        loss, row_grads, dense_grads = dense.run(rows, sparse, batch)
        grads = tape.gradient(rows, self.shadows + self.hot_vars + self.cold_vars, output_gradients=row_grads,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        m, h = len(self.shadows), len(self.shadows) + len(self.hot_vars)
        return loss, dense_grads, grads[:m], grads[m:h], grads[h:]

    def vote_stop(self, stop: bool) -> None:
        """Ask (or stop asking) every rank to stop after the next step; see ``_apply``."""
        if bool(self.stop_vote.numpy()) != stop:
            self.stop_vote.assign(float(stop))

    def _apply(self, batch: dict, hot_sync: bool = True):
        if self._program is not None:
            return self._apply_in_program(batch, hot_sync)
        loss, dense_grads, emb_grads, hot_grads, cold_grads = self._gradients(batch)
        stop = self._apply_dense(dense_grads)
        done = self.embeddings.apply(self.rows, emb_grads, hot_grads, cold_grads, hot_sync=hot_sync)
        return {"loss": loss, "stop": stop}, done

    def _apply_dense(self, dense_grads: List[tf.Tensor]) -> tf.Tensor:
        """All-reduce the dense gradients with this rank's stop vote riding along, apply the mean;
        returns whether any rank voted to stop (the same on every rank)."""
        *dense_grads, votes = self.sync.allreduce_dense(dense_grads, exact=[self.stop_vote.read_value()])
        self.dense_opt.apply_gradients(zip(dense_grads, self.dense_vars))
        return votes > 0.0

    def _apply_in_program(self, batch: dict, hot_sync: bool):
        """``_apply`` with ``meta.hot_in_program``: the lookup leaves the hot rows to the program
        (``hot_apart``), which trains them (``_hot_step`` says how far) and, in one process, the
        dense weights; what crosses workers (the dense gradients and the stop vote, the hot rows'
        exchange) and TFRA's shadows and read-ahead cold rows, with their chained gradients, are
        applied here, after it."""
        program, dense = self._program, self._dense_step
        with tf.GradientTape() as tape:
            sparse = self.embeddings.lookup(batch, trainable=True, hot_apart=True,
                                            per_task=dense.spec.adapt_embeddings and not dense.erm)
            rows = padded_rows(sparse)
        slots, sources = padded_slots(sparse, program.hot_features)
        hot = self.embeddings.hot
        counters = [] if hot is None else [
            self.embeddings.optimizers.for_shadow(self.embeddings.tables[i].base.shadow).iterations.read_value()
            for i in program.hot_features]
        hot_step = self._hot_step(hot_sync)
        loss, row_grads, dense_grads, exchanged = program.run(rows, slots, sources, counters, sparse, batch, hot_step)
        # one process: the program applied the dense weights, and the vote is this rank's own
        stop = self.stop_vote.read_value() > 0.0 if program.apply_dense else self._apply_dense(dense_grads)
        hot_grads = [hot_slices(slot, g, self.embeddings.tables[i].num_hot)
                     for i, (slot, g) in zip(program.hot_features, exchanged)]
        outside = self.shadows + self.cold_vars
        grads = tape.gradient(rows, outside, output_gradients=row_grads,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO) if outside else []
        m = len(self.shadows)
        done = self.embeddings.apply(self.rows, grads[:m], hot_grads, grads[m:], hot_sync=hot_sync,
                                     hot_applied=hot_step != "exchange")
        return {"loss": loss, "stop": stop}, done

    def _step(self, batch: dict, hot_sync: bool = True) -> Dict[str, tf.Tensor]:
        """``loss``, and ``stop``: whether any rank voted to stop after this step (the mean of
        the votes over ranks is above 0), the same on every rank."""
        out, _ = self._apply(batch, hot_sync)
        return out

    def _step_ahead(self, batch: dict, next_batch: dict, hot_sync: bool = True) -> Dict[str, tf.Tensor]:
        """The step with prefetching tables: last step's cold writes, then the next batch's cold
        reads, go to the PS first; nothing of this batch's compute waits on them, so they run
        alongside it. The buffers are refilled (and patched with this step's updates) last."""
        self.embeddings.write_behind()
        ahead = self.embeddings.read_ahead(next_batch)
        out, done = self._apply(batch, hot_sync)
        self.embeddings.keep_ahead(ahead, done)
        return out


def _stacked(outs: List[Dict[str, tf.Tensor]]) -> Dict[str, tf.Tensor]:
    """The per-step outputs of an unrolled call as one tensor per key, in step order."""
    return {k: tf.stack([o[k] for o in outs]) for k in outs[0]}
