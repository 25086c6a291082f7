"""``gmeta eval``: adapt to each unseen task on its support set, exactly as trained; score its query.

The model comes from the run's latest checkpoint, rebuilt with local tables (evaluation never
needs the parameter servers and never writes a table: lookups are read-only and unseen ids
score with a zero vector). MAML runs adapt with the trained inner loop (``meta.adapt``,
``meta.inner_lr``, ``meta.inner_steps`` or ``eval.adapt_steps``); ERM runs are scored as
trained and, separately, fine-tuned on the support set (``*_finetune`` keys).

Next to the model, the same users' query sets are scored by simple baselines fitted on the
training split and the user's support set (``baselines``, see ``baselines.py``), and every scorer
gets a ranking view per user (``p_at_5``, ``ndcg_at_5``, see ``ranking.py``).

Users stream: each batch's real tasks are cut out of the padded ``[T, Q]`` tensors by one
boolean mask into flat arrays with offsets (``segments.py``), batches gather into chunks of
``CHUNK_USERS`` users, and each chunk is scored for every scorer at once as it arrives
(``stream.StreamScores``), which keeps only per-user parts: memory and time per user do not
grow with the split.
"""
from __future__ import annotations

import copy
import itertools
import json
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from gmeta_tf.config.schema import Config
from gmeta_tf.embedding.lookup import lookup_batch
from gmeta_tf.evaluation import baselines, per_task, segments
from gmeta_tf.evaluation.baselines import FlatItems
from gmeta_tf.evaluation.per_task import TaskScores
from gmeta_tf.evaluation.stream import CHUNK_USERS, Progress, QueryChunk, score_chunks, task_scores
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


