"""Meta-IO reader: exact padded values, standardization, sharding, eval padding, shuffling, errors.

Fixtures are written here with pyarrow straight from ``gmeta_tf.data.task_format`` (not via
``prepare``) so the reader is tested against the format contract alone, and compared with a
deliberately naive per-task Python reference.
"""
from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import gmeta_tf  # noqa: F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from gmeta_tf.config.schema import DataConfig
from gmeta_tf.data import task_format as fmt
from gmeta_tf.errors import DataError
from gmeta_tf.metaio import decode, reader

CATS = ["user", "item"]
MULTIS = ["tags"]
MEAN = [1.0, -2.0, 5.0]
STD = [2.0, 0.5, 0.0]  # the last one is a constant feature: std 0 must act as 1


# --------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------
def make_task(rng, tid, n_s, n_q, multi_len=None, dense_dim=3):
    def sample():
        k = int(rng.integers(0, 12)) if multi_len is None else multi_len
        return {
            "label": float(rng.integers(0, 2)),
            "dense": [float(x) for x in rng.normal(size=dense_dim).round(3)],
            "cat": {c: int(rng.integers(0, 1000)) for c in CATS},
            "multi": {m: [int(x) for x in rng.integers(0, 500, size=k)] for m in MULTIS},
        }

    return {"task_id": str(tid), "support": [sample() for _ in range(n_s)], "query": [sample() for _ in range(n_q)]}


def write_part(file, tasks, dense_dim=3, row_group_size=None, drop=(), extra=None):
    cols = {fmt.TASK_ID: pa.array([t["task_id"] for t in tasks], pa.string())}
    cols[fmt.N_SUPPORT] = pa.array([len(t["support"]) for t in tasks], pa.int32())
    cols[fmt.N_QUERY] = pa.array([len(t["query"]) for t in tasks], pa.int32())
    for w in fmt.SETS:
        cols[fmt.label_col(w)] = pa.array([[s["label"] for s in t[w]] for t in tasks], pa.list_(pa.float32()))
        cols[fmt.dense_col(w)] = pa.array(
            [[s["dense"] for s in t[w]] for t in tasks], pa.list_(pa.list_(pa.float32()))
        )
        for c in CATS:
            cols[fmt.cat_col(w, c)] = pa.array([[s["cat"][c] for s in t[w]] for t in tasks], pa.list_(pa.int64()))
        for m in MULTIS:
            cols[fmt.multi_col(w, m)] = pa.array(
                [[s["multi"][m] for s in t[w]] for t in tasks], pa.list_(pa.list_(pa.int64()))
            )
    for d in drop:
        del cols[d]
    cols.update(extra or {})
    pq.write_table(pa.table(cols), file, row_group_size=row_group_size or max(1, len(tasks)))


def make_schema(splits, dense_dim=3, version=fmt.FORMAT_VERSION):
    return {
        "format_version": version,
        "task_col": "user",
        "label": {"name": "click", "kind": "click"},
        "time_col": None,
        "categorical": [{"name": c, "cardinality": 1000, "hashed": False, "pooling": 1.0} for c in CATS],
        "multi_hot": [{"name": m, "cardinality": 500, "hashed": False, "pooling": 5.0, "max_len": 11} for m in MULTIS],
        "dense": [{"name": f"d{i}", "mean": MEAN[i], "std": STD[i]} for i in range(dense_dim)],
        "label_stats": {"mean": 0.5, "std": 0.5},
        "support_query": {"query": 4, "max_support": 64, "split_by": "time"},
        "splits": splits,
    }


def write_dataset(root, parts_by_split, dense_dim=3, row_group_size=None):
    """parts_by_split: {split: [list of tasks per part file]}."""
    splits = {}
    for split, parts in parts_by_split.items():
        os.makedirs(os.path.join(root, split), exist_ok=True)
        names = []
        for i, tasks in enumerate(parts):
            name = fmt.part_name(i, len(parts))
            write_part(os.path.join(root, split, name), tasks, dense_dim, row_group_size)
            names.append(f"{split}/{name}")
        splits[split] = {"tasks": sum(map(len, parts)), "samples": 0, "files": names}
    with open(os.path.join(root, fmt.SCHEMA_FILE), "w") as f:
        json.dump(make_schema(splits, dense_dim), f)
    return str(root)


