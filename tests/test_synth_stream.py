"""``gmeta data synth`` streams, and a seed still gives the rows of the in-memory generator.

The in-memory generator (before synth streamed, commit 2f098b3) is kept below verbatim as the
reference: every column of every row must be equal, in the same order (the event log's time
order), for chunk and bucket sizes that cut users, blocks and files at many places, for both
label kinds, a later day and another Zipf exponent. The pieces the exactness rests on (numpy's
block-wise sum, chunked draws, ``advance`` and the spare 32-bit half) are tested on their own so a
numpy upgrade that changes them fails here with a clear name.
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gmeta_tf.config.schema import PrepareConfig
from gmeta_tf.data import synth as S
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.prepare import prepare
from gmeta_tf.data.synth import (
    INTERACTION,
    ITEM_SPACE,
    LATENT_DIM,
    MAX_TASK,
    MIN_TASK,
    N_CATEGORIES,
    N_CITIES,
    N_DEVICES,
    N_SEGMENTS,
    N_TAGS,
    T0,
    TAGS_PER_CATEGORY,
    columns_sidecar,
    generate,
    synth,
)

# ------------------------------------------------------------------- the reference, verbatim


def _zscore(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return (x - x.mean()) / (x.std() + 1e-9)


def reference_generate(tasks: int, seed: int = 0, kind: str = "click", zipf: float = 1.15, day: int = 0) -> pa.Table:
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


def reference_synth(out, tasks, seed=0, kind="click", zipf=1.15, rows_per_file=100_000, day=0):
    """What ``synth`` wrote before it streamed (files of ``rows_per_file`` rows, the summary)."""
    table = reference_generate(tasks, seed=seed, kind=kind, zipf=zipf, day=day)
    out.mkdir()
    files = []
    for i, start in enumerate(range(0, table.num_rows, rows_per_file)):
        files.append(f"samples-{i:05d}.parquet")
        pq.write_table(table.slice(start, rows_per_file), out / files[-1])
    (out / fmt.COLUMNS_SIDECAR).write_text(json.dumps(columns_sidecar(kind), indent=2) + "\n")
    label = table.column(columns_sidecar(kind)["label_col"]).to_numpy()
    return table, {"out": str(out), "rows": table.num_rows, "tasks": tasks, "files": files, "kind": kind,
                   "label_mean": float(np.mean(label)), "columns": columns_sidecar(kind)}


def _read_files(out, names):
    return pa.concat_tables([pq.read_table(out / n) for n in names]).combine_chunks()


def _assert_same_rows(want: pa.Table, got: pa.Table) -> None:
    assert got.schema.equals(want.schema), (got.schema, want.schema)
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        assert got[name].equals(want[name]), f"column {name} differs"
    # the brief's form too: the same rows as a set, whatever the order across users
    key = ["user_id", "ts"]
    assert got.sort_by([(k, "ascending") for k in key]).equals(want.sort_by([(k, "ascending") for k in key]))


# ------------------------------------------------------------------- same rows


CASES = [
    # (tasks, options): small chunks and buckets cut users' blocks and the time ranges everywhere
    (40, dict(seed=3)),
    (300, dict(seed=1, rows_per_chunk=1000, rows_per_bucket=2000)),
    (257, dict(seed=4, rows_per_chunk=1, rows_per_bucket=40)),  # a chunk per user, ~400 buckets
    (301, dict(seed=2, kind="rating", rows_per_chunk=777, rows_per_bucket=999)),
    (150, dict(seed=5, day=1, rows_per_chunk=3000, rows_per_bucket=3000)),
    (90, dict(seed=6, day=2, kind="rating", rows_per_chunk=2500, rows_per_bucket=1500)),
    (200, dict(seed=7, zipf=0.8, rows_per_chunk=5000)),
    (120, dict(seed=8, zipf=2.0, rows_per_chunk=4096, rows_per_bucket=8192)),
]


@pytest.mark.parametrize("tasks,opts", CASES, ids=[f"{t}-{sorted(o.items())}" for t, o in CASES])
def test_rows_are_the_in_memory_generators(tasks, opts):
    ref_opts = {k: v for k, v in opts.items() if k in ("seed", "kind", "zipf", "day")}
    want = reference_generate(tasks, **ref_opts)
    assert want.num_rows > 2000
    got = generate(tasks, **opts)
    _assert_same_rows(want, got)


@pytest.mark.parametrize("kind", ["click", "rating"])
def test_synth_files_and_summary_are_the_in_memory_ones(tmp_path, kind):
    want, want_summary = reference_synth(tmp_path / "ref", 230, seed=9, kind=kind, rows_per_file=3000)
    s = synth(str(tmp_path / "raw"), tasks=230, seed=9, kind=kind, rows_per_file=3000, rows_per_chunk=2000,
              rows_per_bucket=1700)
    out = tmp_path / "raw"
    assert s == dict(want_summary, out=str(out))
    assert [pq.ParquetFile(out / n).metadata.num_rows for n in s["files"]] == [
        pq.ParquetFile(tmp_path / "ref" / n).metadata.num_rows for n in want_summary["files"]]
    _assert_same_rows(want, _read_files(out, s["files"]))
    assert sorted(p.name for p in out.iterdir()) == sorted(s["files"] + [fmt.COLUMNS_SIDECAR])  # no spill left
    assert json.loads((out / fmt.COLUMNS_SIDECAR).read_text()) == columns_sidecar(kind)


def test_prepared_output_is_the_same(tmp_path):
    """What training sees: prepare's shards, task lists and schema from both outputs are equal
    (a random split too: its per-row keys are drawn in input order, so the order matters)."""
    reference_synth(tmp_path / "ref", 180, seed=11, rows_per_file=4000)
    synth(str(tmp_path / "raw"), tasks=180, seed=11, rows_per_file=4000, rows_per_chunk=1500, rows_per_bucket=2500)
    for split_by in ("time", "random"):
        cfg = PrepareConfig(query=4, max_support=8, min_task_size=10, shards=2, seed=5, split_by=split_by,
                            engine="memory")
        a = prepare([str(tmp_path / "ref")], str(tmp_path / f"p-ref-{split_by}"), cfg)
        b = prepare([str(tmp_path / "raw")], str(tmp_path / f"p-raw-{split_by}"), cfg)
        a.pop("out"), b.pop("out")
        assert a == b
        ra, rb = tmp_path / f"p-ref-{split_by}", tmp_path / f"p-raw-{split_by}"
        files = sorted(p.relative_to(ra).as_posix() for p in ra.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(rb).as_posix() for p in rb.rglob("*") if p.is_file())
        assert any(f.endswith(".parquet") for f in files)
        for rel in files:
            if rel.endswith(".parquet"):
                assert pq.read_table(ra / rel).equals(pq.read_table(rb / rel)), rel
            elif rel.endswith(".npz"):
                za, zb = np.load(ra / rel), np.load(rb / rel)
                assert sorted(za.files) == sorted(zb.files)
                for k in za.files:
                    np.testing.assert_array_equal(za[k], zb[k])
            else:
                assert (ra / rel).read_bytes() == (rb / rel).read_bytes(), rel


def test_bad_arguments_raise_before_any_work(tmp_path):
    for bad in (dict(tasks=0), dict(tasks=5, kind="ctr"), dict(tasks=5, zipf=0.0), dict(tasks=5, day=-1),
                dict(tasks=5, rows_per_file=0)):
        with pytest.raises(ValueError):
            synth(str(tmp_path / "x"), **bad)
        assert not (tmp_path / "x").exists() and not list(tmp_path.iterdir())


# ------------------------------------------------------------------- what the exactness rests on


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_sum_in_pieces_is_numpys_to_the_last_bit(dtype):
    rng = np.random.default_rng(0)
    for n in (1, 7, 8191, 8192, 8193, 50_000, 123_457):
        x = (rng.normal(size=n) * 10 ** rng.uniform(-4, 4, n)).astype(dtype)
        cuts = np.sort(rng.integers(0, n + 1, 9))
        s = S._Sum(dtype)
        for piece in np.split(x, cuts):
            s.add(piece)
        want = np.sum(x)
        assert s.value() == want and s.value().dtype == want.dtype, (n, s.value(), want)
        if n > 10_000:  # the order of the additions shows: a plain running sum is not numpy's
            assert np.cumsum(x)[-1] != want


def test_draws_in_chunks_are_one_draw():
    """Each per-row array is drawn in pieces: every distribution used gives the same values
    and leaves the same state as one call, a bounded integer's spare 32-bit half included."""
    draws = [lambda g, k: g.random(k), lambda g, k: g.exponential(6 * 3600.0, k),
             lambda g, k: g.normal(0, 0.05, k), lambda g, k: g.integers(0, N_DEVICES, k)]
    for draw in draws:
        one, pieces = np.random.default_rng(3), np.random.default_rng(3)
        one.integers(0, 10, 1), pieces.integers(0, 10, 1)  # a spare half pending at the start
        want = draw(one, 10_001)
        got = np.concatenate([draw(pieces, k) for k in (1, 2, 997, 4000, 5001)])
        np.testing.assert_array_equal(got, want)
        assert pieces.bit_generator.state == one.bit_generator.state


def test_skip_is_random_and_keeps_the_spare_half():
    straight, skipped = np.random.default_rng(4), np.random.default_rng(4)
    straight.integers(0, N_DEVICES, 3), skipped.integers(0, N_DEVICES, 3)  # odd: a spare half left
    straight.random(1234)
    S._skip(skipped, 1234)
    assert skipped.bit_generator.state == straight.bit_generator.state
    np.testing.assert_array_equal(skipped.integers(0, N_DEVICES, 5), straight.integers(0, N_DEVICES, 5))
