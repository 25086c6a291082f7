"""Atomic checkpoints of dense weights, optimizer state and TFRA tables (with their slots).

A checkpoint is a directory ``ckpt-<step>`` that is complete or absent: it is written under
``ckpt-<step>.tmp-<pid>`` and renamed into place only after every file (and ``meta.json``,
last) is on disk; ``latest`` is then replaced atomically. A crash mid-write leaves a ``.tmp-``
directory that ``restore`` never looks at and the next save removes.

Tables are exported row by row (``de.Variable.export``) rather than through TF's saveables, so
the same code saves local tables and tables sharded over parameter servers (rank 0 pulls the
rows from every PS), and a restore can re-shard onto a different number of PS. The optimizer
slot tables (Adam's m and v) are saved next to their table, so training resumes exactly.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

import gmeta_tf  # noqa: F401
from gmeta_tf.errors import CheckpointError
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.model.tables import export_variable, import_variable

LATEST = "latest"


def _slot_key(table_name: str, slot_var) -> str:
    # Slot variables are named "<table var>/<shadow>/<slot>" (e.g. ".../m"); keep the slot part.
    return f"{table_name}.{slot_var.name.rsplit('/', 1)[-1]}"


class CheckpointManager:
    def __init__(self, directory: str | Path, model: DLRM, dense_opt, emb_opt, keep: int = 3):
        self.dir = Path(directory)
        self.model = model
        self.dense_opt = dense_opt
        self.emb_opt = emb_opt
        self.keep = keep
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # Optimizers must own their variables before a restore can fill them.
        dense_opt.build(list(model.dense_variables.values()))
        emb_opt.build(model.shadows_by_table())
        self._tf_ckpt = tf.train.Checkpoint(
            step=self.step,
            dense={k.replace("/", "."): v for k, v in model.dense_variables.items()},
            dense_optimizer=dense_opt,
            embedding_optimizer_iterations=emb_opt.iterations(),
        )

    # -- listing ------------------------------------------------------------------------------
    def latest(self) -> Optional[Path]:
        pointer = self.dir / LATEST
        if not pointer.is_file():
            return None
        path = self.dir / pointer.read_text().strip()
        return path if (path / "meta.json").is_file() else None

    def all_checkpoints(self) -> List[Path]:
        return sorted(p for p in self.dir.glob("ckpt-*") if ".tmp-" not in p.name and (p / "meta.json").is_file())

    # -- save ---------------------------------------------------------------------------------
    def tables_to_save(self) -> Dict[str, object]:
        out = {}
        for table in self.model.storage_tables():  # column-split tables: every block
            out[table.name] = table.variable
            for slot in table.slot_variables(self.emb_opt.for_shadow(table.shadow)):
                out[_slot_key(table.name, slot)] = slot
        return out

    def save(self, step: int, extra: Optional[dict] = None) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob("ckpt-*.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        name = f"ckpt-{step:08d}"
        final = self.dir / name
        tmp = self.dir / f"{name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            self.step.assign(step)
            self._tf_ckpt.write(str(tmp / "dense"))
            (tmp / "tables").mkdir()
            rows = {}
            for key, var in self.tables_to_save().items():
                keys, values = export_variable(var)
                np.savez(tmp / "tables" / f"{key}.npz", keys=keys, values=values)
                rows[key] = int(len(keys))
            meta = {"step": step, "time": time.time(), "rows": rows, **(extra or {})}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        pointer_tmp = self.dir / f"{LATEST}.tmp-{os.getpid()}"
        pointer_tmp.write_text(name + "\n")
        os.replace(pointer_tmp, self.dir / LATEST)
        for old in self.all_checkpoints()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    # -- restore ------------------------------------------------------------------------------
    def restore(self, path: Optional[Path] = None) -> int:
        """Restore ``path`` (default: the latest). Returns its step; 0 if there is none."""
        path = path or self.latest()
        if path is None:
            return 0
        meta_file = path / "meta.json"
        if not meta_file.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete (no meta.json)")
        meta = json.loads(meta_file.read_text())
        try:
            self._tf_ckpt.read(str(path / "dense")).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise CheckpointError(
                f"checkpoint {path} does not match this model's dense weights "
                f"(was it written with another model config?): {str(e).splitlines()[0]}") from None
        for key, var in self.tables_to_save().items():
            f = path / "tables" / f"{key}.npz"
            if not f.is_file():
                raise CheckpointError(f"checkpoint {path} has no table file {f.name}")
            data = np.load(f)
            var.clear()
            import_variable(var, data["keys"], data["values"])
        return int(meta["step"])
