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

**Streaming, with the rows of the in-memory generator.** The first version built the whole table
in memory (~1 KB a row at its peak: 100M rows did not fit a box). ``synth`` now writes a chunk of
users at a time, and a seed still gives *the same rows* as that version (``tests/test_synth_stream.py``
keeps it verbatim and compares every column), because:

* Every number still comes from one ``default_rng(seed)`` stream in the same order. The small
  arrays (the 10^6-item world, one entry per user, the tags) are drawn whole, exactly as before;
  each per-row array is drawn chunk by chunk from a generator positioned at its start: drawing
  ``size=n`` in several calls gives the same values as one call (PCG64 keeps its spare 32-bit
  half in the bit generator's state), ``random`` takes one 64-bit draw a value so ``advance(n)``
  skips it, and the variable-consumption ones (exponential, normal, bounded integers) are walked
  once in chunks to find where the next array starts (``_Plan``).
* The z-scores use the whole table's mean and standard deviation *to the last bit*: numpy sums a
  float64 array as a sequential sum of pairwise sums of 8192-value blocks, which ``_Sum`` repeats
  over the chunks (a first pass for the means, a second for the variances).
* The event log's order (time, then generation order) is kept with a bucket sort: a histogram of
  the times gives time ranges of ~``ROWS_PER_BUCKET`` rows, each chunk appends its rows to their
  range's spill file, and each range is then sorted alone and cut into ``rows_per_file`` files.

Memory: the item world (~100 MB), ~150 B per user, one chunk of rows and one bucket; the spill
files (~50 B a row) live in the output's temp dir and are gone before the rename.
The output is what ``gmeta data prepare`` reads with no mapping options: Parquet files plus a
``columns.json`` sidecar (``task_format.COLUMNS_SIDECAR``) that records each column's role.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterator

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


SUM_BLOCK = 8192  # numpy's reduction buffer: np.sum(x) = sequential sum of pairwise sums of 8192-blocks
ROWS_PER_CHUNK = 1 << 19  # rows generated at a time (whole users)
ROWS_PER_BUCKET = 1 << 19  # rows sorted at a time (a time range)
TS_BINS = 1 << 14  # time histogram the buckets are cut from
WORK_DIR = "_synth_work"  # spill files, inside the output's temp dir
_DEVICE_NAMES = pa.array([f"dev_{i}" for i in range(N_DEVICES)], pa.string())
# One spilled row: what the output needs besides the per-item tags and per-user id.
_REC = np.dtype([("r", np.int64), ("ts", np.int64), ("user", np.int64), ("item", np.int32), ("cat", np.int16),
                 ("city", np.int8), ("segment", np.int8), ("device", np.int8), ("hour", np.int8),
                 ("price", np.float32), ("age", np.float32), ("act", np.float32), ("label", np.float32)])


def _check(tasks: int, kind: str, zipf: float, day: int) -> None:
    if day < 0:
        raise ValueError(f"day must be >= 0, got {day}")
    if tasks < 1:
        raise ValueError(f"tasks must be >= 1, got {tasks}")
    if kind not in ("click", "rating"):
        raise ValueError(f"kind must be 'click' or 'rating', got {kind!r}")
    if not zipf > 0:
        raise ValueError(f"zipf exponent must be > 0, got {zipf}")


class _Sum:
    """``np.sum`` of a 1-D array fed in pieces, equal to the last bit: numpy adds the pairwise
    sums of 8192-value blocks one after the other, so the blocks are cut at the same places
    (a carry of < 8192 values between pieces) and added in the same order."""

    def __init__(self, dtype=np.float64):
        self.dtype = np.dtype(dtype)
        self.total = self.dtype.type(-0.0)
        self.carry = np.zeros(0, self.dtype)

    def add(self, x: np.ndarray) -> None:
        buf = np.concatenate([self.carry, x.astype(self.dtype, copy=False)])
        k = buf.size - buf.size % SUM_BLOCK
        if k:
            blocks = np.add.reduce(buf[:k].reshape(-1, SUM_BLOCK), axis=1)
            self.total = np.cumsum(np.concatenate([[self.total], blocks]))[-1]
        self.carry = buf[k:].copy()

    def value(self):
        return self.total + np.add.reduce(self.carry) if self.carry.size else self.total


def _gen(state: Dict) -> np.random.Generator:
    g = np.random.Generator(np.random.PCG64())
    g.bit_generator.state = state
    return g


def _skip(g: np.random.Generator, k: int) -> None:
    """Skip ``k`` 64-bit draws (what ``random(k)`` takes); ``advance`` drops the spare 32-bit
    half that a bounded-integer draw may have left, so it is put back."""
    before = g.bit_generator.state
    g.bit_generator.advance(k)
    after = g.bit_generator.state
    after["has_uint32"], after["uinteger"] = before["has_uint32"], before["uinteger"]
    g.bit_generator.state = after


class _Plan:
    """The whole-table draws of ``default_rng(seed)`` in their original order, and the generator
    state at the start of each per-row array (``st``), found by skipping or walking the arrays."""

    def __init__(self, tasks: int, seed: int, kind: str, zipf: float, day: int, rows_per_chunk: int, bar):
        self.kind, self.day, self.block = kind, day, tasks
        tasks = tasks * (day + 1)
        self.tasks = tasks
        rng = np.random.default_rng(seed)

        # ---- items: popularity rank -> id, category, price, age (whole id space, cheap arrays)
        self.rank_to_item = rng.permutation(ITEM_SPACE).astype(np.int64)
        self.item_cat = item_cat = rng.integers(0, N_CATEGORIES, ITEM_SPACE).astype(np.int32)
        cat_price = rng.normal(3.0, 0.6, N_CATEGORIES)  # log-price level per category
        self.item_logprice = (cat_price[item_cat] + rng.normal(0, 0.4, ITEM_SPACE)).astype(np.float32)
        self.item_age = rng.exponential(120.0, ITEM_SPACE).astype(np.float32)
        cat_vec = rng.normal(size=(N_CATEGORIES, LATENT_DIM))
        cat_vec /= np.linalg.norm(cat_vec, axis=1, keepdims=True)
        self.cat_vec = cat_vec

        # ---- users (tasks)
        self.sizes = sizes = np.clip(np.round(rng.lognormal(4.0, 0.65, tasks)), MIN_TASK, MAX_TASK).astype(np.int64)
        self.u = rng.normal(size=(tasks, LATENT_DIM))
        self.drift = rng.normal(scale=0.3, size=(tasks, LATENT_DIM))  # slow preference drift over a history
        self.bias = rng.normal(-1.1, 0.7, tasks)
        city_p = 1.0 / np.arange(1, N_CITIES + 1) ** 0.8
        self.city = rng.choice(N_CITIES, size=tasks, p=city_p / city_p.sum()).astype(np.int8)
        self.segment = rng.integers(0, N_SEGMENTS, tasks).astype(np.int8)
        self.fav_device = rng.integers(0, N_DEVICES, tasks).astype(np.int8)
        self.activity = (np.log(sizes) + rng.normal(0, 0.3, tasks)).astype(np.float32)  # only used as float32
        self.user_ids = rng.choice(10_000_000, size=tasks, replace=False).astype(np.int64) + 1

        # ---- samples: where each per-row array starts in the stream
        self.n = n = int(sizes.sum())
        self.starts = np.cumsum(sizes) - sizes
        ranks = np.arange(1, ITEM_SPACE + 1, dtype=np.float64)
        cdf = np.cumsum(ranks ** -zipf)
        cdf /= cdf[-1]
        self.cdf = cdf
        per_chunk = self.starts // rows_per_chunk  # whole users per chunk, ~rows_per_chunk rows
        cut = np.flatnonzero(np.diff(per_chunk)) + 1
        self.chunks = list(zip(np.concatenate([[0], cut]).tolist(), np.concatenate([cut, [tasks]]).tolist()))

        self.st = {"rank": rng.bit_generator.state}
        _skip(rng, n)
        self.st["gaps"] = rng.bit_generator.state
        span_lo, span_hi = np.empty(tasks, np.int64), np.empty(tasks, np.int64)
        for u0, u1 in self.chunks:  # walk the gaps: each user's first and last time after its start
            lst, m = self.starts[u0:u1] - self.starts[u0], int(sizes[u0:u1].sum())
            gaps = rng.exponential(6 * 3600.0, m).astype(np.int64) + 1
            span_lo[u0:u1], span_hi[u0:u1] = gaps[lst], np.add.reduceat(gaps, lst)
            bar.update(m)
        self.first = T0 + rng.integers(0, 60 * 86400, tasks)
        self.ts_min, self.ts_max = int((self.first + span_lo).min()), int((self.first + span_hi).max())
        del span_lo, span_hi
        self.st["device_p"] = rng.bit_generator.state
        _skip(rng, n)
        self.st["device_any"] = rng.bit_generator.state
        for u0, u1 in self.chunks:  # walk the random devices
            m = int(sizes[u0:u1].sum())
            rng.integers(0, N_DEVICES, m)
            bar.update(m)
        self.device_effect = rng.normal(0, 0.15, N_DEVICES)
        self.st["price"] = rng.bit_generator.state  # then the labels (st["label"], after the price pass)

    def rows(self, u0: int, u1: int) -> "_Rows":
        return _Rows(self, u0, u1)


class _Rows:
    """Per-row index arrays of users u0 … u1 − 1 (whole users, so per-user sums stay local)."""

    def __init__(self, p: _Plan, u0: int, u1: int):
        sz = p.sizes[u0:u1]
        self.u0, self.u1, self.sz, self.m = u0, u1, sz, int(sz.sum())
        self.row0 = int(p.starts[u0])
        self.lst = p.starts[u0:u1] - self.row0  # the users' first rows within the chunk
        self.user = np.repeat(np.arange(u0, u1), sz)
        pos = np.arange(self.m) - np.repeat(self.lst, sz)  # position within the user's history
        self.frac = pos / np.maximum(np.repeat(sz, sz) - 1, 1)

    def ts(self, p: _Plan, g: np.random.Generator) -> np.ndarray:
        gaps = g.exponential(6 * 3600.0, self.m).astype(np.int64) + 1
        csum = np.cumsum(gaps)
        return csum - np.repeat(csum[self.lst] - gaps[self.lst], self.sz) + np.repeat(p.first[self.u0:self.u1], self.sz)


def _bins(p: _Plan, ts: np.ndarray) -> np.ndarray:
    return (ts - p.ts_min) * TS_BINS // (p.ts_max - p.ts_min + 1)


def _zscore_pass(p: _Plan, work: Path, bar) -> tuple:
    """Pass 1: items and prices (spilled: the later passes re-read them), the items that occur,
    the time histogram of the output rows, and the sums for the z-score means; pass 2: the sums
    of squared deviations. Returns (seen, histogram, [(mean, std)] of log price, age, activity)."""
    g_rank, g_gaps, g_price = _gen(p.st["rank"]), _gen(p.st["gaps"]), _gen(p.st["price"])
    seen = np.zeros(ITEM_SPACE, bool)
    hist = np.zeros(TS_BINS, np.int64)
    sums = [_Sum() for _ in range(3)]
    for j, (u0, u1) in enumerate(p.chunks):
        c = p.rows(u0, u1)
        rank = np.minimum(np.searchsorted(p.cdf, g_rank.random(c.m), side="right"), ITEM_SPACE - 1)
        item = p.rank_to_item[rank]
        ts = c.ts(p, g_gaps)
        price = np.exp(p.item_logprice[item] + g_price.normal(0, 0.05, c.m)).astype(np.float32)
        seen[item] = True
        hist += np.bincount(_bins(p, ts[c.user >= p.day * p.block]), minlength=TS_BINS)
        for s, x in zip(sums, _zscored(p, c, item, price)):
            s.add(x)
        np.save(work / f"rank-{j}.npy", rank.astype(np.int32))
        np.save(work / f"price-{j}.npy", price)
        bar.update(c.m)
    p.st["label"] = g_price.bit_generator.state
    means = [s.value() / p.n for s in sums]  # as ndarray.mean: the sum over the count
    sq = [_Sum() for _ in range(3)]
    for j, (u0, u1) in enumerate(p.chunks):
        c = p.rows(u0, u1)
        item, price = _spilled(p, work, j)
        for s, x, mean in zip(sq, _zscored(p, c, item, price), means):
            d = x - mean
            s.add(np.multiply(d, d, out=d))  # as ndarray.std
        bar.update(c.m)
    return seen, hist, [(mean, np.sqrt(s.value() / p.n)) for mean, s in zip(means, sq)]


def _zscored(p: _Plan, c: _Rows, item: np.ndarray, price: np.ndarray) -> list:
    """The three z-scored columns as float64, as ``_zscore`` saw them (log of a float32 price)."""
    age = (p.item_age[item] + c.frac * 30).astype(np.float32)
    user_act = p.activity[c.user]
    return [np.log(price).astype(np.float64), age.astype(np.float64), user_act.astype(np.float64)]


def _spilled(p: _Plan, work: Path, j: int) -> tuple:
    return p.rank_to_item[np.load(work / f"rank-{j}.npy")], np.load(work / f"price-{j}.npy")


def _z(x: np.ndarray, ms: tuple) -> np.ndarray:
    return (x - ms[0]) / (ms[1] + 1e-9)


def _label_pass(p: _Plan, work: Path, ms: list, bucket_of_bin: np.ndarray, bar) -> None:
    """Pass 3: every column and the label; the output rows go to their time range's spill file."""
    g_gaps, g_dev_p, g_dev_any, g_label = (_gen(p.st[k]) for k in ("gaps", "device_p", "device_any", "label"))
    for j, (u0, u1) in enumerate(p.chunks):
        c = p.rows(u0, u1)
        rank = np.load(work / f"rank-{j}.npy").astype(np.int64)
        item, price = p.rank_to_item[rank], np.load(work / f"price-{j}.npy")
        user = c.user
        cat = p.item_cat[item]
        ts = c.ts(p, g_gaps)
        hour = (ts // 3600) % 24
        device = np.where(g_dev_p.random(c.m) < 0.7, p.fav_device[user], g_dev_any.integers(0, N_DEVICES, c.m))
        logprice, age, user_act = _zscored(p, c, item, price)

        u_t = p.u[user] + c.frac[:, None] * p.drift[user]
        affinity = np.einsum("nd,nd->n", u_t, p.cat_vec[cat])  # ~N(0, 1): the per-user signal
        global_part = (
            -0.15 * np.log(rank + 1.0) / np.log(ITEM_SPACE) * 4  # popular items a little better
            - 0.25 * _z(logprice, ms[0])
            - 0.15 * _z(age, ms[1])
            + 0.2 * np.sin(2 * np.pi * hour / 24)
            + p.device_effect[device]
            + 0.1 * _z(user_act, ms[2])
        )
        if p.kind == "click":
            logit = INTERACTION * affinity + p.bias[user] + global_part
            label = (g_label.random(c.m) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        else:
            score = affinity + 0.5 * (p.bias[user] + 1.1) / 0.7 + global_part / INTERACTION
            label = np.clip(np.round(3 + 1.2 * score + g_label.normal(0, 0.5, c.m)), 1, 5).astype(np.float32)

        keep = user >= p.day * p.block  # a later day: this day's users only
        if keep.any():
            rec = np.empty(int(keep.sum()), _REC)
            for name, col in (("r", c.row0 + np.arange(c.m)), ("ts", ts), ("user", user), ("item", item),
                              ("cat", cat), ("city", p.city[user]), ("segment", p.segment[user]),
                              ("device", device), ("hour", hour), ("price", price), ("age", age),
                              ("act", user_act), ("label", label)):
                rec[name] = col[keep]
            bucket = bucket_of_bin[_bins(p, rec["ts"])]
            order = np.argsort(bucket, kind="stable")
            rec, bucket = rec[order], bucket[order]
            edges = np.flatnonzero(np.diff(bucket)) + 1
            for lo, hi in zip(np.concatenate([[0], edges]), np.concatenate([edges, [rec.size]])):
                with open(work / f"bucket-{int(bucket[lo])}.bin", "ab") as f:
                    rec[lo:hi].tofile(f)
        (work / f"rank-{j}.npy").unlink()
        (work / f"price-{j}.npy").unlink()
        bar.update(c.m)
    p.st["tags"] = g_label.bit_generator.state


def _tags(p: _Plan, seen: np.ndarray) -> tuple:
    """1-6 tags per item that occurs, mostly from the item's category's own block of 25 tags
    (drawn for the sorted distinct items, as before); returns (tags by distinct item, item → index)."""
    rng = _gen(p.st["tags"])
    uniq_items = np.flatnonzero(seen)
    item_cat = p.item_cat
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
    lists = pa.ListArray.from_arrays(pa.array(tag_offsets), pa.array(tags, pa.int64()))
    return lists, (np.cumsum(seen) - 1).astype(np.int64)


def _bucket_table(p: _Plan, rec: np.ndarray, tags: tuple, label_col: str) -> pa.Table:
    """A time range's rows in event-log order (time, then generation order) as the output table."""
    rec = rec[np.lexsort((rec["r"], rec["ts"]))]
    item = rec["item"].astype(np.int64)
    shift = p.day * (p.ts_max - p.ts_min + 1)  # a later day comes after every earlier one
    label = (pa.array(rec["label"].astype(np.int64), pa.int64()) if p.kind == "click"
             else pa.array(rec["label"], pa.float32()))
    return pa.table({
        "user_id": pa.array(p.user_ids[rec["user"]]),
        "ts": pa.array(rec["ts"] + shift),
        "item_id": pa.array(item),
        "item_category": pa.array(rec["cat"].astype(np.int64)),
        "user_city": pa.array(rec["city"].astype(np.int64)),
        "user_segment": pa.array(rec["segment"].astype(np.int64)),
        "device": _DEVICE_NAMES.take(pa.array(rec["device"].astype(np.int64))),
        "hour": pa.array(rec["hour"].astype(np.int64)),
        "item_tags": tags[0].take(pa.array(tags[1][item])),
        "price": pa.array(np.ascontiguousarray(rec["price"])),
        "item_age_days": pa.array(np.ascontiguousarray(rec["age"])),
        "user_activity": pa.array(np.ascontiguousarray(rec["act"])),
        label_col: label,
    })


def stream(tasks: int, work: Path, seed: int = 0, kind: str = "click", zipf: float = 1.15, day: int = 0,
           rows_per_chunk: int = ROWS_PER_CHUNK, rows_per_bucket: int = ROWS_PER_BUCKET,
           progress: bool = False) -> Iterator[pa.Table]:
    """Yield the sample table (rows ordered by timestamp, like an event log) a time range at a
    time, spilling to ``work`` (an empty directory) in between.

    ``day`` d > 0 gives ``tasks`` *new* users of the same world (the same items, categories,
    tags and global effects: users d·tasks … (d+1)·tasks − 1 of one seeded population), shifted
    d times the population's time span later, so each day comes after the ones before it: a
    later day's data for continuous training (``gmeta train --warm-start``), with
    new users and, in the long tail, item ids the earlier days never had."""
    from tqdm import tqdm

    _check(tasks, kind, zipf, day)
    if rows_per_chunk < 1 or rows_per_bucket < 1:
        raise ValueError(f"rows_per_chunk and rows_per_bucket must be >= 1, got {rows_per_chunk}, {rows_per_bucket}")
    bar = tqdm(total=None, unit=" rows", unit_scale=True, desc="synth plan", file=sys.stderr,
               disable=None if progress else True, leave=False)
    try:
        bar.set_description("synth plan")
        p = _Plan(tasks, seed, kind, zipf, day, rows_per_chunk, bar)
        bar.reset(total=6 * p.n)
        bar.update(2 * p.n)
        bar.set_description("synth z-scores")
        seen, hist, ms = _zscore_pass(p, work, bar)
        bucket_of_bin = (np.cumsum(hist) - hist) // rows_per_bucket
        bar.set_description("synth rows")
        _label_pass(p, work, ms, bucket_of_bin, bar)
        tags = _tags(p, seen)
        label_col = columns_sidecar(kind)["label_col"]
        bar.set_description("synth sort")
        for path in sorted(work.glob("bucket-*.bin"), key=lambda q: int(q.stem.split("-")[1])):
            rec = np.fromfile(path, dtype=_REC)
            path.unlink()
            yield _bucket_table(p, rec, tags, label_col)
            bar.update(rec.size)
    finally:
        bar.close()


def generate(tasks: int, seed: int = 0, kind: str = "click", zipf: float = 1.15, day: int = 0,
             **kw) -> pa.Table:
    """The whole sample table in memory (small sets and tests; ``synth`` writes it as it goes)."""
    _check(tasks, kind, zipf, day)
    with tempfile.TemporaryDirectory(prefix="gmeta-synth-") as work:
        return pa.concat_tables(list(stream(tasks, Path(work), seed, kind, zipf, day, **kw))).combine_chunks()


class _Files:
    """``samples-NNNNN.parquet`` files of exactly ``rows_per_file`` rows (the last one fewer)."""

    def __init__(self, out: Path, rows_per_file: int):
        self.out, self.rows_per_file = out, rows_per_file
        self.pending: list = []
        self.rows = 0
        self.names: list = []

    def add(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.rows += table.num_rows
        if self.rows >= self.rows_per_file:
            whole = pa.concat_tables(self.pending)
            k = self.rows - self.rows % self.rows_per_file
            for start in range(0, k, self.rows_per_file):
                self._write(whole.slice(start, self.rows_per_file))
            # a copy of the rest: a slice would keep the whole bucket's buffers alive
            rest = self.rows - k
            self.pending, self.rows = [whole.slice(k).take(pa.array(np.arange(rest)))], rest

    def close(self) -> None:
        if self.rows:
            self._write(pa.concat_tables(self.pending))

    def _write(self, t: pa.Table) -> None:
        name = f"samples-{len(self.names):05d}.parquet"
        pq.write_table(t.combine_chunks(), self.out / name)
        self.names.append(name)


def synth(
    out: str,
    tasks: int = 3000,
    seed: int = 0,
    kind: str = "click",
    zipf: float = 1.15,
    overwrite: bool = False,
    rows_per_file: int = 100_000,
    day: int = 0,
    progress: bool = False,
    rows_per_chunk: int = ROWS_PER_CHUNK,
    rows_per_bucket: int = ROWS_PER_BUCKET,
) -> Dict:
    """Write ``out/samples-NNNNN.parquet`` + ``out/columns.json``; return a small summary.

    Written to a temporary sibling directory and renamed into place, so ``out`` is never
    half-written. An existing ``out`` is refused unless ``overwrite``. Memory is bounded by a
    chunk of rows and a time bucket (plus ~150 B per user), whatever ``tasks``.
    """
    _check(tasks, kind, zipf, day)
    if rows_per_file < 1:
        raise ValueError(f"rows_per_file must be >= 1, got {rows_per_file}")
    out_p = Path(out)
    check_target(out_p, overwrite)
    sidecar = columns_sidecar(kind)
    label_col = sidecar["label_col"]
    # ndarray.mean of the label column in file order: float64 for the int clicks, float32 for ratings
    label_sum = _Sum(np.float64 if kind == "click" else np.float32)
    with atomic_dir(out_p, overwrite) as tmp:
        work = tmp / WORK_DIR
        work.mkdir()
        files = _Files(tmp, rows_per_file)
        for table in stream(tasks, work, seed, kind, zipf, day, rows_per_chunk, rows_per_bucket, progress):
            label_sum.add(table.column(label_col).to_numpy())
            files.add(table)
        files.close()
        shutil.rmtree(work)
        (tmp / fmt.COLUMNS_SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    rows = sum(pq.ParquetFile(out_p / f).metadata.num_rows for f in files.names)
    return {
        "out": str(out_p),
        "rows": rows,
        "tasks": tasks,
        "files": files.names,
        "kind": kind,
        "label_mean": float(label_sum.dtype.type(label_sum.value() / np.intp(rows))),
        "columns": sidecar,
    }


def format_summary(s: Dict) -> str:
    what = f"CTR {s['label_mean']:.3f}" if s["kind"] == "click" else f"mean rating {s['label_mean']:.2f}"
    return (
        f"wrote {s['rows']:,} samples for {s['tasks']:,} tasks ({s['kind']}, {what}) "
        f"to {s['out']} ({len(s['files'])} file(s) + {fmt.COLUMNS_SIDECAR})"
    )
