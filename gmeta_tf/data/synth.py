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

**Streaming.** ``synth`` writes block by block (``tasks_per_block`` users at a time, each block
time-ordered and cut into ``rows_per_file`` files), so memory is bounded by one block plus the
item world (~100 MB) whatever ``--tasks`` is: 100M rows are as cheap in memory as 1M.

Why the rows differ from the pre-streaming (in-memory) generator of the same seed: that one drew
every random number from one global stream in one pass (all users' sizes, then all samples'
items, …), z-scored price/age/activity over the whole table, picked user ids without
replacement from the whole population and sorted the whole table by time. None of that can be
reproduced a block at a time. Here:

* The item world (popularity order, categories, prices, ages, category vectors) comes from
  ``default_rng(seed)`` as before, so an item has the same category and price level as in the
  old output; its tags and the device effects are now drawn once per world too (they were drawn
  after the samples). The world is the same for every block.
* Users come in fixed chunks of ``CHUNK_TASKS``; chunk ``c`` draws everything from its own
  generator ``default_rng([seed, c + 1])``. The rows therefore depend on the seed and on each user's
  global index only, **not on the block size** (the block size only decides which rows share a
  file), and ``day`` d is simply users d·tasks … (d+1)·tasks − 1 of the same population.
* The z-scores use population constants of the world (popularity-weighted exact moments for
  price and age, a fixed pilot sample for activity) instead of the moments of the rows drawn.
* User ids are a seeded bijection of the global user index onto 1 … ``ID_PRIME`` (unique
  without remembering earlier blocks).