def cfg(**kw):
    base = dict(tasks_per_batch=4, support=5, query=3, max_multi_hot=4, shuffle_buffer=64, parallel_reads=2, prefetch=2)
    base.update(kw)
    return DataConfig(**base)


def reference(task, c: DataConfig, dense_dim=3):
    """Naive per-task, per-sample padding: the behaviour the vectorized decoder must match."""
    out = {}
    for w, width in (("support", c.support), ("query", c.query)):
        samples = task[w][-width:] if w == "support" else task[w][:width]
        lab = np.zeros(width, np.float32)
        mask = np.zeros(width, np.float32)
        dense = np.zeros((width, dense_dim), np.float32)
        cat = {n: np.full(width, -1, np.int64) for n in CATS}
        multi = {n: np.full((width, c.max_multi_hot), -1, np.int64) for n in MULTIS}
        for k, s in enumerate(samples):
            lab[k] = s["label"]
            mask[k] = 1.0
            for d in range(dense_dim):
                std = STD[d] if STD[d] > 0 else 1.0
                dense[k, d] = (np.float32(s["dense"][d]) - MEAN[d]) / std
            for n in CATS:
                cat[n][k] = s["cat"][n]
            for n in MULTIS:
                for j, v in enumerate(s["multi"][n][: c.max_multi_hot]):
                    multi[n][k, j] = v
        out[w] = {"label": lab, "mask": mask, "dense": dense, "cat": cat, "multi": multi}
    return out


def unbatch(ds):
    """Every task of a dataset of batches as (task_id, task_mask, nested numpy dict)."""
    rows = []
    for b in ds:
        b = tf.nest.map_structure(lambda x: x.numpy(), b)
        for i in range(len(b["task_id"])):
            rows.append(tf.nest.map_structure(lambda x: x[i], b))
    return rows


def assert_task_equal(got, want):
    for w in fmt.SETS:
        np.testing.assert_array_equal(got[w]["mask"], want[w]["mask"])
        np.testing.assert_array_equal(got[w]["label"], want[w]["label"])
        np.testing.assert_allclose(got[w]["dense"], want[w]["dense"], rtol=1e-6, atol=1e-6)
        for n in CATS:
            np.testing.assert_array_equal(got[w]["cat"][n], want[w]["cat"][n], err_msg=f"{w} cat {n}")
        for n in MULTIS:
            np.testing.assert_array_equal(got[w]["multi"][n], want[w]["multi"][n], err_msg=f"{w} multi {n}")


@pytest.fixture()
def hand_tasks():
    rng = np.random.default_rng(7)
    return [
        make_task(rng, "a", 2, 1),  # short support, short query
        make_task(rng, "b", 9, 3, multi_len=7),  # support longer than S=5, multi-hot longer than L=4
        make_task(rng, "c", 5, 6, multi_len=0),  # empty multi-hot lists, query longer than Q=3
        make_task(rng, "d", 0, 2),  # no support at all
        make_task(rng, "e", 1, 3),
    ]


# --------------------------------------------------------------------------------------------
# exact values
# --------------------------------------------------------------------------------------------
def test_exact_values_eval(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"test": [hand_tasks]})
    c = cfg()
    rows = unbatch(reader.make_dataset(path, "test", c, training=False))
    assert len(rows) == 8  # 5 tasks, padded to 2 batches of T=4
    for got, task in zip(rows, hand_tasks):
        assert got["task_id"].decode() == task["task_id"]
        assert got["task_mask"] == 1.0
        assert_task_equal(got, reference(task, c))
    # spot checks independent of the reference: support keeps the LAST S, query the FIRST Q
    b = rows[1]
    assert b["support"]["cat"]["user"][0] == hand_tasks[1]["support"][4]["cat"]["user"]
    assert b["support"]["cat"]["user"][4] == hand_tasks[1]["support"][8]["cat"]["user"]
    assert list(b["support"]["multi"]["tags"][0]) == hand_tasks[1]["support"][4]["multi"]["tags"][:4]
    assert (rows[2]["support"]["multi"]["tags"] == -1).all()
    assert rows[2]["query"]["cat"]["item"][2] == hand_tasks[2]["query"][2]["cat"]["item"]
    assert rows[3]["support"]["mask"].sum() == 0 and (rows[3]["support"]["cat"]["user"] == -1).all()
    np.testing.assert_array_equal(rows[0]["support"]["mask"], [1, 1, 0, 0, 0])


