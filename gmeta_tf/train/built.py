"""What a run trains, restores and saves, built once per process (``build_tables_once``).

Its own module so that the trainer's phases and the step loop (``step_loop.py``, its after-step
handlers in ``after_step.py``) share one ``Built`` without importing ``trainer.py``, which imports
them.
"""
from __future__ import annotations

from dataclasses import dataclass

from gmeta_tf import storage
from gmeta_tf.config.schema import Config
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.checkpoint import CheckpointManager
from gmeta_tf.train.model_build import build_model
from gmeta_tf.train.runtime import Runtime


@dataclass
class Built:
    """What ``build_tables_once`` builds: everything a run trains, restores and saves."""

    model: DLRM
    dense_opt: object
    emb_opt: object
    step_fn: TrainStep
    ckpt: CheckpointManager

    def __iter__(self):  # model, dense_opt, emb_opt, step_fn, ckpt = build_tables_once(...)
        return iter((self.model, self.dense_opt, self.emb_opt, self.step_fn, self.ckpt))


def _build(cfg: Config, schema: dict, rt: Runtime, run_dir: str) -> Built:
    model = build_model(cfg, schema, rt)  # creates the embedding tables
    dense_opt, emb_opt = make_optimizers(cfg.train, rt.size)
    # The hot tier (hot.budget > 0), then every table's optimizer and slot tables, then the
    # prefetch that reads them: the order is Embeddings.assemble's.
    model.embeddings.assemble(cfg, emb_opt, rt.sync, log=rt.log)
    step_fn = TrainStep(model, cfg.meta, dense_opt, emb_opt, rt.sync)
    ckpt = CheckpointManager(storage.join(run_dir, "checkpoints"), model, dense_opt, emb_opt,
                             keep=cfg.train.keep_checkpoints)
    return Built(model, dense_opt, emb_opt, step_fn, ckpt)


def build_tables_once(cfg: Config, schema: dict, rt: Runtime, run_dir: str) -> Built:
    """Rank 0 creates the PS tables and their optimizer slot tables; the others then bind to them.

    Every table has a deterministic shared name (``embedding/naming.py``), so a rank that builds
    the model after rank 0 finds each resource on the PS and binds to it instead of creating it:
    the tables exist once, whatever the number of workers, and start-up costs two builds' time,
    not one per rank. The other ranks build at the same time; that is safe because the PS crash
    once blamed on concurrent creation was the eager-context race that
    ``worker.connect_rank0_first`` avoids (docs/startup.md). With local tables (no PS) there is
    nothing to share. In an elastic ring (``rt.start_gate``) rank 0 goes first through a gate file,
    not a barrier: a worker joining a running ring must do no collective before ``run_fn``
    (``elastic.py``), and it finds the tables there.
    """
    if rt.ps_tasks == 0:
        return _build(cfg, schema, rt, run_dir)
    if rt.start_gate is not None:
        def build() -> Built:
            out = _build(cfg, schema, rt, run_dir)
            if rt.rank == 0:
                out.model.embeddings.wait_until_created()
            return out
        return rt.start_gate.rank0_first(rt.rank, "tables-created", build)
    built = None
    if rt.rank == 0:
        built = _build(cfg, schema, rt, run_dir)
        built.model.embeddings.wait_until_created()
    rt.sync.barrier()
    if rt.rank != 0:
        built = _build(cfg, schema, rt, run_dir)
    return built
