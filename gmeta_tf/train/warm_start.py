"""``gmeta train --warm-start SOURCE``: a new run that starts from another run's checkpoint.

Continuous training: yesterday's model, today's newly prepared data (new users, new ids). The
new run starts at step 0 with the source checkpoint's dense weights, dense optimizer state,
embedding rows and their optimizer slots; ids the source never saw get their usual initial rows
when first looked up, and new users are just new tasks. Its own checkpoints, validation and early
stopping are its own; ``train_summary.json`` and ``warm_start.json`` name the source.

What must match, checked before anything is written (a refused warm start leaves the new run
directory as it found it):

* the data's schema fingerprint (features, their order and id types; not sizes or statistics,
  which a later day changes): ``run_files.check_data``;
* the config keys that fix the shape of what is loaded (``SHAPE_KEYS``): the model's layers and
  embedding dim, the optimizers (their slots), and the learned inner-loop weights.

``SOURCE`` is a run directory (its best checkpoint, else its latest), ``RUN@best``,
``RUN@latest``, ``RUN@STEP``, or one checkpoint directory (``.../checkpoints/ckpt-00000600``).
A run that already has checkpoints of its own resumes from them and ignores ``--warm-start``:
restarting a warm-started job must not start it over.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Tuple

from gmeta_tf import storage
from gmeta_tf.config.schema import Config
from gmeta_tf.errors import CheckpointError
from gmeta_tf.train.checkpoint import META, CheckpointFiles
from gmeta_tf.train.run_files import CHECKPOINT_CONFIG, check_data

WARM_START_FILE = "warm_start.json"

# (config key, why it must match): what the restored checkpoint's variables are shaped by.
SHAPE_KEYS: List[Tuple[str, str]] = [
    ("model.embedding_dim", "embedding rows"),
    ("model.bottom_mlp", "dense weights"),
    ("model.top_mlp", "dense weights"),
    ("model.interaction", "dense weights"),
    ("train.optimizer", "optimizer slots"),
    ("meta.learn_ridge_lambda", "the learned ridge prior (a dense weight)"),
    ("meta.support_half_life", "the learned support half-life (a dense weight), when one side has none"),
]


@dataclass(frozen=True)
class WarmStartSource:
    given: str  # as the user wrote it
    checkpoint: str  # the checkpoint directory to load
    step: int
    meta: dict  # its meta.json


def resolve(given: str) -> WarmStartSource:
    """The checkpoint ``given`` names, intact, or a ``CheckpointError`` that says what is wrong."""
    run, _, which = given.partition("@")
    if storage.exists(storage.join(run, META)) and not which:  # one checkpoint directory
        path = run.rstrip("/")
    else:
        ckpts = storage.join(run, "checkpoints")
        if not storage.exists(ckpts):
            raise CheckpointError(f"--warm-start {given}: {run} is neither a run directory (no checkpoints/) "
                                  f"nor a checkpoint directory (no {META})")
        try:
            path = CheckpointFiles(ckpts, log=lambda m: None).pick(which or "best")
        except CheckpointError as e:
            raise CheckpointError(f"--warm-start {given}: {e}") from None
        if not path:
            raise CheckpointError(f"--warm-start {given}: {ckpts} holds no complete checkpoint")
    if not storage.exists(storage.join(path, META)):
        raise CheckpointError(f"--warm-start {given}: checkpoint {path} is incomplete (no {META})")
    problem = CheckpointFiles(path.rstrip("/").rsplit("/", 1)[0], log=lambda m: None).damage(path)
    if problem is not None:
        raise CheckpointError(f"--warm-start {given}: checkpoint {path} is damaged: {problem}")
    meta = json.loads(storage.read_text(storage.join(path, META)))
    return WarmStartSource(given, path, int(meta["step"]), meta)


def check_compatible(source: WarmStartSource, cfg: Config, schema: dict) -> None:
    """Refuse a source whose data schema or shape-fixing config differs, naming what differs."""
    from gmeta_tf.config.loader import load_config

    check_data(source.meta, schema, cfg.data.path, source.checkpoint, "warm-start from")
    config_file = storage.join(source.checkpoint, CHECKPOINT_CONFIG)
    if not storage.exists(config_file):
        return  # checkpoints from before configs were saved in them: the variable restore still checks shapes
    was = load_config(config_file)
    for key, what in SHAPE_KEYS:
        a, b = _get(was, key), _get(cfg, key)
        if key == "meta.support_half_life":  # its start value may change; having one may not
            a, b = a > 0, b > 0
        if a != b:
            raise CheckpointError(
                f"cannot warm-start from {source.checkpoint}: {key} is {_get(was, key)!r} there and "
                f"{_get(cfg, key)!r} here ({what} would not fit). Use the source run's value, or train "
                f"from scratch")


def record(source: WarmStartSource) -> dict:
    """What ``warm_start.json`` and ``train_summary.json`` say about the source."""
    return {"from": source.given, "checkpoint": source.checkpoint, "step": source.step,
            "data": source.meta.get("data")}


def _get(cfg: Config, dotted: str):
    section, key = dotted.split(".")
    return getattr(getattr(cfg, section), key)
