"""A trained run's checkpoint, read as files: which one, is it intact, its tables and weights.

``gmeta export`` needs no parameter server, no cluster and no TFRA table: a checkpoint is a
directory of plain files (``train/checkpoint.py``). Everything the export reads from it goes
through this module, and every read of a *table file* through ``read_table`` alone, so the
table format has one reader to follow when it moves.

A damaged checkpoint is refused, naming the file at fault: an export is a deliberate artifact,
so unlike a resume it does not fall back to an older checkpoint on its own (pick one with
``--checkpoint STEP``).
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import tensorflow as tf

from gmeta_tf import storage
from gmeta_tf.embedding import table_files
from gmeta_tf.errors import CheckpointError
from gmeta_tf.train.checkpoint import CheckpointFiles


def pick_checkpoint(run_dir: str, which: str = "best") -> str:
    """The intact checkpoint ``which`` names: ``best`` (the latest when the run recorded no
    best), ``latest`` or a step number, as ``gmeta eval --checkpoint`` takes it."""
    ckpt_dir = storage.join(run_dir, "checkpoints")
    files = CheckpointFiles(ckpt_dir)
    if not storage.exists(ckpt_dir) or not files.all_checkpoints():
        raise CheckpointError(f"{run_dir}: no complete checkpoint in {ckpt_dir}; train the run first")
    path = files.pick(which)
    problem = files.damage(path)
    if problem is not None:
        steps = ", ".join(str(int(storage.basename(c)[5:])) for c in files.all_checkpoints())
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}; export another one with "
                              f"--checkpoint STEP (have: {steps})")
    return path


def read_table(ckpt_dir: str, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """Table ``name``'s ids ``[n]`` int64 and rows ``[n, dim]`` float32, whole: a table the
    planner cut into column blocks is joined. The file format has one owner,
    ``embedding.table_files``; optimizer slot files (``<table>.m.npz`` ...) are never read."""
    tables_dir = storage.join(ckpt_dir, table_files.TABLES_DIR)
    try:
        keys, values = table_files.read_table(ckpt_dir, name)
    except (KeyError, ValueError, OSError) as e:
        raise CheckpointError(f"{tables_dir}: table {name!r} cannot be read: {str(e).splitlines()[0]}") from None
    if keys.ndim != 1 or values.ndim != 2 or len(keys) != len(values):
        raise CheckpointError(f"{tables_dir}: table {name!r} has ids of shape {keys.shape} and rows of "
                              f"shape {values.shape}; expected [n] and [n, dim]")
    return keys.astype(np.int64, copy=False), values.astype(np.float32, copy=False)


def _checkpoint_key(name: str) -> str:
    """The key of dense weight ``name`` (``top/0/w``) in the checkpoint: the manager stores
    ``dense[name.replace('/', '.')]``, and TF's object graph escapes ``.`` as ``..``."""
    return "dense/" + name.replace("/", ".").replace(".", "..") + "/.ATTRIBUTES/VARIABLE_VALUE"


def read_dense(ckpt_dir: str, names) -> Dict[str, np.ndarray]:
    """The dense weights ``names`` that the checkpoint holds (a missing one is simply absent:
    the caller decides which are required)."""
    prefix = storage.join(ckpt_dir, "dense")
    try:
        # the prefix itself: ``tf.train.load_checkpoint`` takes a path that ``gfile`` calls a
        # directory (every prefix of an object store, ``ram://`` included) for a checkpoint
        # directory and looks for its 'checkpoint' file
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise CheckpointError(f"{prefix}: the dense weights cannot be read: {str(e).splitlines()[0]}") from None
    have = reader.get_variable_to_shape_map()
    return {n: reader.get_tensor(_checkpoint_key(n)) for n in names if _checkpoint_key(n) in have}
