"""The end of a run: ``train_summary.json`` (rank 0) and one file per rank under ``ranks/``
holding the digests the tests compare across ranks (equal dense digests: bit-identical replicas).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List

from gmeta_tf import storage
from gmeta_tf.config.schema import Config
from gmeta_tf.embedding.devices import ps_task_of
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.model_build import SUMMARY_FILE
from gmeta_tf.train.progress import Window
from gmeta_tf.train.restarts import Restart
from gmeta_tf.train.runtime import Runtime
from gmeta_tf.train.validation import BestTracker
from gmeta_tf.train.warm_start import WARM_START_FILE


@dataclass
class RunResult:
    """What the loop leaves for the summary."""

    start: int
    end: int
    last_step: int
    stopped: bool
    window: Window
    history: list = field(default_factory=list)
    writer: object = None
    restarts: List[Restart] = field(default_factory=list)
    ring: List[List[int]] = field(default_factory=list)  # elastic: [step, rank, size] at each (re-)entry
    joined: List[dict] = field(default_factory=list)  # elastic, rank 0: workers that joined the running ring


def write_summary(cfg: Config, rt: Runtime, run_dir: str, model: DLRM, tracker: BestTracker, run: RunResult) -> dict:
    """The run's summary (rank 0 writes ``train_summary.json``) and this rank's file under
    ``ranks/`` (digests the tests compare across ranks)."""
    rank_tps = run.window.rank_tasks_per_s
    summary = {
        "algo": cfg.meta.algo, "steps": cfg.train.steps, "start_step": run.start,
        "stopped_early": bool(run.stopped), "last_step": run.last_step,
        "best": tracker.summary(), "validation": tracker.history,
        "tasks_per_s": rank_tps, "ranks": rt.size, "ps": rt.ps_tasks, "history": run.history,
        "aggregate_tasks_per_s": rt.sync.allreduce_scalar(rank_tps if math.isfinite(rank_tps) else 0.0),
        "dense_digest": dense_digest(model),
        "restarts": [asdict(r) for r in run.restarts],
        "table_rows_per_ps": {t.name: t.shard_sizes() for t in model.storage_tables()} if rt.rank == 0 else {},
        # where each TFRA table's rows are, by PS task (the placement check reads this)
        "table_rows_by_ps_task": rows_by_ps_task(model) if rt.rank == 0 and rt.ps_tasks else {},
    }
    if cfg.cluster.elastic:
        # The ring as this rank saw it (its re-formings: the commit, the ring's size), and the workers
        # that joined it on a returned host (from the ranks' status records, rank 0 only).
        summary["elastic"] = {"ring": [{"step": step, "ranks": size} for step, _, size in run.ring],
                              "joined": run.joined}
    rank_file = {k: summary[k] for k in ("tasks_per_s", "dense_digest", "steps", "start_step",
                                         "last_step", "stopped_early")}
    if cfg.cluster.elastic:
        rank_file["ring"] = run.ring
    hot = model.embeddings.hot
    if hot is not None:  # after the last checkpoint's write-back: the PS must match every rank
        rank_file.update(hot_digest=hot.digest(), hot_rows=hot.hot_set.rows,
                         hot_ps_mismatches=hot.ps_mismatches())
    storage.makedirs(storage.join(run_dir, "ranks"))
    storage.write_text(storage.join(run_dir, "ranks", f"rank{rt.rank}.json"), json.dumps(rank_file, indent=1))
    if rt.rank == 0:
        warm = storage.join(run_dir, WARM_START_FILE)  # which checkpoint the run started from, if any
        summary["warm_start"] = json.loads(storage.read_text(warm)) if storage.exists(warm) else None
        storage.write_text(storage.join(run_dir, SUMMARY_FILE), json.dumps(summary, indent=1))
        if run.writer is not None:
            run.writer.flush()
    return summary


def rows_by_ps_task(model: DLRM) -> Dict[str, Dict[str, int]]:
    """``{table: {ps task: rows}}``: each shard's size, read on the PS that holds it."""
    return {table: {str(ps_task_of(device)): rows for device, rows in shards.items()}
            for table, shards in model.embeddings.rows_by_device().items()}


def dense_digest(model: DLRM) -> str:
    """sha256 of every dense weight's bytes: equal digests mean bit-identical replicas."""
    h = hashlib.sha256()
    for name, var in sorted(model.dense_variables.items()):
        h.update(name.encode())
        h.update(var.numpy().tobytes())
    return h.hexdigest()