def test_exact_values_multi_block_and_sliced_batches(tmp_path, monkeypatch):
    """Many record batches per file (sliced Arrow arrays) decode exactly like the reference."""
    monkeypatch.setattr(reader, "BLOCK_ROWS", 7)
    rng = np.random.default_rng(3)
    tasks = [make_task(rng, i, int(rng.integers(0, 12)), int(rng.integers(1, 6))) for i in range(40)]
    path = write_dataset(tmp_path, {"valid": [tasks[:25], tasks[25:]]}, row_group_size=10)
    c = cfg(parallel_reads=1)
    rows = unbatch(reader.make_dataset(path, "valid", c, training=False))
    real = [r for r in rows if r["task_mask"] == 1.0]
    assert sorted(r["task_id"].decode() for r in real) == sorted(t["task_id"] for t in tasks)
    by_id = {t["task_id"]: t for t in tasks}
    for r in real:
        assert_task_equal(r, reference(by_id[r["task_id"].decode()], c))


def test_shapes_match_batch_signature(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks]})
    c = cfg()
    schema = reader.load_schema(path)
    sig = reader.batch_signature(schema, c)
    ds = reader.make_dataset(path, "train", c, schema=schema)
    assert tf.nest.map_structure(lambda s: (tuple(s.shape), s.dtype), ds.element_spec) == tf.nest.map_structure(
        lambda s: (tuple(s.shape), s.dtype), sig
    )
    batch = next(iter(ds))
    assert batch["support"]["multi"]["tags"].shape == (4, 5, 4)
    assert batch["query"]["dense"].shape == (4, 3, 3)
    assert batch["support"]["cat"]["item"].dtype == tf.int64


def test_dense_standardization(tmp_path):
    rng = np.random.default_rng(0)
    t = make_task(rng, "x", 1, 1)
    t["support"][0]["dense"] = [3.0, -1.0, 7.5]
    t["query"][0]["dense"] = [1.0, -2.0, 5.0]
    path = write_dataset(tmp_path, {"test": [[t]]})
    row = unbatch(reader.make_dataset(path, "test", cfg(), training=False))[0]
    # (x - mean) / std with mean (1, -2, 5), std (2, 0.5, 0 -> 1)
    np.testing.assert_allclose(row["support"]["dense"][0], [1.0, 2.0, 2.5])
    np.testing.assert_allclose(row["query"]["dense"][0], [0.0, 0.0, 0.0])
    assert (row["support"]["dense"][1:] == 0).all()  # padded samples stay exactly 0


def test_no_dense_features(tmp_path, hand_tasks):
    for t in hand_tasks:
        for w in fmt.SETS:
            for s in t[w]:
                s["dense"] = []
    path = write_dataset(tmp_path, {"test": [hand_tasks]}, dense_dim=0)
    b = next(iter(reader.make_dataset(path, "test", cfg(), training=False)))
    assert b["support"]["dense"].shape == (4, 5, 0)
    assert_task_equal(tf.nest.map_structure(lambda x: x[1].numpy(), b), reference(hand_tasks[1], cfg(), dense_dim=0))
    b = next(iter(reader.make_dataset(path, "test", cfg(), training=True)))
    assert b["query"]["dense"].shape == (4, 3, 0)


# --------------------------------------------------------------------------------------------
# sharding, eval padding, training order
# --------------------------------------------------------------------------------------------
@pytest.fixture()
def sharded(tmp_path):
    rng = np.random.default_rng(1)
    parts = [[make_task(rng, f"{p}-{i}", 3, 2) for i in range(n)] for p, n in enumerate([6, 5, 7, 3])]
    return write_dataset(tmp_path, {"train": parts, "test": parts}), parts


