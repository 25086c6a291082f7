"""A finished (or checkpointed) run, loaded back: for ``gmeta eval``, the demo, export and the
MovieLens example. Reading a run needs the model it was trained with and one of its
checkpoints, never the training loop, so it lives beside the trainer rather than inside it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from gmeta_tf import storage
from gmeta_tf.config.schema import Config
from gmeta_tf.errors import CheckpointError
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.metaio.reader import load_schema
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.checkpoint import META, CheckpointFiles, CheckpointManager
from gmeta_tf.train.model_build import CONFIG_FILE, build_model
from gmeta_tf.train.run_files import check_data
from gmeta_tf.train.runtime import Runtime


def load_trained(run_dir: str | Path, overrides=(), checkpoint: str = "best") -> tuple[Config, DLRM, CheckpointManager]:
    """Rebuild a run's model with local tables from its config and a checkpoint: ``best`` (the
    best validation step; the latest when the run did not validate), ``latest`` or a step."""
    from gmeta_tf.config.loader import load_config

    run_dir = str(run_dir)
    if not storage.exists(storage.join(run_dir, CONFIG_FILE)):
        raise CheckpointError(f"{run_dir}: not a run directory (no {CONFIG_FILE}); run 'gmeta train --out {run_dir}' first")
    cfg = load_config(storage.join(run_dir, CONFIG_FILE), overrides)
    schema = load_schema(cfg.data.path)
    # The data is checked before the model is built from it: a renamed or reordered feature
    # builds a model the checkpoint cannot fill, and the restore would blame the weights.
    picked = _picked_meta(storage.join(run_dir, "checkpoints"), checkpoint)
    if picked is not None:
        check_data(picked[1], schema, cfg.data.path, picked[0], "evaluate")
    model = build_model(cfg, schema, Runtime())
    dense_opt, emb_opt = make_optimizers(cfg.train)
    ckpt = CheckpointManager(storage.join(run_dir, "checkpoints"), model, dense_opt, emb_opt)
    if not ckpt.restore_which(checkpoint):
        raise CheckpointError(f"{run_dir}: no complete checkpoint in {storage.join(run_dir, 'checkpoints')}")
    check_data(ckpt.restored_meta, schema, cfg.data.path, ckpt.restored, "evaluate")
    return cfg, model, ckpt


def _picked_meta(ckpt_dir: str, which: str) -> Optional[tuple[str, dict]]:
    """(path, meta.json) of the checkpoint ``which`` names, or None when there is none or its
    meta cannot be read (the restore then says what is wrong)."""
    try:
        path = CheckpointFiles(ckpt_dir, log=lambda m: None).pick(which) if storage.exists(ckpt_dir) else None
        return (path, json.loads(storage.read_text(storage.join(path, META)))) if path else None
    except (CheckpointError, OSError, ValueError):
        return None


