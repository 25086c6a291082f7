"""``gmeta eval``: adapt to each unseen task on its support set, exactly as trained; score its query.

The model comes from the run's latest checkpoint, rebuilt with local tables (evaluation never
needs the parameter servers and never writes a table: lookups are read-only and unseen ids
score with a zero vector). MAML runs adapt with the trained inner loop (``meta.adapt``,
``meta.inner_lr``, ``meta.inner_steps`` or ``eval.adapt_steps``); ERM runs are scored as
trained and, separately, fine-tuned on the support set (``*_finetune`` keys).

Next to the model, the same users' query sets are scored by simple baselines fitted on the
training split and the user's support set (``baselines``, see ``baselines.py``), and every scorer
gets a ranking view per user (``p_at_5``, ``ndcg_at_5``, see ``ranking.py``).
"""
from __future__ import annotations

import copy
import json
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from gmeta_tf.config.schema import Config
from gmeta_tf.embedding.lookup import lookup_batch
from gmeta_tf.evaluation import baselines, metrics, per_task, ranking
from gmeta_tf.evaluation.baselines import TaskItems
from gmeta_tf.evaluation.per_task import TaskScores
from gmeta_tf.meta import neighbourhood
from gmeta_tf.meta.inner_loop import InnerLoopSpec, adapt, initial_fast_weights
from gmeta_tf.metaio.reader import load_schema, make_dataset
from gmeta_tf.model.adaptable import AdaptableModel
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.model.heads import predictions


def query_predictions(model: AdaptableModel, cfg: Config, batch: dict, *, steps: int, lr: float,
                      adapt_set: str) -> tuple[tf.Tensor, tf.Tensor]:
    """Query predictions before and after ``steps`` inner steps (``[T, Q]`` each)."""
    spec = InnerLoopSpec.from_meta(model, replace(cfg.meta, adapt=adapt_set)).for_evaluation(steps, lr)
    # Read-only rows through what every AdaptableModel has (the trainer's DLRM and the export's
    # frozen model alike): ``Embeddings.lookup`` does the same for a DLRM.
    sparse = lookup_batch(model.tables, batch, model.cat_names, model.multi_names,
                          trainable=False, per_task=spec.adapt_embeddings)
    fast = initial_fast_weights(model, sparse, spec.adapted, tf.shape(batch["task_mask"])[0])
    q = batch["query"]
    s = model.tower.forward(fast.dense, q["dense"], fast.sparse.embed("query"))
    before = predictions(model.kind, model.unscale(s))
    if steps > 0:
        fast = adapt(model, fast, batch, spec)
    else:  # not adapted: nothing of the support reaches the query, the neighbourhood term neither
        return before, before
    # After adapting, as trained: the head's scores plus the neighbourhood term (when the model has one).
    return before, predictions(model.kind, model.unscale(neighbourhood.adapted_scores(model, fast.dense, batch, fast.sparse)))


def _batch_items(batch: dict, item: Optional[str]) -> Dict[str, np.ndarray]:
    """The numpy arrays ``_task_items`` slices (converted once per batch, not once per task)."""
    out = {}
    for which in ("support", "query"):
        mask = batch[which]["mask"].numpy()
        out[f"{which}_mask"] = mask > 0
        ids = batch[which].get("raw_cat", batch[which]["cat"])  # real ids, even with data.min_id_count
        out[f"{which}_items"] = ids[item].numpy() if item else np.full(mask.shape, -1, np.int64)
    out["support_labels"] = batch["support"]["label"].numpy().astype(np.float64)
    return out


def _task_items(arrays: Dict[str, np.ndarray], t: int) -> TaskItems:
    """Task ``t``'s support (items, labels) and query items, masked exactly like its predictions."""
    sup, qry = arrays["support_mask"][t], arrays["query_mask"][t]
    return TaskItems(arrays["support_items"][t][sup], arrays["support_labels"][t][sup], arrays["query_items"][t][qry])


def adaptation(cfg: Config, algo: str) -> tuple[int, float]:
    """``(steps, lr)`` an unseen task adapts with: ERM fine-tunes (``eval.finetune_*``), meta
    runs take the trained inner loop (``eval.adapt_steps`` or ``meta.inner_steps``)."""
    if algo == "erm":
        return cfg.eval.finetune_steps, cfg.eval.finetune_lr
    return cfg.eval.adapt_steps or cfg.meta.inner_steps, cfg.meta.inner_lr


