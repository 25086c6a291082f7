"""``gmeta data synth`` streams: the rows depend on the seed and each user's global index only.

``reference_generate`` below is the in-memory generator this replaced, kept verbatim so the
streamed output can be compared with it: the rows cannot be equal (the old one drew from one
global stream, z-scored over the whole table and drew user ids without replacement; see the
``gmeta_tf.data.synth`` docstring), so the comparison is of the item world (identical) and of the
distributions (close).
"""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from gmeta_tf.cli.data_cmd import data
from gmeta_tf.data import synth as S
from gmeta_tf.data import task_format as fmt
from gmeta_tf.data.synth import generate, iter_blocks, synth

# ------------------------------------------------------------------ the pre-streaming reference

def _zscore(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return (x - x.mean()) / (x.std() + 1e-9)


def reference_generate(tasks: int, seed: int = 0, kind: str = "click", zipf: float = 1.15, day: int = 0) -> pa.Table:
    """The pre-streaming generator (git 5517848), verbatim: one global stream, whole table in memory.

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
    rank_to_item = rng.permutation(S.ITEM_SPACE).astype(np.int64)
    item_cat = rng.integers(0, S.N_CATEGORIES, S.ITEM_SPACE).astype(np.int32)
    cat_price = rng.normal(3.0, 0.6, S.N_CATEGORIES)  # log-price level per category
    item_logprice = (cat_price[item_cat] + rng.normal(0, 0.4, S.ITEM_SPACE)).astype(np.float32)
    item_age = rng.exponential(120.0, S.ITEM_SPACE).astype(np.float32)
    cat_vec = rng.normal(size=(S.N_CATEGORIES, S.LATENT_DIM))
    cat_vec /= np.linalg.norm(cat_vec, axis=1, keepdims=True)

    # ---- users (tasks)
    sizes = np.clip(np.round(rng.lognormal(4.0, 0.65, tasks)), S.MIN_TASK, S.MAX_TASK).astype(np.int64)
    u = rng.normal(size=(tasks, S.LATENT_DIM))
    drift = rng.normal(scale=0.3, size=(tasks, S.LATENT_DIM))  # slow preference drift over a history
    bias = rng.normal(-1.1, 0.7, tasks)
    city_p = 1.0 / np.arange(1, S.N_CITIES + 1) ** 0.8
    city = rng.choice(S.N_CITIES, size=tasks, p=city_p / city_p.sum())
    segment = rng.integers(0, S.N_SEGMENTS, tasks)
    fav_device = rng.integers(0, S.N_DEVICES, tasks)
    activity = np.log(sizes) + rng.normal(0, 0.3, tasks)
    user_ids = rng.choice(10_000_000, size=tasks, replace=False).astype(np.int64) + 1

    # ---- samples
    n = int(sizes.sum())
    user = np.repeat(np.arange(tasks), sizes)
    starts = np.cumsum(sizes) - sizes
    pos = np.arange(n) - np.repeat(starts, sizes)  # position within the user's history
    frac = pos / np.maximum(np.repeat(sizes, sizes) - 1, 1)

    ranks = np.arange(1, S.ITEM_SPACE + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -zipf)
    cdf /= cdf[-1]
    rank = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), S.ITEM_SPACE - 1)
    item = rank_to_item[rank]
    cat = item_cat[item]

    gaps = rng.exponential(6 * 3600.0, n).astype(np.int64) + 1
    first = S.T0 + rng.integers(0, 60 * 86400, tasks)
    csum = np.cumsum(gaps)
    ts = csum - np.repeat(csum[starts] - gaps[starts], sizes) + np.repeat(first, sizes)
    hour = (ts // 3600) % 24

    device = np.where(rng.random(n) < 0.7, fav_device[user], rng.integers(0, S.N_DEVICES, n))
    device_effect = rng.normal(0, 0.15, S.N_DEVICES)
    price = np.exp(item_logprice[item] + rng.normal(0, 0.05, n)).astype(np.float32)
    age = (item_age[item] + frac * 30).astype(np.float32)
    user_act = activity[user].astype(np.float32)

    u_t = u[user] + frac[:, None] * drift[user]
    affinity = np.einsum("nd,nd->n", u_t, cat_vec[cat])  # ~N(0, 1): the per-user signal
    global_part = (
        -0.15 * np.log(rank + 1.0) / np.log(S.ITEM_SPACE) * 4  # popular items a little better
        - 0.25 * _zscore(np.log(price))
        - 0.15 * _zscore(age)
        + 0.2 * np.sin(2 * np.pi * hour / 24)
        + device_effect[device]
        + 0.1 * _zscore(user_act)
    )
    if kind == "click":
        logit = S.INTERACTION * affinity + bias[user] + global_part
        label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
        label_arr = pa.array(label, pa.int64())
    else:
        score = affinity + 0.5 * (bias[user] + 1.1) / 0.7 + global_part / S.INTERACTION
        rating = np.clip(np.round(3 + 1.2 * score + rng.normal(0, 0.5, n)), 1, 5)
        label_arr = pa.array(rating.astype(np.float32), pa.float32())

    # ---- tags: 1-6 per item, mostly from the item's category's own block of 25 tags
    uniq_items, inv = np.unique(item, return_inverse=True)
    n_tags = rng.integers(1, 7, uniq_items.size)
    owner = np.repeat(np.arange(uniq_items.size), n_tags)
    own = rng.random(owner.size) < 0.8
    tags = np.where(
        own,
        item_cat[uniq_items][owner].astype(np.int64) * S.TAGS_PER_CATEGORY
        + rng.integers(0, S.TAGS_PER_CATEGORY, owner.size),
        rng.integers(0, S.N_TAGS, owner.size),
    )
    tag_offsets = np.concatenate([[0], np.cumsum(n_tags)]).astype(np.int32)
    item_tags = pa.ListArray.from_arrays(pa.array(tag_offsets), pa.array(tags, pa.int64())).take(
        pa.array(inv.astype(np.int64))
    )

    dev_names = np.array([f"dev_{i}" for i in range(S.N_DEVICES)], dtype=object)
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
            S.columns_sidecar(kind)["label_col"]: label_arr,
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


# ------------------------------------------------------------------ streaming


def _by_user(t: pa.Table) -> pa.Table:
    order = np.lexsort((t.column("ts").to_numpy(), t.column("user_id").to_numpy()))
    return t.take(pa.array(order))


def test_rows_do_not_depend_on_the_block_size():
    whole = _by_user(generate(2300, seed=2, tasks_per_block=2300))
    for block in (1000, 700, 1):
        if block == 1:
            got = pa.concat_tables([t for t, _ in iter_blocks(5, seed=2, tasks_per_block=1)])
            want = _by_user(generate(5, seed=2))
            assert _by_user(got).equals(want)
        else:
            assert _by_user(generate(2300, seed=2, tasks_per_block=block)).equals(whole), block
    assert not _by_user(generate(2300, seed=3)).equals(whole)


def test_blocks_hold_their_users_only_and_are_event_logs():
    sizes = []
    for table, n_tasks in iter_blocks(2500, seed=4, tasks_per_block=1000):
        users = table.column("user_id").to_numpy()
        assert np.unique(users).size == n_tasks
        assert np.all(np.diff(table.column("ts").to_numpy()) >= 0)
        sizes.append(n_tasks)
    assert sizes == [1000, 1000, 500]


def test_synth_files_never_span_blocks_and_hold_generates_rows(tmp_path, read_table):
    s = synth(str(tmp_path / "raw"), tasks=2500, seed=4, tasks_per_block=1000, rows_per_file=30_000)
    files = sorted((tmp_path / "raw").glob("samples-*.parquet"))
    assert [f.name for f in files] == s["files"]
    per_file = [pq.read_table(f) for f in files]
    assert all(t.num_rows <= 30_000 for t in per_file)
    # Each file is a time-ordered slice of one block: 3 blocks of ~67k rows → 3 files each.
    blocks = [t for t, _ in iter_blocks(2500, seed=4, tasks_per_block=1000)]
    want_files = sum(-(-b.num_rows // 30_000) for b in blocks)
    assert len(files) == want_files
    got = read_table(tmp_path / "raw")
    assert got.equals(pa.concat_tables(blocks))
    assert s["rows"] == got.num_rows
    assert s["label_mean"] == pytest.approx(got.column("click").to_numpy().mean())
    assert _by_user(got).equals(_by_user(generate(2500, seed=4)))


def test_user_ids_are_unique_across_blocks_and_days():
    ids = [np.unique(generate(1500, seed=0, day=d).column("user_id").to_numpy()) for d in (0, 1, 2)]
    assert [i.size for i in ids] == [1500, 1500, 1500]
    every = np.concatenate(ids)
    assert np.unique(every).size == 4500
    assert every.min() >= 1 and every.max() <= S.ID_PRIME


def test_a_day_is_the_next_users_of_one_population():
    two = _by_user(generate(600, seed=5))
    day0, day1 = _by_user(generate(300, seed=5)), _by_user(generate(300, seed=5, day=1))
    assert day1.column("ts").to_numpy().min() > day0.column("ts").to_numpy().max()
    in0 = np.isin(two.column("user_id").to_numpy(), day0.column("user_id").to_numpy())
    assert two.filter(pa.array(in0)).equals(day0)
    later = two.filter(pa.array(~in0))
    shifted = later.set_column(1, "ts", pa.array(later.column("ts").to_numpy() + S.DAY_SPAN))
    assert shifted.equals(day1)
    # The long tail brings item ids day 0 never had.
    new = np.setdiff1d(day1.column("item_id").to_numpy(), day0.column("item_id").to_numpy())
    assert new.size > 1000


def test_an_over_long_history_is_compressed_and_stays_increasing(monkeypatch):
    monkeypatch.setattr(S, "HISTORY_CAP", 5 * S.DAY)  # a median user's history is ~14 days
    t = generate(300, seed=6)
    users, ts = t.column("user_id").to_numpy(), t.column("ts").to_numpy()
    order = np.lexsort((ts, users))
    users, ts = users[order], ts[order]
    same = users[1:] == users[:-1]
    assert np.all(np.diff(ts)[same] > 0)
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    first = ts[starts]
    last = ts[np.concatenate([starts[1:], [ts.size]]) - 1]
    assert np.all(last - first <= 5 * S.DAY + S.MAX_TASK)
    assert np.mean(last - first >= 4.5 * S.DAY) > 0.5


def test_same_world_and_close_distributions_as_the_in_memory_reference():
    old, new = reference_generate(1500, seed=0), generate(1500, seed=0)
    assert old.schema.equals(new.schema)
    # The item world is the old one: an item has the same category in both.
    cat = {}
    for t in (old, new):
        items, first = np.unique(t.column("item_id").to_numpy(), return_index=True)
        cat[id(t)] = dict(zip(items.tolist(), t.column("item_category").to_numpy()[first].tolist()))
    shared = set(cat[id(old)]) & set(cat[id(new)])
    assert len(shared) > 3000
    assert all(cat[id(old)][i] == cat[id(new)][i] for i in shared)
    stats = {}
    for name, t in (("old", old), ("new", new)):
        y = t.column("click").to_numpy().astype(float)
        _, inv, n = np.unique(t.column("user_id").to_numpy(), return_inverse=True, return_counts=True)
        user_ctr = np.bincount(inv, weights=y) / n
        stats[name] = {
            "ctr": y.mean(), "rows_per_user": n.mean(), "user_ctr_std": user_ctr[n >= 40].std(),
            "log_price": np.log(t.column("price").to_numpy()).mean(),
            "age": t.column("item_age_days").to_numpy().mean(),
            "tags": np.mean([len(x) for x in t.column("item_tags").slice(0, 5000).to_pylist()]),
        }
    o, n = stats["old"], stats["new"]
    assert abs(o["ctr"] - n["ctr"]) < 0.03, stats
    assert n["rows_per_user"] == pytest.approx(o["rows_per_user"], rel=0.06), stats
    assert abs(o["user_ctr_std"] - n["user_ctr_std"]) < 0.03, stats
    assert abs(o["log_price"] - n["log_price"]) < 0.05, stats
    assert n["age"] == pytest.approx(o["age"], rel=0.1), stats
    assert n["tags"] == pytest.approx(o["tags"], rel=0.1), stats


def test_rating_kind_has_the_click_kinds_features():
    click, rating = _by_user(generate(200, seed=8)), _by_user(generate(200, seed=8, kind="rating"))
    assert click.drop(["click"]).equals(rating.drop(["rating"]))
    r = rating.column("rating").to_numpy()
    assert set(np.unique(r)) == {1.0, 2.0, 3.0, 4.0, 5.0}


def test_bad_block_arguments(tmp_path):
    with pytest.raises(ValueError, match="tasks_per_block"):
        generate(5, tasks_per_block=0)
    with pytest.raises(ValueError, match="user id space"):
        generate(S.ID_PRIME)
    r = CliRunner().invoke(data, ["synth", "--out", str(tmp_path / "x"), "--tasks", "5", "--tasks-per-block", "0"])
    assert r.exit_code == 2 and "--tasks-per-block" in r.output
    assert not (tmp_path / "x").exists()


def test_cli_streams_with_a_progress_line(tmp_path, capfd):
    out = tmp_path / "raw"
    r = CliRunner(mix_stderr=False).invoke(
        data, ["synth", "--out", str(out), "--tasks", "2500", "--tasks-per-block", "1000", "--rows-per-file", "40000"])
    assert r.exit_code == 0, r.output + r.stderr
    assert "2,500 tasks" in r.output
    assert "2500/2500" in r.stderr and "task" in r.stderr
    assert json.loads((out / fmt.COLUMNS_SIDECAR).read_text())["label_col"] == "click"
    assert len(list(out.glob("samples-*.parquet"))) == 5  # blocks of ~67k, ~67k and ~33k rows: 2 + 2 + 1 files
