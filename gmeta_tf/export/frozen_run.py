"""A finished run, read for scoring or export: its config, a checked checkpoint, the frozen model.

Why ``gmeta eval`` scores with the frozen model and not the trainer's: scoring only reads rows.
Rebuilt as the trainer's ``DLRM`` (``train.trained_run.load_trained``), each TFRA table was pre-sized
for every id of the data and given the optimizer's slot tables (Adam's m and v), which scoring
never reads: 1,172 MB resident once a 938k-row item table (the 100M-row data) was loaded, where
``FrozenModel`` (static tables, as ``gmeta export`` builds them) holds 662 MB and scores the same
(every number of ``eval.json`` equal on 269,507 users; ``tests/test_frozen_run.py``).

Both readers check alike: a directory that is no run is named, the data must be the data the
checkpoint was trained on (``check_data``). They differ in one thing, what a damaged checkpoint
means: ``gmeta eval`` falls back to the newest intact one, saying so (``CheckpointFiles.intact``),
as it always has; an export is a deliberate artifact and refuses it (``pick_checkpoint``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from gmeta_tf import storage
from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import Config
from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import CheckpointError
from gmeta_tf.export.checkpoint_reader import pick_checkpoint
from gmeta_tf.export.frozen_model import FrozenModel
from gmeta_tf.train.checkpoint import META, CheckpointFiles
from gmeta_tf.train.model_build import CONFIG_FILE
from gmeta_tf.train.run_files import check_data


@dataclass(frozen=True)
class PickedRun:
    """A run's config (with overrides), its data's schema and one checked checkpoint."""

    cfg: Config
    schema: dict
    checkpoint: str  # the checkpoint directory
    meta: dict  # its meta.json

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    def model(self) -> FrozenModel:
        return FrozenModel(self.cfg, self.schema, self.checkpoint)


def pick_run(run_dir: str, which: str = "best", overrides: Sequence[str] = (), *, action: str = "evaluate",
             strict: bool = False, log=print) -> PickedRun:
    """Checkpoint ``which`` (best | latest | a step) of ``run_dir``, checked against the data;
    ``strict``: a damaged one is refused (export), else the newest intact one stands in (eval)."""
    run_dir = str(run_dir)
    config_file = storage.join(run_dir, CONFIG_FILE)
    if not storage.exists(config_file):
        raise CheckpointError(f"{run_dir}: not a run directory (no {CONFIG_FILE}); run 'gmeta train --out {run_dir}' first")
    cfg = load_config(config_file, overrides)
    if strict:
        ckpt = pick_checkpoint(run_dir, which)
    else:
        ckpt_dir = storage.join(run_dir, "checkpoints")
        ckpt = CheckpointFiles(ckpt_dir, log=log).intact(which) if storage.exists(ckpt_dir) else None
        if ckpt is None:
            raise CheckpointError(f"{run_dir}: no complete checkpoint in {ckpt_dir}")
    meta = json.loads(storage.read_text(storage.join(ckpt, META)))
    schema = fmt.load_schema(cfg.data.path)
    check_data(meta, schema, cfg.data.path, ckpt, action)
    return PickedRun(cfg, schema, ckpt, meta)