def test_eval_every_task_once_and_padded(sharded):
    path, parts = sharded
    c = cfg(tasks_per_batch=4)
    batches = list(reader.make_dataset(path, "test", c, training=False))
    assert len(batches) == 6  # 21 tasks -> 5 full + 1 padded
    assert all(b["task_id"].shape == (4,) for b in batches)
    last = tf.nest.map_structure(lambda x: x.numpy(), batches[-1])
    np.testing.assert_array_equal(last["task_mask"], [1, 0, 0, 0])
    assert list(last["task_id"][1:]) == [b"", b"", b""]
    assert last["support"]["mask"][1:].sum() == 0 and last["query"]["mask"][1:].sum() == 0
    assert (last["support"]["cat"]["user"][1:] == -1).all() and (last["query"]["multi"]["tags"][1:] == -1).all()
    ids = [r["task_id"].decode() for r in unbatch(batches) if r["task_mask"] == 1]
    assert sorted(ids) == sorted(t["task_id"] for p in parts for t in p)
    # deterministic order: a second pass is identical
    again = [r["task_id"].decode() for r in unbatch(reader.make_dataset(path, "test", c, training=False))]
    assert again[: len(ids)] == ids


def test_eval_shards_disjoint_and_complete(sharded):
    path, parts = sharded
    seen = []
    for rank in range(2):
        rows = unbatch(reader.make_dataset(path, "test", cfg(), rank=rank, size=2, training=False))
        ids = {r["task_id"].decode() for r in rows if r["task_mask"] == 1}
        expect = {t["task_id"] for p in parts[rank::2] for t in p}  # part i goes to rank i % 2
        assert ids == expect
        seen.append(ids)
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == {t["task_id"] for p in parts for t in p}


def _train_ids(path, c, n_batches, rank=0, size=1):
    ds = reader.make_dataset(path, "train", c, rank=rank, size=size, training=True)
    ids = []
    for b in ds.take(n_batches):
        assert b["task_mask"].numpy().min() == 1.0  # training never pads
        ids += [x.decode() for x in b["task_id"].numpy()]
    return ids


def test_training_rank_reads_only_its_shards(sharded):
    path, parts = sharded
    for rank in range(2):
        ids = _train_ids(path, cfg(tasks_per_batch=3), 20, rank=rank, size=2)
        assert set(ids) == {t["task_id"] for p in parts[rank::2] for t in p}


def test_training_repeats_and_reshuffles(sharded):
    path, parts = sharded
    everything = sorted(t["task_id"] for p in parts for t in p)
    n = len(everything)  # 21 tasks; T=3 divides 21*3 so 3 epochs are exactly 21 batches
    ids = _train_ids(path, cfg(tasks_per_batch=3, shuffle_buffer=8), 3 * n // 3)
    epochs = [ids[i * n : (i + 1) * n] for i in range(3)]
    for e in epochs:
        assert sorted(e) == everything  # each epoch is exactly the shard's tasks
    assert len({tuple(e) for e in epochs}) == 3  # a different order every epoch
    unshuffled = [t["task_id"] for p in parts for t in p]
    assert epochs[0] != unshuffled
    # reproducible from the seed, different with another seed
    assert _train_ids(path, cfg(tasks_per_batch=3, shuffle_buffer=8), 7) == ids[:21]
    assert _train_ids(path, cfg(tasks_per_batch=3, shuffle_buffer=8, seed=5), 7) != ids[:21]


def test_training_drops_only_at_the_very_end(sharded):
    """Batches span epoch boundaries: with 21 tasks and T=4, no task is lost between epochs."""
    path, _ = sharded
    ids = _train_ids(path, cfg(tasks_per_batch=4), 21)  # 84 tasks = 4 epochs
    assert Counter(Counter(ids).values()) == Counter({4: 21})


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------
def test_missing_schema(tmp_path):
    with pytest.raises(DataError, match="schema.json"):
        reader.load_schema(str(tmp_path))


def test_wrong_format_version(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks]})
    s = reader.load_schema(path)
    s["format_version"] = 2
    with open(os.path.join(path, fmt.SCHEMA_FILE), "w") as f:
        json.dump(s, f)
    with pytest.raises(DataError, match="format_version 2"):
        reader.load_schema(path)


