"""``gmeta eval``: adapt to each unseen task on its support set, exactly as trained; score its query.

The model comes from the run's latest checkpoint, rebuilt with local tables (evaluation never
needs the parameter servers and never writes a table: lookups are read-only and unseen ids
score with a zero vector). MAML runs adapt with the trained inner loop (``meta.adapt``,
``meta.inner_lr``, ``meta.inner_steps`` or ``eval.adapt_steps``); ERM runs are scored as
trained and, separately, fine-tuned on the support set (``*_finetune`` keys).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

import gmeta_tf  # noqa: F401
from gmeta_tf.config.schema import Config
from gmeta_tf.evaluation import metrics
from gmeta_tf.meta.inner_loop import InnerLoopSpec, adapt, initial_fast_weights
from gmeta_tf.metaio.reader import make_dataset
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.model.heads import predictions
from gmeta_tf.model.sparse_features import lookup_batch


def query_predictions(model: DLRM, cfg: Config, batch: dict, *, steps: int, lr: float,
                      adapt_set: str) -> tuple[tf.Tensor, tf.Tensor]:
    """Query predictions before and after ``steps`` inner steps (``[T, Q]`` each)."""
    spec = InnerLoopSpec.from_meta(model, replace(cfg.meta, adapt=adapt_set)).for_evaluation(steps, lr)
    sparse = lookup_batch(model.tables, batch, model.cat_names, model.multi_names,
                          trainable=False, per_task=spec.adapt_embeddings)
    fast = initial_fast_weights(model, sparse, spec.adapted, tf.shape(batch["task_mask"])[0])
    q = batch["query"]

    def score(f):
        s = model.tower.forward(f.dense, q["dense"], f.sparse.embed("query"))
        return predictions(model.kind, model.unscale(s))

    before = score(fast)
    if steps > 0:
        fast = adapt(model, fast, batch, spec)
    return before, score(fast)


def _collect(model: DLRM, cfg: Config, split: str, steps: int, lr: float):
    ds = make_dataset(cfg.data.path, split, cfg.data, training=False)
    fn = tf.function(lambda b: query_predictions(model, cfg, b, steps=steps, lr=lr,
                                                 adapt_set=cfg.meta.adapt))
    labels: List[np.ndarray] = []
    before: List[np.ndarray] = []
    after: List[np.ndarray] = []
    for batch in ds:
        b, a = (x.numpy() for x in fn(batch))
        tm = batch["task_mask"].numpy()
        mask = batch["query"]["mask"].numpy()
        y = batch["query"]["label"].numpy()
        for t in np.flatnonzero(tm > 0):
            keep = mask[t] > 0
            labels.append(y[t][keep])
            before.append(b[t][keep])
            after.append(a[t][keep])
            if cfg.eval.max_tasks and len(labels) >= cfg.eval.max_tasks:
                return labels, before, after
    return labels, before, after


def evaluate(model: DLRM, cfg: Config, algo: str, split: Optional[str] = None) -> Dict:
    split = split or cfg.eval.split
    kind = model.kind
    if algo == "erm":
        steps, lr = cfg.eval.finetune_steps, cfg.eval.finetune_lr
    else:
        steps, lr = cfg.eval.adapt_steps or cfg.meta.inner_steps, cfg.meta.inner_lr
    labels, before, after = _collect(model, cfg, split, steps, lr)
    result: Dict = {"algo": algo, "split": split, "tasks": len(labels),
                    "query_samples": int(sum(len(y) for y in labels))}
    no_adapt = metrics.compute(kind, labels, before)
    adapted = metrics.compute(kind, labels, after)
    if algo == "erm":
        result.update(no_adapt)
        result.update({f"{k}_no_adapt": v for k, v in no_adapt.items()})
        if steps > 0:
            result.update({f"{k}_finetune": v for k, v in adapted.items()})
    else:
        result.update(adapted)
        result.update({f"{k}_no_adapt": v for k, v in no_adapt.items()})
    result["adapt"] = {"steps": steps, "lr": lr, "params": cfg.meta.adapt}
    return result


def write_eval(run_dir: str | Path, result: Dict) -> str:
    from gmeta_tf import storage

    path = storage.join(str(run_dir), "eval.json")
    storage.write_text(path, json.dumps(result, indent=1))
    return path
