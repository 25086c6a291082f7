"""What a run records about itself besides weights, and the checks that keep a run consistent.

A run directory must survive a failed command: a resume that is refused must leave it exactly
as it was, and nothing may feed a model data it was not trained on. So the trainer records,
in every checkpoint, the config it was made with and the fingerprint of the prepared data's
schema (``gmeta_tf.data.task_format.schema_fingerprint``), and checks both before it trusts a
checkpoint with more data.
"""
from __future__ import annotations

import os
from typing import Dict

from gmeta_tf import storage
from gmeta_tf.config.schema import Config
from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import CheckpointError, DataError

CHECKPOINT_CONFIG = "config.yaml"


def absolute_data_path(cfg: Config) -> None:
    """A relative ``data.path`` means "from where I typed it"; stored as typed, ``gmeta eval``
    run from another directory would look elsewhere. Store it absolute."""
    if storage.is_local(cfg.data.path) and "://" not in cfg.data.path:
        cfg.data.path = os.path.abspath(cfg.data.path)


def data_record(path: str, schema: dict) -> Dict[str, object]:
    """Which data a checkpoint was trained on (or an ``eval.json`` scored)."""
    return {"path": path, "fingerprint": fmt.schema_fingerprint(schema)}


def checkpoint_files(cfg: Config) -> Dict[str, str]:
    """Files saved inside each checkpoint: the config it was made with."""
    from gmeta_tf.config.loader import config_text

    return {CHECKPOINT_CONFIG: config_text(cfg)}


def check_data(meta: dict, schema: dict, data_path: str, checkpoint: str, action: str) -> None:
    """Refuse to ``action`` (resume, evaluate, export) a checkpoint on data whose schema differs
    from the data it was trained on, naming the difference. Checkpoints from before data was
    recorded carry no fingerprint and pass."""
    trained = (meta.get("data") or {}).get("fingerprint")
    if not trained:
        return
    diff = fmt.fingerprint_difference(trained, fmt.schema_fingerprint(schema))
    if diff is not None:
        was = (meta.get("data") or {}).get("path", "?")
        raise DataError(
            f"cannot {action}: {data_path} does not match the data checkpoint {checkpoint} was "
            f"trained on ({was}): {diff}. Use data prepared the same way (same columns, order "
            f"and id types), or train a new run on it")


def check_steps(start: int, steps: int, checkpoint: str) -> None:
    """A checkpoint past ``train.steps`` has nothing left to train: say so instead of
    reporting a run "trained to" fewer steps than it already has."""
    if start > steps:
        raise CheckpointError(
            f"checkpoint {checkpoint} is at step {start}, past train.steps={steps}: nothing to "
            f"train. Pass --steps above {start} to continue, or --no-resume (or a new --out) to "
            f"start over")
