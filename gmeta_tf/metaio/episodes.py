"""Training episodes re-dealt each epoch: a task's samples get a new random support / query.

Why: ``prepare`` fixes each task's query as its last ``query`` samples, which is the honest
split for *evaluating* a cold user (predict the future from the past). For *training*, that
fixed split starves the meta-learner: the outer loss, the only signal that reaches the id
embeddings in MAML, sees the same few query samples of each training user every epoch, so on
MovieLens an item that no training user rated last is never a query target. Re-dealing the
samples of a training task each epoch (``data.episodes: resample``) turns every rating into a
query target over the epochs, the usual episodic sampling of meta-learning. The valid and test
splits are never re-dealt.

A re-dealt support comes in random order, so in training a support slot's position is not its
age: the Newton head's recency weights (``meta.support_half_life``) then weigh random samples,
and the learned half-life only drifts toward uniform weights (MovieLens: from 5 to 7.4 by the
best step), which is why its start value is chosen on valid. Keeping the re-dealt support
in time order (``decode`` then keeps the newest ``data.support`` samples, mostly far from a
random query) was tried on MovieLens and lost: valid MAE 0.6135 vs 0.6097 (4 seeds).

Vectorized over a record batch at the Arrow level (one ``take`` per column), so it runs before
``decode`` and the padding rules stay in one place. The randomness comes from the reader's
per-(seed, epoch, file) generator, so a resumed run re-deals exactly as before.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import pyarrow as pa

from gmeta_tf.data import task_format as fmt


def _sample_columns(names: List[str]) -> List[str]:
    """Per-sample column suffixes present for both sets (``label``, ``dense``, ``cat.x`` ...)."""
    support = {n[len("support."):] for n in names if n.startswith("support.")}
    query = {n[len("query."):] for n in names if n.startswith("query.")}
    return sorted(support & query)


def resample(rb: pa.RecordBatch, rng: np.random.Generator, draw_support: Optional[int] = None) -> pa.RecordBatch:
    """Each task's support + query samples, shuffled, dealt back with the same query size.

    ``draw_support`` = S (``data.support_size_draw: uniform``): each task keeps only k of its
    re-dealt support samples, k drawn uniformly from 1..S per task (at most what it has). A cold
    user is scored with 5 to 50 ratings, but a support always filled to S trains the head only
    for the full one; the draw shows it the few-shot regime too. The query is unchanged."""
    n = rb.num_rows
    if n == 0:
        return rb
    label_s, label_q = rb.column(fmt.label_col("support")), rb.column(fmt.label_col("query"))
    s_len = np.diff(label_s.offsets.to_numpy())
    q_len = np.diff(label_q.offsets.to_numpy())
    total = s_len + q_len
    # Pooled sample p of task t: support samples first, then query; ``src`` indexes the
    # concatenation [support children | query children] of any per-sample column.
    task = np.repeat(np.arange(n), total)
    start = np.cumsum(total) - total
    pos = np.arange(total.sum()) - start[task]
    s_base = label_s.offsets.to_numpy()[:-1] - label_s.offsets.to_numpy()[0]
    q_base = label_q.offsets.to_numpy()[:-1] - label_q.offsets.to_numpy()[0]
    n_s_children = int(s_len.sum())
    src = np.where(pos < s_len[task], s_base[task] + pos, n_s_children + q_base[task] + pos - s_len[task])
    # A random order within each task: sort by (task, random key).
    order = np.lexsort((rng.random(task.size), task))
    src = src[order]
    is_query = pos < q_len[task]  # after the shuffle, the first q_len of each task are the query
    is_support = ~is_query
    if draw_support is not None:  # drawn after the shuffle: the same generator, so a resume redraws it
        s_len = np.minimum(s_len, rng.integers(1, int(draw_support) + 1, size=n))
        is_support = is_support & (pos < q_len[task] + s_len[task])
    new_q_off = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    new_s_off = np.concatenate([[0], np.cumsum(s_len)]).astype(np.int32)
    q_idx, s_idx = pa.array(src[is_query]), pa.array(src[is_support])

    arrays, names = [], []
    replaced = {}
    for suffix in _sample_columns(rb.schema.names):
        s_col, q_col = rb.column(f"support.{suffix}"), rb.column(f"query.{suffix}")
        pooled = pa.concat_arrays([s_col.flatten(), q_col.flatten()])
        replaced[f"query.{suffix}"] = pa.ListArray.from_arrays(pa.array(new_q_off), pooled.take(q_idx))
        replaced[f"support.{suffix}"] = pa.ListArray.from_arrays(pa.array(new_s_off), pooled.take(s_idx))
    for name in rb.schema.names:
        names.append(name)
        arrays.append(replaced.get(name, rb.column(name)))
    return pa.RecordBatch.from_arrays(arrays, names=names)