def test_split_without_files(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks]})
    with pytest.raises(DataError, match="split 'valid'"):
        reader.make_dataset(path, "valid", cfg())


def test_shard_without_tasks(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks, []]})
    reader.make_dataset(path, "train", cfg(), rank=0, size=2)
    with pytest.raises(DataError, match="rank 1 of 2 hold no tasks"):
        reader.make_dataset(path, "train", cfg(), rank=1, size=2)


def test_listed_file_missing(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks, hand_tasks]})
    os.remove(os.path.join(path, "train", fmt.part_name(1, 2)))
    with pytest.raises(DataError, match="part-00001-of-00002"):
        reader.make_dataset(path, "train", cfg())


def test_more_ranks_than_shards(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks]})
    with pytest.raises(DataError, match="--shards"):
        reader.make_dataset(path, "train", cfg(), rank=1, size=2)


def test_missing_column_names_file_and_column(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks]})
    bad = os.path.join(path, "train", fmt.part_name(0, 1))
    write_part(bad, hand_tasks, drop=[fmt.multi_col("query", "tags")])
    with pytest.raises(DataError, match=r"part-00000-of-00001\.parquet.*'query\.multi\.tags'"):
        reader.make_dataset(path, "train", cfg())


def test_schema_disagrees_with_parquet(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks]})
    schema = reader.load_schema(path)
    # one dense feature too many in schema.json
    s2 = dict(schema, dense=schema["dense"] + [{"name": "d3", "mean": 0.0, "std": 1.0}])
    with pytest.raises(DataError, match=r"support\.dense.*3 dense values.*4 dense features"):
        reader.make_dataset(path, "train", cfg(), schema=s2)
    # a categorical feature the file does not have
    s3 = dict(schema, categorical=schema["categorical"] + [{"name": "shop", "cardinality": 3}])
    with pytest.raises(DataError, match="'support.cat.shop' is missing"):
        reader.make_dataset(path, "train", cfg(), schema=s3)
    # a file column schema.json does not know
    s4 = dict(schema, categorical=schema["categorical"][:1])
    with pytest.raises(DataError, match="'support.cat.item' is not described"):
        reader.make_dataset(path, "train", cfg(), schema=s4)


def test_wrong_column_type(tmp_path, hand_tasks):
    path = write_dataset(tmp_path, {"train": [hand_tasks]})
    bad = os.path.join(path, "train", fmt.part_name(0, 1))
    flat = pa.array([[1.0] * len(t["support"]) for t in hand_tasks], pa.list_(pa.float32()))
    write_part(bad, hand_tasks, extra={fmt.multi_col("support", "tags"): flat})
    with pytest.raises(DataError, match="'support.multi.tags'.*list"):
        reader.make_dataset(path, "train", cfg())


def test_decoder_rejects_inconsistent_sample_counts(hand_tasks, tmp_path):
    file = str(tmp_path / "x.parquet")
    bad = pa.array([[1] * (len(t["support"]) + 1) for t in hand_tasks], pa.list_(pa.int64()))
    write_part(file, hand_tasks, extra={fmt.cat_col("support", "user"): bad})
    layout = decode.layout_from_schema(make_schema({}), 5, 3, 4)
    rb = pq.read_table(file).to_batches()[0]
    with pytest.raises(DataError, match=r"x\.parquet.*'support\.cat\.user'.*samples"):
        decode.decode_block(rb, layout, file)


def test_bench_measure_read_rate(sharded):
    from bench.meta_io import measure_read_rate

    path, _ = sharded
    r = measure_read_rate(path, cfg(tasks_per_batch=4), seconds=0.3)
    assert r["batches"] > 0 and r["tasks_per_s"] > 0 and r["samples_per_s"] >= r["tasks_per_s"]
