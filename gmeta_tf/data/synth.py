"""Synthetic sample-level recommendation logs in which per-user adaptation matters.

Why synthetic data at all: the demo, the tests and the benchmarks need a data set that is free,
deterministic, fast to make, and has the two properties meta-learning is about:

* **Tasks differ.** Each task is a user with a latent preference vector ``u`` (R^4) and a
  private bias. The label is driven by ``2.5 · u·c[category]``: the *same* item is liked by one
  user and disliked by another, so a global model that knows nothing about a new user is close
  to a coin flip on that term, while ~16 support samples reveal ``u`` well enough to predict
  much better. Item popularity, price, age, hour and device add weak global effects that a
  shared model can learn.
* **Features look like production ones.** Categorical ids of very different cardinality
  (device: 10, hour: 24, user_segment/user_city: ~50-100, item_category: 200, item_id: a 10^6 id
  space with Zipf-skewed popularity), one multi-hot list (item_tags, ~5000 ids, correlated with
  the category), a few dense numbers, a timestamp, string ids (device) next to integer ids, and
  task sizes that vary by two orders of magnitude.

Everything is vectorized numpy (no per-sample Python), so 3000 users / ~200k rows take seconds.
The output is what ``gmeta data prepare`` reads with no mapping options: Parquet files plus a
``columns.json`` sidecar (``task_format.COLUMNS_SIDECAR``) that records each column's role.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.atomic import atomic_dir, check_target

ITEM_SPACE = 1_000_000
N_CATEGORIES = 200
TAGS_PER_CATEGORY = 25
N_TAGS = N_CATEGORIES * TAGS_PER_CATEGORY  # 5000
N_CITIES = 100
N_SEGMENTS = 50
N_DEVICES = 10
LATENT_DIM = 4
INTERACTION = 2.5  # weight of the user × category term: the part only adaptation can learn
MIN_TASK, MAX_TASK = 8, 600
T0 = 1_700_000_000  # first timestamp (seconds)

CATEGORICAL = ["item_id", "item_category", "user_city", "user_segment", "device", "hour"]
MULTI_HOT = ["item_tags"]
DENSE = ["price", "item_age_days", "user_activity"]
ID_SPACE = {
    "item_id": ITEM_SPACE,
    "item_category": N_CATEGORIES,
    "user_city": N_CITIES,
    "user_segment": N_SEGMENTS,
    "device": N_DEVICES,
    "hour": 24,
    "item_tags": N_TAGS,
}


def columns_sidecar(kind: str) -> Dict:
    """The role of every column, as ``prepare`` reads it (``id_space`` is informational)."""
    label = "click" if kind == "click" else "rating"
    return {
        "task_col": "user_id",
        "label_col": label,
        "label_kind": kind,
        "categorical": list(CATEGORICAL),
        "multi_hot": list(MULTI_HOT),
        "dense": list(DENSE),
        "time_col": "ts",
        "id_space": dict(ID_SPACE),
    }


def _zscore(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return (x - x.mean()) / (x.std() + 1e-9)


def generate(tasks: int, seed: int = 0, kind: str = "click", zipf: float = 1.15, day: int = 0) -> pa.Table:
    """Build the sample table in memory (rows ordered by timestamp, like an event log).

    ``day`` d > 0 gives ``tasks`` *new* users of the same world (the same items, categories,
    tags and global effects: users d·tasks … (d+1)·tasks − 1 of one seeded population), shifted
    d times the population's time span later, so each day comes after the ones before it: a
    later day's data for continuous training (``gmeta train --warm-start``), with
    new users and, in the long tail, item ids the earlier days never had."""
    if day < 0:
        raise ValueError(f"day must be >= 0, got {day}")
    block, tasks = tasks, tasks * (day + 1)
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    if kind not in ("click", "rating"):
        raise ValueError(f"kind must be 'click' or 'rating', got {kind!r}")
    if not zipf > 0:
        raise ValueError(f"zipf exponent must be > 0, got {zipf}")
    rng = np.random.default_rng(seed)

    # ---- items: popularity rank -> id, category, price, age (whole id space, cheap arrays)
    rank_to_item = rng.permutation(ITEM_SPACE).astype(np.int64)
    item_cat = rng.integers(0, N_CATEGORIES, ITEM_SPACE).astype(np.int32)
    cat_price = rng.normal(3.0, 0.6, N_CATEGORIES)  # log-price level per category
    item_logprice = (cat_price[item_cat] + rng.normal(0, 0.4, ITEM_SPACE)).astype(np.float32)
    item_age = rng.exponential(120.0, ITEM_SPACE).astype(np.float32)
    cat_vec = rng.normal(size=(N_CATEGORIES, LATENT_DIM))
    cat_vec /= np.linalg.norm(cat_vec, axis=1, keepdims=True)

    # ---- users (tasks)
    sizes = np.clip(np.round(rng.lognormal(4.0, 0.65, tasks)), MIN_TASK, MAX_TASK).astype(np.int64)
    u = rng.normal(size=(tasks, LATENT_DIM))
    drift = rng.normal(scale=0.3, size=(tasks, LATENT_DIM))  # slow preference drift over a history
    bias = rng.normal(-1.1, 0.7, tasks)
    city_p = 1.0 / np.arange(1, N_CITIES + 1) ** 0.8
    city = rng.choice(N_CITIES, size=tasks, p=city_p / city_p.sum())
    segment = rng.integers(0, N_SEGMENTS, tasks)
    fav_device = rng.integers(0, N_DEVICES, tasks)
    activity = np.log(sizes) + rng.normal(0, 0.3, tasks)
    user_ids = rng.choice(10_000_000, size=tasks, replace=False).astype(np.int64) + 1

    # ---- samples
    n = int(sizes.sum())
    user = np.repeat(np.arange(tasks), sizes)
    starts = np.cumsum(sizes) - sizes
    pos = np.arange(n) - np.repeat(starts, sizes)  # position within the user's history
    frac = pos / np.maximum(np.repeat(sizes, sizes) - 1, 1)

    ranks = np.arange(1, ITEM_SPACE + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -zipf)
    cdf /= cdf[-1]
    rank = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), ITEM_SPACE - 1)
    item = rank_to_item[rank]
    cat = item_cat[item]

    gaps = rng.exponential(6 * 3600.0, n).astype(np.int64) + 1
    first = T0 + rng.integers(0, 60 * 86400, tasks)
    csum = np.cumsum(gaps)
    ts = csum - np.repeat(csum[starts] - gaps[starts], sizes) + np.repeat(first, sizes)
    hour = (ts // 3600) % 24

    device = np.where(rng.random(n) < 0.7, fav_device[user], rng.integers(0, N_DEVICES, n))
    device_effect = rng.normal(0, 0.15, N_DEVICES)
    price = np.exp(item_logprice[item] + rng.normal(0, 0.05, n)).astype(np.float32)
    age = (item_age[item] + frac * 30).astype(np.float32)
    user_act = activity[user].astype(np.float32)

    u_t = u[user] + frac[:, None] * drift[user]
    affinity = np.einsum("nd,nd->n", u_t, cat_vec[cat])  # ~N(0, 1): the per-user signal
    global_part = (
        -0.15 * np.log(rank + 1.0) / np.log(ITEM_SPACE) * 4  # popular items a little better
        - 0.25 * _zscore(np.log(price))
        - 0.15 * _zscore(age)
        + 0.2 * np.sin(2 * np.pi * hour / 24)
        + device_effect[device]
        + 0.1 * _zscore(user_act)
    )
    if kind == "click":
        logit = INTERACTION * affinity + bias[user] + global_part
        label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
        label_arr = pa.array(label, pa.int64())
    else:
        score = affinity + 0.5 * (bias[user] + 1.1) / 0.7 + global_part / INTERACTION
        rating = np.clip(np.round(3 + 1.2 * score + rng.normal(0, 0.5, n)), 1, 5)
        label_arr = pa.array(rating.astype(np.float32), pa.float32())

    # ---- tags: 1-6 per item, mostly from the item's category's own block of 25 tags
    uniq_items, inv = np.unique(item, return_inverse=True)
    n_tags = rng.integers(1, 7, uniq_items.size)
    owner = np.repeat(np.arange(uniq_items.size), n_tags)
    own = rng.random(owner.size) < 0.8
    tags = np.where(
        own,
        item_cat[uniq_items][owner].astype(np.int64) * TAGS_PER_CATEGORY
        + rng.integers(0, TAGS_PER_CATEGORY, owner.size),
        rng.integers(0, N_TAGS, owner.size),
    )
    tag_offsets = np.concatenate([[0], np.cumsum(n_tags)]).astype(np.int32)
    item_tags = pa.ListArray.from_arrays(pa.array(tag_offsets), pa.array(tags, pa.int64())).take(
        pa.array(inv.astype(np.int64))
    )

    dev_names = np.array([f"dev_{i}" for i in range(N_DEVICES)], dtype=object)
    table = pa.table(
        {
            "user_id": pa.array(user_ids[user]),
            "ts": pa.array(ts.astype(np.int64)),
            "item_id": pa.array(item),
            "item_category": pa.array(cat.astype(np.int64)),
            "user_city": pa.array(city[user].astype(np.int64)),
            "user_segment": pa.array(segment[user].astype(np.int64)),
            "device": pa.array(dev_names[device], pa.string()),
            "hour": pa.array(hour.astype(np.int64)),
            "item_tags": item_tags,
            "price": pa.array(price),
            "item_age_days": pa.array(age),
            "user_activity": pa.array(user_act),
            columns_sidecar(kind)["label_col"]: label_arr,
        }
    )
    if day:  # this day's users only, later in time
        keep = user >= day * block
        table = table.filter(pa.array(keep)).set_column(
            table.schema.get_field_index("ts"), "ts", pa.array(ts[keep].astype(np.int64) + day * (ts.max() - ts.min() + 1)))
        ts = ts[keep]
    # An event log is ordered by time across users; prepare must regroup it by task.
    order = np.lexsort((np.arange(ts.size), ts))
    return table.take(pa.array(order))


def synth(
    out: str,
    tasks: int = 3000,
    seed: int = 0,
    kind: str = "click",
    zipf: float = 1.15,
    overwrite: bool = False,
    rows_per_file: int = 100_000,
    day: int = 0,
) -> Dict:
    """Write ``out/samples-NNNNN.parquet`` + ``out/columns.json``; return a small summary.

    Written to a temporary sibling directory and renamed into place, so ``out`` is never
    half-written. An existing ``out`` is refused unless ``overwrite``.
    """
    out_p = Path(out)
    check_target(out_p, overwrite)
    table = generate(tasks, seed=seed, kind=kind, zipf=zipf, day=day)
    sidecar = columns_sidecar(kind)
    files = []
    with atomic_dir(out_p, overwrite) as tmp:
        for i, start in enumerate(range(0, table.num_rows, rows_per_file)):
            name = f"samples-{i:05d}.parquet"
            pq.write_table(table.slice(start, rows_per_file), tmp / name)
            files.append(name)
        (tmp / fmt.COLUMNS_SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    label = table.column(sidecar["label_col"]).to_numpy()
    return {
        "out": str(out_p),
        "rows": table.num_rows,
        "tasks": tasks,
        "files": files,
        "kind": kind,
        "label_mean": float(np.mean(label)),
        "columns": sidecar,
    }


def format_summary(s: Dict) -> str:
    what = f"CTR {s['label_mean']:.3f}" if s["kind"] == "click" else f"mean rating {s['label_mean']:.2f}"
    return (
        f"wrote {s['rows']:,} samples for {s['tasks']:,} tasks ({s['kind']}, {what}) "
        f"to {s['out']} ({len(s['files'])} file(s) + {fmt.COLUMNS_SIDECAR})"
    )