def query_scores(model: DLRM, cfg: Config, split: Optional[str] = None) -> Dict[str, list]:
    """Per task of ``split``, in reading order: ``task_ids``, query ``labels`` and the scores
    ``evaluate`` computes its metrics from, ``before`` and ``after`` adaptation (one array per
    task, padding removed). What an export's parity with ``gmeta eval`` is checked against."""
    steps, lr = adaptation(cfg, cfg.meta.algo)
    task_ids: List[str] = []
    labels, before, after = _collect(model, cfg, split or cfg.eval.split, steps, lr, task_ids=task_ids)
    return {"task_ids": task_ids, "labels": labels, "before": before, "after": after}


def _prediction_fn(model: AdaptableModel, cfg: Config, steps: int, lr: float):
    """The compiled ``query_predictions`` for this model and adaptation, traced once and reused.

    Validation calls ``evaluate`` every ``train.eval_every`` steps, and a fresh ``tf.function``
    per call retraced the whole adapt-and-score graph each time, which cost several times the
    pass itself (MovieLens' 61 valid users: ~0.5 s to trace, 0.1 s to score). The key holds
    everything the graph bakes in: the adaptation, the meta config and which dense variables
    exist (by identity: a variable replaced on the model is a new graph). The function keeps a
    copy of the config, so a later change to ``cfg`` cannot leak into a retrace for a new shape,
    and only a weak reference to the model, so the cache (keyed weakly by the model, never an
    attribute a ``tf.Module`` would track and export) goes with it.
    """
    key = (steps, lr, repr(cfg.meta), tuple((n, id(v)) for n, v in model.dense_variables.items()))
    try:
        cache = _PREDICTION_FNS.setdefault(model, {})
    except TypeError:  # a model that cannot be weakly referenced: trace per call
        cache = {}
    if key not in cache:
        frozen, ref = copy.deepcopy(cfg), weakref.ref(model)
        cache[key] = tf.function(lambda b: query_predictions(ref(), frozen, b, steps=steps, lr=lr,
                                                             adapt_set=frozen.meta.adapt),
                                 autograph=False)
    return cache[key]


_PREDICTION_FNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _collect(model: DLRM, cfg: Config, split: str, steps: int, lr: float,
             items: Optional[List[TaskItems]] = None, item: Optional[str] = None,
             task_ids: Optional[List[str]] = None):
    """Per task: query labels and predictions before/after adaptation; with ``items``, also
    appends each task's ``TaskItems`` (feature ``item``) to it, for the baselines; with
    ``task_ids``, each task's id."""
    ds = make_dataset(cfg.data.path, split, cfg.data, training=False, raw_ids=items is not None)
    fn = _prediction_fn(model, cfg, steps, lr)
    labels: List[np.ndarray] = []
    before: List[np.ndarray] = []
    after: List[np.ndarray] = []
    for batch in ds:
        b, a = (x.numpy() for x in fn(batch))
        tm = batch["task_mask"].numpy()
        mask = batch["query"]["mask"].numpy()
        y = batch["query"]["label"].numpy()
        arrays = _batch_items(batch, item) if items is not None else None
        for t in np.flatnonzero(tm > 0):
            keep = mask[t] > 0
            labels.append(y[t][keep])
            before.append(b[t][keep])
            after.append(a[t][keep])
            if items is not None:
                items.append(_task_items(arrays, t))
            if task_ids is not None:
                task_ids.append(batch["task_id"][t].numpy().decode())
            if cfg.eval.max_tasks and len(labels) >= cfg.eval.max_tasks:
                return labels, before, after
    return labels, before, after


def evaluate(model: DLRM, cfg: Config, algo: str, split: Optional[str] = None, *,
             with_baselines: bool = True) -> Dict:
    """The model's query metrics on ``split``'s tasks; ``with_baselines`` adds ``baselines`` (it
    reads the train split's labels, which a repeated validation pass may want to skip)."""
    return _evaluate(model, cfg, algo, split, with_baselines)[0]


