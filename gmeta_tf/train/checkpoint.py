"""Atomic checkpoints of dense weights, optimizer state and TFRA tables (with their slots).

A checkpoint is a directory ``ckpt-<step>`` holding ``dense.*`` (tf.train.Checkpoint), one
``tables/<name>.npz`` per table and slot table, and ``meta.json``. It counts as complete only
once ``meta.json`` exists, and ``meta.json`` is always written last; ``latest`` names the
newest complete one. How "written last" is made safe depends on the storage (``gmeta_tf.storage``):

* **local disk / PVC**: everything is written under ``ckpt-<step>.tmp-<pid>`` and renamed into
  place (atomic), then ``latest`` is replaced with ``os.replace``. A crash leaves only a
  ``.tmp-`` directory that nothing reads and the next save removes.
* **object store** (``gs://``, ``s3://``, ...): rename is a copy there, so files are uploaded
  straight into ``ckpt-<step>/`` and ``meta.json`` -- one object, visible all at once -- is the
  commit. A crash leaves a prefix without ``meta.json``, which ``latest``/``restore`` ignore
  and the next save removes; ``latest`` is a single small object written after the commit.

The table files (rows and optimizer slots of every TFRA table) are written and read by the
embedding package (``model.embeddings.export`` / ``restore``, format in
``embedding/table_files.py``), so training resumes exactly and can re-shard.

``meta.json`` also lists every other file of the checkpoint with its sha256 (``files``), so a
damaged checkpoint (a truncated table, a flipped byte, a half-copied directory) is named with
the file at fault and ``restore`` falls back to the newest intact one instead of dying in numpy
or TF with a bare trace. Files the caller attaches (``save(files=...)``: the config the
checkpoint was made with) are covered by the same commit and checksums.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Dict, List, Optional

import tensorflow as tf

from gmeta_tf import storage as store
from gmeta_tf.errors import CheckpointError
from gmeta_tf.model.dlrm import DLRM

LATEST = "latest"
# Names the checkpoint of the best validation step (train.eval_every); pruning never removes it.
BEST = "best"
META = "meta.json"


def _files_under(root: str, prefix: str = "") -> List[str]:
    """Every file below ``root``, as paths relative to it (local disk and object stores)."""
    out = []
    for name in store.listdir(root):
        path = store.join(root, name)
        if store.isdir(path):
            out += _files_under(path, f"{prefix}{name}/")
        else:
            out.append(prefix + name)
    return out


def _sha256(path: str) -> str:
    return hashlib.sha256(store.read_bytes(path)).hexdigest()


class CheckpointFiles:
    """The checkpoint directory as files: which checkpoints are complete, ``latest``, ``best``,
    a step's path and whether one is damaged. Needs no model, so ``gmeta export`` reads a run's
    checkpoints with it; ``CheckpointManager`` adds saving and restoring into a model."""

    def __init__(self, directory: str | Path, log=print):
        self.dir = str(directory)
        self.log = log

    def _complete(self, name: str) -> bool:
        return ".tmp-" not in name and store.exists(store.join(self.dir, name, "meta.json"))

    def all_checkpoints(self) -> List[str]:
        names = [n for n in store.listdir(self.dir) if n.startswith("ckpt-")]
        return [store.join(self.dir, n) for n in sorted(names) if self._complete(n)]

    def latest(self) -> Optional[str]:
        """The checkpoint ``latest`` names if it is complete, else the newest complete one
        (``latest`` is written after the commit, so a crash between the two loses nothing)."""
        pointer = store.join(self.dir, LATEST)
        if store.exists(pointer):
            name = store.read_text(pointer).strip()
            if name and self._complete(name):
                return store.join(self.dir, name)
        done = self.all_checkpoints()
        return done[-1] if done else None

    def best(self) -> Optional[Dict]:
        """``{"checkpoint": path, "step", "metric", "value"}`` of the best validation step, if
        one was recorded and its checkpoint is complete."""
        pointer = store.join(self.dir, BEST)
        if not store.exists(pointer):
            return None
        try:
            info = json.loads(store.read_text(pointer))
            name = info["checkpoint"]
        except (ValueError, KeyError, TypeError):
            raise CheckpointError(f"{pointer}: not a best-checkpoint record; delete it to fall back to 'latest'") from None
        if not self._complete(name):
            return None
        return {**info, "checkpoint": store.join(self.dir, name)}

    def mark_best(self, path: str, info: Dict) -> None:
        """Point ``best`` at ``path`` (a complete checkpoint); written after it, like ``latest``."""
        store.write_text(store.join(self.dir, BEST),
                         json.dumps({"checkpoint": store.basename(path), **info}, indent=1))

    def pick(self, which: str = "best") -> Optional[str]:
        """The checkpoint ``which`` names (``best``: the latest when the run recorded no best;
        ``latest``; or a step number, which must exist); None when there is none. Not checked for
        damage: the caller says what a damaged one means for it."""
        if which == "best":
            best = self.best()
            return best["checkpoint"] if best else self.latest()
        if which == "latest":
            return self.latest()
        return self.step_path(which)

    def step_path(self, which: str) -> str:
        """The complete checkpoint of step ``which`` (a number, as ``--checkpoint`` takes it)."""
        try:
            step = int(which)
        except ValueError:
            raise CheckpointError(f"--checkpoint must be best, latest or a step number, got {which!r}") from None
        path = store.join(self.dir, f"ckpt-{step:08d}")
        if not self._complete(store.basename(path)):
            have = ", ".join(str(int(store.basename(c)[5:])) for c in self.all_checkpoints()) or "none"
            raise CheckpointError(f"{self.dir}: no complete checkpoint for step {step} (have: {have})")
        return path

    def damage(self, path: str) -> Optional[str]:
        """What is wrong with checkpoint ``path`` (naming the file), or None when it is intact.
        Checkpoints written before checksums existed are checked for a readable meta.json only."""
        try:
            meta = json.loads(store.read_text(store.join(path, META)))
        except (ValueError, CheckpointError) as e:
            return f"{META} is unreadable ({str(e).splitlines()[0][:120]})"
        if not isinstance(meta, dict) or "step" not in meta:
            return f"{META} has no step"
        for rel, digest in sorted((meta.get("files") or {}).items()):
            f = store.join(path, rel)
            if not store.exists(f):
                return f"{rel} is missing"
            if _sha256(f) != digest:
                return f"{rel} does not match its checksum (damaged or changed after the save)"
        return None

    def checked(self, path: str) -> str:
        """``path``, complete and intact, or a ``CheckpointError`` naming what is wrong with it."""
        if not store.exists(store.join(path, META)):
            raise CheckpointError(f"checkpoint {path} is incomplete (no meta.json)")
        problem = self.damage(path)
        if problem is not None:
            raise CheckpointError(f"checkpoint {path} is damaged: {problem}")
        return path

    def newest_intact(self) -> Optional[str]:
        """The newest intact checkpoint (``latest`` first); None when there is none. A damaged
        one is skipped, saying so; if every one is damaged, a ``CheckpointError`` names each and
        the way out."""
        newest_first = list(dict.fromkeys(p for p in [self.latest(), *reversed(self.all_checkpoints())] if p))
        damaged = []
        for candidate in newest_first:
            problem = self.damage(candidate)
            if problem is None:
                if damaged:
                    self.log(f"falling back to the newest intact checkpoint {candidate}")
                return candidate
            damaged.append(f"{candidate}: {problem}")
            self.log(f"checkpoint {candidate} is damaged: {problem}; trying the previous one")
        if damaged:
            raise CheckpointError(
                "every checkpoint is damaged (" + "; ".join(damaged) + "). Start over with "
                "--no-resume (or a new --out), or restore the checkpoint directory from a copy")
        return None

    def intact(self, which: str = "best") -> Optional[str]:
        """The intact checkpoint ``best``, ``latest`` or a step names; None when there is none.

        ``best`` and ``latest`` never stop at a damaged checkpoint: a damaged best is reported and
        the newest intact checkpoint is used, as for ``latest``. A step that is damaged is an
        error naming the file."""
        if which not in ("best", "latest"):
            return self.checked(self.step_path(which))
        best = self.best() if which == "best" else None
        if best is not None:
            problem = self.damage(best["checkpoint"])
            if problem is None:
                return best["checkpoint"]
            self.log(f"best checkpoint {best['checkpoint']} is damaged: {problem}; "
                     f"using the newest intact checkpoint instead")
        return self.newest_intact()


class CheckpointManager(CheckpointFiles):
    def __init__(self, directory: str | Path, model: DLRM, dense_opt, emb_opt, keep: int = 3,
                 log=print):
        super().__init__(directory, log)
        self.restored: Optional[str] = None  # the checkpoint ``restore`` loaded, and its meta.json
        self.restored_meta: dict = {}
        self.model = model
        self.dense_opt = dense_opt
        self.emb_opt = emb_opt
        self.keep = keep
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # Optimizers must own their variables before a restore can fill them.
        dense_opt.build(list(model.dense_variables.values()))
        model.embeddings.build_slots(emb_opt)
        self._tf_ckpt = tf.train.Checkpoint(
            step=self.step,
            dense={k.replace("/", "."): v for k, v in model.dense_variables.items()},
            dense_optimizer=dense_opt,
            embedding_optimizer_iterations=model.embeddings.step_counters(),
        )

    def restore_which(self, which: str = "best") -> int:
        """Restore ``best``, ``latest`` or a step (``intact``); returns the step, 0 when there is none."""
        path = self.intact(which)
        return self._load(path) if path is not None else 0

    # -- save ---------------------------------------------------------------------------------
    def save(self, step: int, extra: Optional[dict] = None, files: Optional[Dict[str, str]] = None) -> str:
        local = store.is_local(self.dir)
        store.makedirs(self.dir)
        name = f"ckpt-{step:08d}"
        final = store.join(self.dir, name)
        for entry in store.listdir(self.dir):  # what earlier crashed saves left behind
            if entry.startswith("ckpt-") and (".tmp-" in entry or not self._complete(entry)):
                store.rmtree(store.join(self.dir, entry))
        target = store.join(self.dir, f"{name}.tmp-{os.getpid()}") if local else final
        if not local and store.exists(final):
            # Re-saving a step: un-commit it first so a crash mid-upload can't mix two saves.
            store.rmtree(store.join(final, "meta.json"))
            store.rmtree(final)
        try:
            store.makedirs(target)
            self.step.assign(step)
            self._tf_ckpt.write(store.join(target, "dense"))
            rows = self.model.embeddings.export(target)
            for rel, text in (files or {}).items():
                store.write_text(store.join(target, rel), text)
            sums = {rel: _sha256(store.join(target, rel)) for rel in _files_under(target)}
            meta = {"step": step, "time": time.time(), "rows": rows, **(extra or {}), "files": sums}
            store.write_text(store.join(target, "meta.json"), json.dumps(meta, indent=1))  # the commit
            if local:
                final_os = store.local_path(final)
                if os.path.exists(final_os):
                    store.rmtree(final)
                os.replace(store.local_path(target), final_os)
        except BaseException:
            store.rmtree(target)
            raise
        store.write_text(store.join(self.dir, LATEST), name + "\n")
        best = self.best()
        for old in self.all_checkpoints()[: -self.keep]:
            if best is None or old != best["checkpoint"]:
                store.rmtree(old)
        return final

    # -- restore ------------------------------------------------------------------------------

    def restore(self, path: Optional[str] = None) -> int:
        """Restore ``path`` (default: the newest intact checkpoint, ``newest_intact``). Returns its
        step; 0 if there is none."""
        path = self.newest_intact() if path is None else self.checked(str(path))
        return self._load(path) if path is not None else 0

    def _load(self, path: str) -> int:
        """Read checkpoint ``path`` into the model, optimizers and tables; already checked
        intact by ``damage`` (each file is hashed once per restore, not twice)."""
        meta = json.loads(store.read_text(store.join(path, META)))
        try:
            self._tf_ckpt.read(store.join(path, "dense")).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise CheckpointError(
                f"checkpoint {path} does not match this model's dense weights "
                f"(was it written with another model config?): {str(e).splitlines()[0]}") from None
        self.model.embeddings.restore(path)
        self.restored, self.restored_meta = path, meta
        return int(meta["step"])