* Each block is ordered by time (an event log per block); prepare regroups by task anyway.
* A later day starts ``DAY_SPAN`` after the day before; the rare user whose history would run
  past ``HISTORY_CAP`` (> 20 standard deviations above a 600-event history's mean) has it compressed to fit, so a
  later day always comes after the ones before it.

Everything is vectorized numpy per chunk (no per-sample Python).
The output is what ``gmeta data prepare`` reads with no mapping options: Parquet files plus a
``columns.json`` sidecar (``task_format.COLUMNS_SIDECAR``) that records each column's role.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List

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
DAY = 86_400
FIRST_SPREAD = 60 * DAY  # a user's first event falls in the population's first 60 days
HISTORY_CAP = 300 * DAY  # a 600-event history spans ~150 days (sd ~6): the cap practically never binds
DAY_SPAN = 365 * DAY  # day d + 1 starts this long after day d (> FIRST_SPREAD + HISTORY_CAP)
CHUNK_TASKS = 1000  # users per generator: the unit the rows are a function of
TASKS_PER_BLOCK = 10_000  # users in memory at once while writing (~670k rows)
ID_PRIME = 10_000_019  # user ids are a bijection of the global user index onto 1 … ID_PRIME
_PILOT_KEY = 2**32 - 1  # a generator key no chunk reaches (chunk c is keyed [seed, c + 1])

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


@dataclass(frozen=True)
class World:
    """What every block shares: the items, the global effects and the normalisation constants."""

    cdf: np.ndarray  # popularity rank -> cumulative probability
    rank_to_item: np.ndarray
    item_cat: np.ndarray
    item_logprice: np.ndarray
    item_age: np.ndarray
    item_tags: pa.ListArray  # indexed by item id
    cat_vec: np.ndarray
    device_effect: np.ndarray
    city_p: np.ndarray
    id_mult: int
    id_add: int
    logprice_ms: tuple  # (mean, std) of log(price) over the rows the world produces
    age_ms: tuple
    activity_ms: tuple


def _tags(rng: np.random.Generator, item_cat: np.ndarray) -> pa.ListArray:
    """1-6 tags per item, mostly from its category's own block of 25 (fixed per item)."""
    n_tags = rng.integers(1, 7, ITEM_SPACE, dtype=np.int32)
    owner = np.repeat(np.arange(ITEM_SPACE, dtype=np.int32), n_tags)
    own = rng.random(owner.size) < 0.8
    in_cat = rng.integers(0, TAGS_PER_CATEGORY, owner.size)
    anywhere = rng.integers(0, N_TAGS, owner.size)
    tags = np.where(own, item_cat[owner].astype(np.int64) * TAGS_PER_CATEGORY + in_cat, anywhere)
    offsets = np.concatenate([[0], np.cumsum(n_tags)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(tags, pa.int64()))


def _weighted_ms(values: np.ndarray, w: np.ndarray, extra_var: float = 0.0) -> tuple:
    mean = float(np.dot(w, values))
    return mean, float(np.sqrt(np.dot(w, (values - mean) ** 2) + extra_var))


def _activity_ms(seed: int) -> tuple:
    """Row-weighted moments of log(size) + noise from a fixed pilot of 200k users."""
    sizes, noise = _draw_sizes(np.random.default_rng([seed, _PILOT_KEY]), 200_000)
    act = np.log(sizes) + noise
    return _weighted_ms(act, sizes / sizes.sum())


def _draw_sizes(rng: np.random.Generator, n: int):
    sizes = np.clip(np.round(rng.lognormal(4.0, 0.65, n)), MIN_TASK, MAX_TASK).astype(np.int64)
    return sizes, rng.normal(0, 0.3, n)


def make_world(seed: int, zipf: float) -> World:
    """The item space and global effects of ``seed`` (~100 MB, built once per run)."""
    rng = np.random.default_rng(seed)  # as the in-memory generator: the same items per seed
    rank_to_item = rng.permutation(ITEM_SPACE).astype(np.int64)
    item_cat = rng.integers(0, N_CATEGORIES, ITEM_SPACE).astype(np.int32)
    cat_price = rng.normal(3.0, 0.6, N_CATEGORIES)  # log-price level per category
    item_logprice = (cat_price[item_cat] + rng.normal(0, 0.4, ITEM_SPACE)).astype(np.float32)
    item_age = rng.exponential(120.0, ITEM_SPACE).astype(np.float32)
    cat_vec = rng.normal(size=(N_CATEGORIES, LATENT_DIM))
    cat_vec /= np.linalg.norm(cat_vec, axis=1, keepdims=True)
    device_effect = rng.normal(0, 0.15, N_DEVICES)
    item_tags = _tags(rng, item_cat)
    id_mult, id_add = (int(v) for v in rng.integers(1, ID_PRIME, 2))
    p = (1.0 / np.arange(1, ITEM_SPACE + 1, dtype=np.float64)) ** zipf
    p /= p.sum()
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    city_p = 1.0 / np.arange(1, N_CITIES + 1) ** 0.8
    return World(
        cdf=cdf, rank_to_item=rank_to_item, item_cat=item_cat, item_logprice=item_logprice,
        item_age=item_age, item_tags=item_tags, cat_vec=cat_vec, device_effect=device_effect,
        city_p=city_p / city_p.sum(), id_mult=id_mult, id_add=id_add,
        logprice_ms=_weighted_ms(item_logprice[rank_to_item].astype(np.float64), p, 0.05**2),
        age_ms=_weighted_ms(item_age[rank_to_item].astype(np.float64) + 15.0, p, 30.0**2 / 12),
        activity_ms=_activity_ms(seed),
    )


def _z(x: np.ndarray, ms: tuple) -> np.ndarray:
    return (x.astype(np.float64) - ms[0]) / (ms[1] + 1e-9)


def _timestamps(rng, sizes, starts, pos, n):
    """Per-user strictly increasing event times from a random first event (seconds after T0)."""
    gaps = rng.exponential(6 * 3600.0, n).astype(np.int64) + 1
    first = rng.integers(0, FIRST_SPREAD, sizes.size)
    csum = np.cumsum(gaps)
    rel = csum - np.repeat(csum[starts] - gaps[starts], sizes)
    span = rel[starts + sizes - 1]
    over = np.repeat(span > HISTORY_CAP, sizes)
    if over.any():  # compress the rare over-long history; + pos keeps it strictly increasing
        scale = np.repeat(HISTORY_CAP / np.maximum(span, HISTORY_CAP), sizes)
        rel = np.where(over, np.floor(rel * scale).astype(np.int64) + pos, rel)
    return rel + np.repeat(first, sizes)


def _chunk(world: World, seed: int, chunk: int, kind: str) -> Dict[str, object]:
    """All rows of users chunk·CHUNK_TASKS … (chunk+1)·CHUNK_TASKS − 1, from their own generator."""
    # c + 1: SeedSequence pads with zeros, so [seed, 0] would be the world's stream again
    rng = np.random.default_rng([seed, chunk + 1])
    c = CHUNK_TASKS
    sizes, act_noise = _draw_sizes(rng, c)
    u = rng.normal(size=(c, LATENT_DIM))
    drift = rng.normal(scale=0.3, size=(c, LATENT_DIM))  # slow preference drift over a history
    bias = rng.normal(-1.1, 0.7, c)
    city = rng.choice(N_CITIES, size=c, p=world.city_p)
    segment = rng.integers(0, N_SEGMENTS, c)
    fav_device = rng.integers(0, N_DEVICES, c)
    activity = np.log(sizes) + act_noise

    n = int(sizes.sum())
    user = np.repeat(np.arange(c), sizes)
    starts = np.cumsum(sizes) - sizes
    pos = np.arange(n) - np.repeat(starts, sizes)  # position within the user's history
    frac = pos / np.maximum(np.repeat(sizes, sizes) - 1, 1)
    rank = np.minimum(np.searchsorted(world.cdf, rng.random(n), side="right"), ITEM_SPACE - 1)
    item = world.rank_to_item[rank]
    cat = world.item_cat[item]
    ts = T0 + _timestamps(rng, sizes, starts, pos, n)
    hour = (ts // 3600) % 24
    device = np.where(rng.random(n) < 0.7, fav_device[user], rng.integers(0, N_DEVICES, n))
    price = np.exp(world.item_logprice[item] + rng.normal(0, 0.05, n)).astype(np.float32)
    age = (world.item_age[item] + frac * 30).astype(np.float32)
    user_act = activity[user].astype(np.float32)

    u_t = u[user] + frac[:, None] * drift[user]
    affinity = np.einsum("nd,nd->n", u_t, world.cat_vec[cat])  # ~N(0, 1): the per-user signal
    global_part = (
        -0.15 * np.log(rank + 1.0) / np.log(ITEM_SPACE) * 4  # popular items a little better
        - 0.25 * _z(np.log(price), world.logprice_ms)
        - 0.15 * _z(age, world.age_ms)
        + 0.2 * np.sin(2 * np.pi * hour / 24)
        + world.device_effect[device]
        + 0.1 * _z(user_act, world.activity_ms)
    )
    if kind == "click":
        logit = INTERACTION * affinity + bias[user] + global_part
        label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    else:
        score = affinity + 0.5 * (bias[user] + 1.1) / 0.7 + global_part / INTERACTION
        label = np.clip(np.round(3 + 1.2 * score + rng.normal(0, 0.5, n)), 1, 5).astype(np.float32)
    return {"task": chunk * c + user, "ts": ts, "item": item, "cat": cat, "city": city[user],
            "segment": segment[user], "device": device, "hour": hour, "price": price, "age": age,
            "user_act": user_act, "label": label}


_DEVICE_NAMES = pa.array([f"dev_{i}" for i in range(N_DEVICES)], pa.string())


def _block_table(world: World, cols: Dict[str, np.ndarray], kind: str, ts_shift: int) -> pa.Table:
    """One block's rows as the output table, ordered by time (an event log)."""
    order = np.argsort(cols["ts"], kind="stable")
    col = {k: v[order] for k, v in cols.items()}
    user_ids = (col["task"] * world.id_mult + world.id_add) % ID_PRIME + 1
    label_type = pa.int64() if kind == "click" else pa.float32()
    return pa.table({
        "user_id": pa.array(user_ids.astype(np.int64)),
        "ts": pa.array((col["ts"] + ts_shift).astype(np.int64)),
        "item_id": pa.array(col["item"]),
        "item_category": pa.array(col["cat"].astype(np.int64)),
        "user_city": pa.array(col["city"].astype(np.int64)),
        "user_segment": pa.array(col["segment"].astype(np.int64)),
        "device": _DEVICE_NAMES.take(pa.array(col["device"])),
        "hour": pa.array(col["hour"].astype(np.int64)),
        "item_tags": world.item_tags.take(pa.array(col["item"])),
        "price": pa.array(col["price"]),
        "item_age_days": pa.array(col["age"]),
        "user_activity": pa.array(col["user_act"]),
        columns_sidecar(kind)["label_col"]: pa.array(col["label"], label_type),
    })


def _block_rows(world: World, seed: int, kind: str, lo: int, hi: int) -> Dict[str, np.ndarray]:
    """Rows of global users lo … hi − 1: whole chunks drawn, the users outside dropped (a block
    size that is a multiple of CHUNK_TASKS draws each chunk once)."""
    parts = [_chunk(world, seed, c, kind) for c in range(lo // CHUNK_TASKS, -(-hi // CHUNK_TASKS))]
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    keep = (cols["task"] >= lo) & (cols["task"] < hi)
    return cols if keep.all() else {k: v[keep] for k, v in cols.items()}


def _check(tasks: int, kind: str, zipf: float, day: int, tasks_per_block: int) -> None:
    if day < 0:
        raise ValueError(f"day must be >= 0, got {day}")
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    if kind not in ("click", "rating"):
        raise ValueError(f"kind must be 'click' or 'rating', got {kind!r}")
    if not zipf > 0:
        raise ValueError(f"zipf exponent must be > 0, got {zipf}")
    if tasks_per_block < 1:
        raise ValueError(f"tasks_per_block must be >= 1, got {tasks_per_block}")
    if (day + 1) * tasks >= ID_PRIME:
        raise ValueError(f"(day + 1) * tasks must stay below {ID_PRIME:,} (the user id space), got {(day + 1) * tasks:,}")


def iter_blocks(tasks: int, seed: int = 0, kind: str = "click", zipf: float = 1.15, day: int = 0,
                tasks_per_block: int = TASKS_PER_BLOCK) -> Iterator[tuple]:
    """Yield ``(table, n_tasks)`` per block of ``tasks_per_block`` users, each ordered by time.

    ``day`` d > 0 gives ``tasks`` *new* users of the same world (the same items, categories,
    tags and global effects: users d·tasks … (d+1)·tasks − 1 of one seeded population), d·DAY_SPAN
    later, so each day comes after the ones before it: a later day's data for continuous
    training (``gmeta train --warm-start``), with new users and, in the long tail, item ids the
    earlier days never had."""
    _check(tasks, kind, zipf, day, tasks_per_block)
    world = make_world(seed, zipf)
    first, end = day * tasks, (day + 1) * tasks
    for lo in range(first, end, tasks_per_block):
        hi = min(lo + tasks_per_block, end)
        yield _block_table(world, _block_rows(world, seed, kind, lo, hi), kind, day * DAY_SPAN), hi - lo


def generate(tasks: int, seed: int = 0, kind: str = "click", zipf: float = 1.15, day: int = 0,
             tasks_per_block: int = TASKS_PER_BLOCK) -> pa.Table:
    """The whole sample table in memory, ordered by time (for tests and small sets; ``synth``
    streams). Same rows as ``synth`` writes, whatever ``tasks_per_block``."""
    table = pa.concat_tables([t for t, _ in iter_blocks(tasks, seed, kind, zipf, day, tasks_per_block)])
    ts = table.column("ts").to_numpy()
    return table.take(pa.array(np.argsort(ts, kind="stable")))


def synth(
    out: str,
    tasks: int = 3000,
    seed: int = 0,
    kind: str = "click",
    zipf: float = 1.15,
    overwrite: bool = False,
    rows_per_file: int = 100_000,
    day: int = 0,
    tasks_per_block: int = TASKS_PER_BLOCK,
    progress: bool = False,
) -> Dict:
    """Write ``out/samples-NNNNN.parquet`` + ``out/columns.json``; return a small summary.

    One block of ``tasks_per_block`` users is in memory at a time; each block is cut into files
    of at most ``rows_per_file`` rows (a file never spans two blocks). Written to a temporary
    sibling directory and renamed into place, so ``out`` is never half-written. An existing
    ``out`` is refused unless ``overwrite``. ``progress`` draws a tqdm line (tasks written) on
    stderr.
    """
    from tqdm import tqdm

    if rows_per_file < 1:
        raise ValueError(f"rows_per_file must be >= 1, got {rows_per_file}")
    out_p = Path(out)
    check_target(out_p, overwrite)
    sidecar = columns_sidecar(kind)
    files: List[str] = []
    rows, label_sum = 0, 0.0
    blocks = iter_blocks(tasks, seed, kind, zipf, day, tasks_per_block)
    with atomic_dir(out_p, overwrite) as tmp, tqdm(total=tasks, unit="task", file=sys.stderr,
                                                  disable=not progress, desc="synth") as bar:
        for table, n_tasks in blocks:
            for start in range(0, table.num_rows, rows_per_file):
                name = f"samples-{len(files):05d}.parquet"
                pq.write_table(table.slice(start, rows_per_file), tmp / name)
                files.append(name)
            rows += table.num_rows
            label_sum += float(np.sum(table.column(sidecar["label_col"]).to_numpy()))
            bar.update(n_tasks)
        (tmp / fmt.COLUMNS_SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    return {
        "out": str(out_p),
        "rows": rows,
        "tasks": tasks,
        "files": files,
        "kind": kind,
        "label_mean": label_sum / max(rows, 1),
        "columns": sidecar,
    }


def format_summary(s: Dict) -> str:
    what = f"CTR {s['label_mean']:.3f}" if s["kind"] == "click" else f"mean rating {s['label_mean']:.2f}"
    return (
        f"wrote {s['rows']:,} samples for {s['tasks']:,} tasks ({s['kind']}, {what}) "
        f"to {s['out']} ({len(s['files'])} file(s) + {fmt.COLUMNS_SIDECAR})"
    )