def evaluate_tasks(model: DLRM, cfg: Config, algo: str, split: Optional[str] = None, *,
                   with_baselines: bool = True) -> Tuple[Dict, TaskScores]:
    """``evaluate``'s result and every scorer's per-user metric parts (``per_task.TaskScores``:
    the model as reported, its other variant — ``<algo>_no_adapt`` or ``erm_finetune`` — and each
    baseline), for paired comparisons over users."""
    result, (task_ids, labels, scorers) = _evaluate(model, cfg, algo, split, with_baselines)
    threshold = cfg.eval.relevance_threshold
    tasks = TaskScores(model.kind, task_ids,
                       {"split": result["split"], "support": cfg.data.support, "query": cfg.data.query,
                        "relevance_threshold": threshold},
                       {"query_size": np.array([y.size for y in labels], np.float64),
                        "query_label_sum": np.array([float(np.sum(y)) for y in labels])})
    tasks.scorers = {name: per_task.task_parts(model.kind, labels, p, threshold) for name, (p, _) in scorers.items()}
    tasks.roles = {name: role for name, (_, role) in scorers.items()}
    return result, tasks


def _evaluate(model: DLRM, cfg: Config, algo: str, split: Optional[str], with_baselines: bool):
    """The result dict, and (task ids, query labels, scorer → (query predictions, role))."""
    split = split or cfg.eval.split
    kind = model.kind
    steps, lr = adaptation(cfg, algo)
    schema = load_schema(cfg.data.path)
    item = baselines.item_feature(schema, cfg.eval.item_feature, cfg.data.path)  # fails before the long pass
    items: List[TaskItems] = []
    task_ids: List[str] = []
    labels, before, after = _collect(model, cfg, split, steps, lr, items=items if with_baselines else None,
                                     item=item, task_ids=task_ids)
    result: Dict = {"algo": algo, "split": split, "tasks": len(labels),
                    "query_samples": int(sum(len(y) for y in labels))}
    threshold = cfg.eval.relevance_threshold
    no_adapt = _score(kind, labels, before, threshold)
    adapted = _score(kind, labels, after, threshold)
    if algo == "erm":
        result.update(no_adapt)
        result.update({f"{k}_no_adapt": v for k, v in no_adapt.items()})
        scorers = {algo: (before, "model")}
        if steps > 0:
            result.update({f"{k}_finetune": v for k, v in adapted.items()})
            scorers[f"{algo}_finetune"] = (after, "model")
    else:
        result.update(adapted)
        result.update({f"{k}_no_adapt": v for k, v in no_adapt.items()})
        scorers = {algo: (after, "model"), f"{algo}_no_adapt": (before, "variant")}
    result["adapt"] = {"steps": steps, "lr": lr, "params": cfg.meta.adapt}
    result["ranking"] = ranking.relevance_summary(kind, labels, threshold)
    if with_baselines:
        extra, preds = _baseline_results(cfg, schema, item, kind, labels, items)
        result.update(extra)
        scorers.update({name: (p, "baseline") for name, p in preds.items()})
    return result, (task_ids, labels, scorers)


def _score(kind: str, labels: List[np.ndarray], preds: List[np.ndarray], threshold: float) -> Dict:
    return {**metrics.compute(kind, labels, preds), **ranking.ranking_metrics(kind, labels, preds, threshold)}


def _baseline_results(cfg: Config, schema: dict, item: Optional[str], kind: str,
                      labels: List[np.ndarray], items: List[TaskItems]) -> Tuple[Dict, Dict[str, List[np.ndarray]]]:
    """``baselines`` (name → the model's metric keys) and ``baseline_setup`` for eval.json, and
    each baseline's query predictions."""
    stats = baselines.train_item_stats(cfg.data.path, schema, item)
    k_item, k_user = cfg.eval.baseline_shrinkage, cfg.eval.baseline_user_shrinkage
    preds = baselines.predict(kind, stats, items, k_item, k_user, with_items=item is not None)
    return {
        "baselines": {name: _score(kind, labels, p, cfg.eval.relevance_threshold) for name, p in preds.items()},
        "baseline_setup": {"item_feature": item, "shrinkage": k_item, "user_shrinkage": k_user,
                           "train_samples": stats.samples, "train_items": int(stats.ids.size),
                           "global_mean": stats.global_mean},
    }, preds


def write_eval(run_dir: str | Path, result: Dict, tasks: Optional[TaskScores] = None) -> str:
    """``eval.json`` and, with ``tasks``, its per-user parts ``eval_tasks.parquet`` (what
    ``gmeta eval --compare`` reads back)."""
    from gmeta_tf import storage

    if tasks is not None:
        storage.write_bytes(storage.join(str(run_dir), per_task.TASKS_FILE), tasks.to_parquet())
    path = storage.join(str(run_dir), "eval.json")
    storage.write_text(path, json.dumps(result, indent=1))
    return path
