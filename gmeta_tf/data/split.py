"""Which tasks are kept, which split and shard each goes to, and each task's support/query.

Why a module of its own: these are the decisions that make the evaluation honest, and they are
easy to get subtly wrong, so they live in small pure functions over numpy arrays:

* tasks are assigned to train/valid/test **by task** (a test user never appears in train), from
  the sorted task ids and the seed, so the assignment does not depend on input row order; with
  ``folds`` (cross-validation) the shuffled tasks are cut into K folds and fold k is the test
  split (``fold_parts``), so the K preparations test every task exactly once;
* within a split, tasks are shuffled and dealt round-robin to shards, so every shard gets a
  similar number of tasks and rank ``r`` of ``n`` reads disjoint ones;
* ``split_by=time``: the **last** ``query`` samples are the query (we predict the future from
  the past) and the up-to-``max_support`` samples right before them are the support; older
  samples are truncated (counted). ``random`` does the same on a seeded shuffle.

All of it is vectorized: one lexsort over samples, then masks from per-row positions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError


def filter_tasks(sizes: np.ndarray, min_size: int, max_size: int) -> Tuple[np.ndarray, Dict[str, int]]:
    """Per-task sample counts → (kept mask, dropped counts by reason)."""
    small = sizes < min_size
    large = sizes > max_size
    return ~(small | large), {"too_small": int(small.sum()), "too_large": int(large.sum())}


@dataclass
class SplitLayout:
    """Tasks (codes) in output order: split-major, then shard, then the shuffled task order."""

    order: np.ndarray  # task codes
    # split → list of (shard index, start, end) ranges of ``order``
    shards: Dict[str, List[Tuple[int, int, int]]]
    counts: Dict[str, int]  # tasks per split


def fold_parts(shuffled: np.ndarray, folds: int, fold: int, n_valid: int) -> Dict[str, np.ndarray]:
    """Cross-validation fold ``fold`` of ``folds`` over the (already shuffled) tasks: the folds are
    consecutive chunks of equal size (±1); fold ``fold`` is test, the first ``n_valid`` tasks of the
    folds after it (fold + 1, fold + 2, ... cyclically) are valid, the rest train. While ``n_valid``
    fits in one fold, the valid sets of different folds are disjoint as well."""
    chunks = np.array_split(shuffled, folds)
    rest = np.concatenate([chunks[(fold + i) % folds] for i in range(1, folds)])
    return {"train": rest[n_valid:], "valid": rest[:n_valid], "test": chunks[fold]}


def assign_splits(
    task_codes: np.ndarray,
    task_names: np.ndarray,
    valid_frac: float,
    test_frac: float,
    shards: int,
    seed: int,
    dropped: Optional[Dict[str, int]] = None,
    folds: int = 0,
    fold: int = 0,
) -> SplitLayout:
    k = int(task_codes.size)
    if k == 0:
        why = ", ".join(f"{r}={c:,}" for r, c in (dropped or {}).items())
        raise DataError(f"no tasks left after filtering ({why or 'no rows'}); check --min-task-size / --max-task-size")
    # Sort by id first: the assignment is a function of the task ids and the seed only.
    by_name = task_codes[np.argsort(task_names[task_codes].astype(str), kind="stable")]
    rng = np.random.default_rng([seed, 0x5917])
    shuffled = by_name[rng.permutation(k)]
    if folds:
        test_frac = 1.0 / folds
        n_test = int(np.array_split(np.arange(k), folds)[fold].size)
    else:
        n_test = int(round(k * test_frac))
    n_valid = int(round(k * valid_frac))
    n_train = k - n_test - n_valid
    sizes = {"train": n_train, "valid": n_valid, "test": n_test}
    fracs = {"train": 1.0 - valid_frac - test_frac, "valid": valid_frac, "test": test_frac}
    for name in fmt.SPLITS:
        if fracs[name] <= 0:
            continue  # a split asked to be empty stays empty (no files)
        if sizes[name] == 0:
            raise DataError(
                f"split '{name}' would get no tasks: only {k:,} task(s) kept with "
                f"{name}_frac={fracs[name]:g}; use more data, a larger fraction or a smaller --min-task-size"
            )
        if sizes[name] < shards:
            raise DataError(
                f"split '{name}' has {sizes[name]:,} task(s), fewer than --shards {shards}; "
                f"use fewer shards or more data"
            )
    order, ranges = [], {}
    if folds:
        parts = fold_parts(shuffled, folds, fold, n_valid)
    else:
        parts = {"train": shuffled[:n_train], "valid": shuffled[n_train:n_train + n_valid],
                 "test": shuffled[n_train + n_valid:]}
    pos = 0
    for name in fmt.SPLITS:
        tasks = parts[name]
        ranges[name] = []
        if tasks.size == 0:
            continue
        for s in range(shards):
            chunk = tasks[s::shards]
            order.append(chunk)
            ranges[name].append((s, pos, pos + chunk.size))
            pos += chunk.size
    return SplitLayout(order=np.concatenate(order), shards=ranges, counts=sizes)


def sort_samples(
    task_rank: np.ndarray, time: Optional[np.ndarray], row: np.ndarray, split_by: str, seed: int
) -> np.ndarray:
    """Sample order: by task (output rank), then time (ties: input row) or a seeded shuffle."""
    if split_by == "time":
        if time is None:
            raise DataError("split_by=time needs a time column")
        return np.lexsort((row, time, task_rank))
    rng = np.random.default_rng([seed, 0xA11CE])
    return np.lexsort((rng.random(task_rank.size), task_rank))


@dataclass
class Selection:
    rows: np.ndarray  # indices into the samples, output order: per task support then query
    is_query: np.ndarray  # bool, aligned with ``rows``
    n_support: np.ndarray  # int64 per task (output order)
    n_query: np.ndarray
    truncated: int


def support_query(sorted_rank: np.ndarray, order: np.ndarray, n_tasks: int, query: int, max_support: int) -> Selection:
    """Given samples sorted by (task rank, time): the last ``query`` of each task are the query,
    the ``max_support`` before them the support; older samples are dropped (truncated)."""
    sizes = np.bincount(sorted_rank, minlength=n_tasks).astype(np.int64)
    starts = np.cumsum(sizes) - sizes
    pos = np.arange(sorted_rank.size, dtype=np.int64) - starts[sorted_rank]
    n = sizes[sorted_rank]
    q_start = n - query
    s_start = np.maximum(q_start - max_support, 0)
    keep = pos >= s_start
    n_query = np.minimum(sizes, query)
    n_support = np.minimum(np.maximum(sizes - query, 0), max_support)
    return Selection(
        rows=order[keep],
        is_query=(pos >= q_start)[keep],
        n_support=n_support,
        n_query=n_query,
        truncated=int(sizes.sum() - n_support.sum() - n_query.sum()),
    )