def _masked(values: np.ndarray, rows: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The kept entries of ``values``' ``rows``, row by row, flat (``keep`` is ``[rows, width]``)."""
    return values[rows][keep].reshape(-1)


def _batch_chunk(batch: dict, before: np.ndarray, after: np.ndarray, rows: np.ndarray,
                 item: Optional[str], with_items: bool) -> QueryChunk:
    """Tasks ``rows`` of one padded batch as a ``QueryChunk`` (vectorized: one mask, no loop per task)."""
    keep = batch["query"]["mask"].numpy()[rows] > 0
    offsets = segments.offsets_from_counts(keep.sum(axis=1))
    ids = np.char.decode(batch["task_id"].numpy()[rows].astype(bytes), "utf-8").astype(object)
    items = None
    if with_items:
        sets = {}
        for which in ("support", "query"):
            mask = batch[which]["mask"].numpy()[rows] > 0
            raw = batch[which].get("raw_cat", batch[which]["cat"])  # real ids, even with data.min_id_count
            sets[which] = (mask, raw[item].numpy() if item else np.full(mask.shape, -1, np.int64))
        sup_keep, sup_ids = sets["support"]
        qry_keep, qry_ids = sets["query"]
        items = FlatItems(segments.offsets_from_counts(sup_keep.sum(axis=1)),
                          _masked(sup_ids, rows, sup_keep).astype(np.int64),
                          _masked(batch["support"]["label"].numpy(), rows, sup_keep).astype(np.float64),
                          offsets, _masked(qry_ids, rows, qry_keep).astype(np.int64))
    return QueryChunk(ids, offsets, _masked(batch["query"]["label"].numpy(), rows, keep),
                      _masked(before, rows, keep), _masked(after, rows, keep), items)


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
    chunks = list(_chunks(model, cfg, split or cfg.eval.split, steps, lr))
    if not chunks:
        return {"task_ids": [], "labels": [], "before": [], "after": []}
    c = QueryChunk.concat(chunks)
    return {"task_ids": c.task_ids.tolist(), "labels": segments.split(c.labels, c.offsets),
            "before": segments.split(c.before, c.offsets), "after": segments.split(c.after, c.offsets)}


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


EVAL_BATCH_SAMPLES = 16384  # support + query slots per evaluation batch: 512 quickstart tasks


def eval_batch_tasks(cfg: Config, schema: dict, split: str, steps: int) -> int:
    """Tasks per evaluation batch: a multiple of training's ``data.tasks_per_batch`` holding about
    ``EVAL_BATCH_SAMPLES`` support + query slots, and no more batches of training's size than
    the split (or ``eval.max_tasks``) fills.

    Why not training's batch: every batch is one call of the adapt-and-score graph, whose cost
    is mostly per call at 32 tasks (843 calls for 27k users). Each task adapts on its own slice
    of the batch (the inner loop is vectorized over tasks, nothing mixes them), and with at most
    one inner step and a multiple of training's batch the predictions are the same, bit for bit
    (checked on the quickstart and MovieLens models, ``tests/test_eval_scale.py``). Other sizes
    round some float32 products differently (45 tasks instead of 32: 1 ulp in 3% of the adapted
    predictions), and so do several inner steps at any other size (MovieLens' fine-tuning: 1 ulp
    in 0.3%): there training's batch stays, so every number stays what it was. Rounding the split
    up to training's batch pads no more tasks than training's batches did.
    """
    base = max(1, cfg.data.tasks_per_batch)
    if steps > 1:
        return base
    per_task = max(1, cfg.data.support + cfg.data.query)
    batches = max(1, EVAL_BATCH_SAMPLES // (per_task * base))
    total = (((schema or {}).get("splits") or {}).get(split) or {}).get("tasks")
    if cfg.eval.max_tasks:
        total = min(int(total), cfg.eval.max_tasks) if total is not None else cfg.eval.max_tasks
    if total is not None:
        batches = min(batches, max(1, -(-int(total) // base)))
    return base * batches


def _chunks(model: DLRM, cfg: Config, split: str, steps: int, lr: float, item: Optional[str] = None,
            with_items: bool = False, chunk_users: int = CHUNK_USERS) -> Iterator[QueryChunk]:
    """The split's tasks in reading order (at most ``eval.max_tasks``), in chunks of about
    ``chunk_users`` users: query labels and predictions before/after adaptation; with
    ``with_items``, each task's samples of feature ``item`` for the baselines."""
    cap = cfg.eval.max_tasks
    schema = load_schema(cfg.data.path)
    data = replace(cfg.data, tasks_per_batch=eval_batch_tasks(cfg, schema, split, steps))
    ds = make_dataset(cfg.data.path, split, data, training=False, raw_ids=with_items, schema=schema)
    fn = _prediction_fn(model, cfg, steps, lr)
    pending: List[QueryChunk] = []
    waiting = seen = 0
    for batch in ds:
        rows = np.flatnonzero(batch["task_mask"].numpy() > 0)
        if cap:
            rows = rows[:cap - seen]
        b, a = (x.numpy() for x in fn(batch))
        pending.append(_batch_chunk(batch, b, a, rows, item, with_items))
        waiting += rows.size
        seen += rows.size
        if waiting >= chunk_users:
            yield QueryChunk.concat(pending)
            pending, waiting = [], 0
        if cap and seen >= cap:
            break
    if pending:
        yield QueryChunk.concat(pending)


def evaluate(model: DLRM, cfg: Config, algo: str, split: Optional[str] = None, *,
             with_baselines: bool = True, progress: Optional[Progress] = None) -> Dict:
    """The model's query metrics on ``split``'s tasks; ``with_baselines`` adds ``baselines`` (it
    reads the train split's labels, which a repeated validation pass may want to skip);
    ``progress`` is told how many users each scored chunk held (validation passes none: quiet)."""
    return _evaluate(model, cfg, algo, split, with_baselines, progress)[0]


def evaluate_tasks(model: DLRM, cfg: Config, algo: str, split: Optional[str] = None, *,
                   with_baselines: bool = True, progress: Optional[Progress] = None) -> Tuple[Dict, TaskScores]:
    """``evaluate``'s result and every scorer's per-user metric parts (``per_task.TaskScores``:
    the model as reported, its other variant — ``<algo>_no_adapt`` or ``erm_finetune`` — and each
    baseline), for paired comparisons over users."""
    result, stream, scorers = _evaluate(model, cfg, algo, split, with_baselines, progress)
    return result, task_scores(stream, scorers, result["split"], cfg)


def _evaluate(model: DLRM, cfg: Config, algo: str, split: Optional[str], with_baselines: bool,
              progress: Optional[Progress] = None):
    """The result dict, the streamed scores, and scorer → (its name in the stream, role)."""
    split = split or cfg.eval.split
    steps, lr = adaptation(cfg, algo)
    schema = load_schema(cfg.data.path)
    item = baselines.item_feature(schema, cfg.eval.item_feature, cfg.data.path)  # fails before the long pass
    chunks = _chunks(model, cfg, split, steps, lr, item=item, with_items=with_baselines)
    if not with_baselines:
        return score_chunks(chunks, cfg, algo, model.kind, split, steps, lr, item, None, progress)
    # Each chunk's baselines need the train split's statistics (a read of the whole train split:
    # ~2 s at 10M rows); they are computed in a thread while the model's graph is traced and
    # scores the first chunk (Arrow reads and numpy sorts release the GIL, and so does TensorFlow).
    with ThreadPoolExecutor(1, thread_name_prefix="train-item-stats") as pool:
        pending = pool.submit(baselines.train_item_stats, cfg.data.path, schema, item)
        first = next(chunks, None)
        stats = pending.result()
    chunks = itertools.chain([first] if first is not None else [], chunks)
    return score_chunks(chunks, cfg, algo, model.kind, split, steps, lr, item, stats, progress)


def write_eval(run_dir: str | Path, result: Dict, tasks: Optional[TaskScores] = None) -> str:
    """``eval.json`` and, with ``tasks``, its per-user parts ``eval_tasks.parquet`` (what
    ``gmeta eval --compare`` reads back)."""
    from gmeta_tf import storage

    if tasks is not None:
        storage.write_bytes(storage.join(str(run_dir), per_task.TASKS_FILE), tasks.to_parquet())
    path = storage.join(str(run_dir), "eval.json")
    storage.write_text(path, json.dumps(result, indent=1))
    return path
