"""``model.fuse_tables`` (embedding/fused.py, fused_keys.py): the tables that share a placement
and a row width are one TFRA table, and training, checkpoints and the hot split are exactly
what one table per feature gives."""
import csv
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.loader import config_from_dict
from gmeta_tf.config.schema import ConfigError, MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.data.task_format import RARE_ID, hash_strings
from gmeta_tf.embedding.fused import FusedMember, FusedTable
from gmeta_tf.embedding.fused_keys import KeyCodec, collisions, expected_collisions, slot_bits
from gmeta_tf.embedding.hot.rows import HotRows
from gmeta_tf.embedding.hot.select import HotSet
from gmeta_tf.embedding.lookup import feature_ids, together
from gmeta_tf.embedding.table_files import read_table
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.checkpoint import CheckpointManager
from gmeta_tf.train.dense_sync import LocalSync

ROOT = Path(__file__).resolve().parents[1]
MOVIES = ROOT / "examples" / "movielens" / "data" / "ml-latest-small" / "movies.csv"

# item and tags take 63-bit ids (most beyond the id field: the ids record decodes them), city small ones
_BIG = np.random.default_rng(7).integers(1 << 40, (1 << 63) - 1, size=64, dtype=np.int64)
_BIG[3] = RARE_ID


def _big_ids(batch):
    def big(x):
        return tf.where(x >= 0, tf.gather(tf.constant(_BIG), tf.maximum(x, 0)), x)

    for w in ("support", "query"):
        batch[w]["cat"] = {k: big(v) if k == "item" else v for k, v in batch[w]["cat"].items()}
        batch[w]["multi"] = {k: big(v) for k, v in batch[w]["multi"].items()}
    return batch


SCHEMA = tiny_schema("click")
BATCHES = [_big_ids(random_batch(SCHEMA, T=4, S=5, Q=3, seed=s)) for s in range(3)]


def _setup(fuse, mode="per_table", algo="maml", adapt="top", opt="adam", bp_v2=False):
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, ps_requests=mode, fuse_tables=fuse),
                 SCHEMA, bp_v2=bp_v2)
    dense_opt, emb_opt = make_optimizers(TrainConfig(learning_rate=0.02, embedding_learning_rate=0.05,
                                                     embedding_optimizer=opt))
    return model, dense_opt, emb_opt, MetaConfig(algo=algo, inner_steps=1, inner_lr=0.1, adapt=adapt)


def _train(fuse, mode="per_table", algo="maml", adapt="top", opt="adam", bp_v2=False, steps=5, hot=None):
    model, dense_opt, emb_opt, meta = _setup(fuse, mode, algo, adapt, opt, bp_v2)
    rows = None
    if hot is not None:
        rows = model.embeddings.use_hot(HotRows(model.tables, hot, LocalSync(), opt, 0.05,
                                                {"item": 100, "city": 100, "tags": 300}))
    step = TrainStep(model, meta, dense_opt, emb_opt, LocalSync())
    if rows is not None:
        rows.load(emb_opt)
    # batches 0, 1, 2, 0, 1: later steps find rows (and slots) that earlier steps inserted
    losses = [float(step.step(BATCHES[i % 3])["loss"]) for i in range(steps)]
    if rows is not None:
        rows.write_back(emb_opt)
    return losses, model


def _state(model) -> dict:
    """Every logical table's and slot table's rows (the checkpoint's files), by id, and the
    step counters."""
    out = {}
    for key, keys, values in model.embeddings.rows():
        order = np.argsort(keys)
        out[key] = (keys[order], values[order])
    out["steps"] = {k: int(v.numpy()) for k, v in model.embeddings.step_counters().items()}
    return out


def _assert_same(a: dict, b: dict, atol=1e-6, extra=None):
    """``a`` (with, by table, the ``extra`` ids a hot tier wrote back untrained) equals ``b``."""
    assert a.keys() == b.keys()
    assert a["steps"] == b["steps"]
    for key in a:
        if key != "steps":
            more = (extra or {}).get(key.split(".")[0], np.zeros(0, np.int64))
            np.testing.assert_array_equal(a[key][0], np.union1d(b[key][0], more), err_msg=key)
            assert len(b[key][0]) > 0, key
            keep = np.isin(a[key][0], b[key][0])
            np.testing.assert_allclose(a[key][1][keep], b[key][1], atol=atol, rtol=0, err_msg=key)


@lru_cache(maxsize=None)
def _per_table(algo, adapt, opt, bp_v2):
    losses, model = _train(False, "per_table", algo, adapt, opt, bp_v2)
    return losses, _state(model)


# -- the key codec ---------------------------------------------------------------------------

@pytest.mark.fast
def test_slot_bits_and_the_mask_width_equals_the_shift():
    """An id with every bit set stays out of the slot field (Monolith's extract_fid masks 49 bits
    before OR-ing slot << 48); keys stay non-negative; small ids are kept as they are."""
    assert [slot_bits(n) for n in (1, 2, 3, 4, 5, 7, 8, 9, 28, 256)] == [1, 1, 2, 2, 3, 3, 3, 4, 5, 8]
    codec = KeyCodec(7)
    assert codec.p == 60
    ids = np.array([0, 1, 12345, (1 << 60) - 1, 1 << 60, RARE_ID, (1 << 62) + 5], np.int64)
    for slot in range(7):
        keys = codec.encode_np(slot, ids)
        assert (keys >= 0).all() and (codec.slots(keys) == slot).all()
        assert (keys[:4] & codec.mask == ids[:4]).all()  # below 2^P: the id itself
        np.testing.assert_array_equal(codec.encode(slot, tf.constant(ids)).numpy(), keys)  # TF == numpy
    with pytest.raises(ValueError):
        codec.encode(7, tf.constant([1], tf.int64))


@pytest.mark.fast
def test_keys_decode_to_logical_ids_through_the_record_and_shards_follow_the_id():
    codec = KeyCodec(3)
    ids = np.array([5, 77, RARE_ID, 1 << 61, 123456789012345], np.int64)
    keys = codec.encode_np(2, ids)
    large = ids > codec.mask
    slots, got = codec.decode(keys, keys[large], ids[large])
    assert (slots == 2).all() and (got == ids).all()
    # Without the record a large id is not recoverable (its high bits are not in the key).
    assert (codec.decode(keys, keys[:0], ids[:0])[1][large] != ids[large]).all()
    # Keys of ids below 2^P go to the shard TFRA's default partitioner gives the plain id.
    for n in (2, 3, 5):
        np.testing.assert_array_equal(codec.partition_fn(tf.constant(keys[~large]), n).numpy(), ids[~large] % n)


@pytest.mark.fast
def test_collision_rate_measured_on_movielens_and_63_bit_ids():
    """The fused key keeps every MovieLens id apart, as integers and hashed as strings, and
    10^6 uniform 63-bit ids at P = 60; at P = 32 the measured count is the birthday bound's."""
    with open(MOVIES, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    movie_ids = np.array([int(r["movieId"]) for r in rows], np.int64)
    genres = sorted({g for r in rows for g in r["genres"].split("|")})
    codec = KeyCodec(3)  # the example's tables: movie_id, year, genres
    assert len(movie_ids) == 9742
    assert collisions(movie_ids, codec) == 0
    assert collisions(hash_strings([r["movieId"] for r in rows]), codec) == 0
    assert collisions(hash_strings([r["title"] for r in rows]), codec) == 0
    assert collisions(hash_strings(genres), codec) == 0
    rng = np.random.default_rng(0)
    ids = np.unique(rng.integers(0, (1 << 63) - 1, size=1_000_000, dtype=np.int64))
    assert collisions(ids, KeyCodec(7)) == 0  # expected 4e-7
    narrow = KeyCodec(7, id_bits=32)
    expected = expected_collisions(len(ids), 32)  # ~116 pairs
    got = collisions(ids, narrow)
    assert abs(got - expected) < 4 * np.sqrt(expected), (got, expected)


@pytest.mark.fast
def test_only_tables_placed_alike_fuse():
    """The planner's placement stays: tables fuse only with tables on the same PS list (and dim);
    column-split, bounded (max_rows) and init_rows: all tables never fuse."""
    from gmeta_tf.embedding.devices import table_devices
    from gmeta_tf.embedding.fused import group_key, groups

    placement = {"item_id": [0, 1], "user_city": [1], "hour": [1], "item_category": [0], "user_segment": [0],
                 "device": None, "bounded": [0]}
    names = list(placement)
    keys = [group_key(table_devices(2, placement[n]), 16, n == "bounded", "missing") for n in names]
    assert sorted(sorted(names[i] for i in g) for g in groups(keys)) == [
        ["device", "item_id"], ["hour", "user_city"], ["item_category", "user_segment"]]
    assert group_key(table_devices(2, [0]), 16, False, "all") is None
    assert groups([group_key(table_devices(2, [0]), d, False, "missing") for d in (8, 16)]) == []


@pytest.mark.fast
def test_config_key_is_validated():
    assert config_from_dict({}).model.fuse_tables == "auto"
    assert config_from_dict({"model": {"fuse_tables": False}}).model.fuse_tables is False
    with pytest.raises(ConfigError, match="model.fuse_tables"):
        config_from_dict({"model": {"fuse_tables": "sometimes"}})


# -- training --------------------------------------------------------------------------------

# Each case traces and trains two models; the second-order one (20 s on 2 cores) runs in the
# integration tier, the first-order one stays in the unit tier.
@pytest.mark.parametrize("algo,adapt,opt,bp_v2", [
    pytest.param("maml", "top", "adam", True, marks=pytest.mark.integration),  # distributed mode's tables: the apply adds deltas
    ("fomaml", "dense+embedding", "adagrad", False),
    pytest.param("erm", "top", "adam", False, marks=pytest.mark.integration),
])
def test_fused_trains_exactly_as_per_table(algo, adapt, opt, bp_v2):
    """Losses to 1e-6 and every logical row, slot and step counter equal, on TFRA's path and
    with one request per PS; item and tags hold 63-bit ids (decoded through the ids record)."""
    per_table, state = _per_table(algo, adapt, opt, bp_v2)
    for mode in ("per_table", "per_ps"):
        fused, model = _train(True, mode, algo, adapt, opt, bp_v2)
        (table,) = model.storage_tables()
        assert isinstance(table, FusedTable) and [m.name for m in table.members] == ["item", "city", "tags"]
        assert all(isinstance(t, FusedMember) for t in model.tables)
        assert (model.embeddings.requests is not None) == (mode == "per_ps")
        np.testing.assert_allclose(fused, per_table, rtol=1e-6)
        assert fused[3] < fused[0]  # batch 0 again, after training on it
        got = _state(model)
        _assert_same(got, state)
        assert got["steps"] == {"item": 5, "city": 5, "tags": 5}
        assert (got["item"][0] > table.codec.mask).sum() > 10  # large ids, decoded


@pytest.mark.integration  # traces steps of 7 and 14 tables (20 s on 2 cores)
def test_hash_ops_per_step_do_not_grow_with_the_tables():
    """A fused step runs the same hash-table ops for 3 tables as for 6; per table they grow."""
    def ops(n, fuse):
        schema = tiny_schema("click")
        schema["categorical"] = [{"name": f"c{i}", "cardinality": 20} for i in range(n)]
        schema["multi_hot"] = []
        dense_opt, emb_opt = make_optimizers(TrainConfig())
        model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], fuse_tables=fuse), schema)
        step = TrainStep(model, MetaConfig(algo="erm"), dense_opt, emb_opt, LocalSync())
        graph = step._compiled.get_concrete_function(random_batch(schema, T=2, S=3, Q=2)).graph
        return sum(1 for op in graph.get_operations() if op.type.startswith("TFRA>"))

    assert ops(3, True) == ops(6, True)
    assert ops(6, False) > ops(3, False) > ops(3, True)


# -- checkpoints -----------------------------------------------------------------------------

@pytest.mark.integration  # trains, saves and resumes across the switch (20 s on 2 cores)
def test_checkpoints_are_the_same_files_and_a_run_resumes_across_the_switch(tmp_path):
    """Fused and per-table runs write the same files (what export reads: checkpoint_reader goes
    through ``table_files.read_table``), and each restores into the other and trains on alike."""
    ckpts = {}
    for fuse in (False, True):
        model, dense_opt, emb_opt, meta = _setup(fuse)
        step = TrainStep(model, meta, dense_opt, emb_opt, LocalSync())
        for i in range(3):
            step.step(BATCHES[i])
        ckpts[fuse] = CheckpointManager(tmp_path / f"fused-{fuse}", model, dense_opt, emb_opt, log=lambda m: None).save(3)
    files = {f: sorted(p.name for p in Path(c, "tables").iterdir()) for f, c in ckpts.items()}
    assert files[True] == files[False] == sorted(f"{t}{s}.npz" for t in ("item", "city", "tags") for s in ("", ".m", ".v"))
    for name in [n[: -len(".npz")] for n in files[True]]:
        (k1, v1), (k2, v2) = read_table(ckpts[False], name), read_table(ckpts[True], name)
        o1, o2 = np.argsort(k1), np.argsort(k2)
        np.testing.assert_array_equal(k1[o1], k2[o2])
        np.testing.assert_allclose(v1[o1], v2[o2], atol=1e-6, err_msg=name)
    resumed = {}
    for src, fuse in ((False, True), (True, False)):
        model, dense_opt, emb_opt, meta = _setup(fuse)
        step = TrainStep(model, meta, dense_opt, emb_opt, LocalSync())
        assert CheckpointManager(Path(ckpts[src]).parent, model, dense_opt, emb_opt, log=lambda m: None).restore() == 3
        losses = [float(step.step(BATCHES[i])["loss"]) for i in (0, 1)]
        resumed[fuse] = (losses, _state(model))
    np.testing.assert_allclose(resumed[True][0], resumed[False][0], rtol=1e-6)
    _assert_same(resumed[True][1], resumed[False][1])
    assert resumed[True][1]["steps"] == {"item": 5, "city": 5, "tags": 5}


# -- the hot/cold split ----------------------------------------------------------------------

def _hot_set(local_only_all: bool) -> HotSet:
    if local_only_all:  # every id of every table hot: no table sends anything
        ids = {"item": np.concatenate([np.arange(50), _BIG]).astype(np.int64), "city": np.arange(5, dtype=np.int64),
               "tags": _BIG[:20].copy()}
        return HotSet(ids, {k: 0 for k in ids}, {k: 1 for k in ids}, 0, 1, local_only={k: True for k in ids})
    # item: half its ids hot; city: every id (local only: no PS work); tags: none (plain)
    ids = {"item": _BIG[::2].copy(), "city": np.arange(5, dtype=np.int64), "tags": np.zeros(0, np.int64)}
    return HotSet(ids, {k: 0 for k in ids}, {k: 1 for k in ids}, 0, 1, local_only={"city": True})


@pytest.mark.parametrize("local_only_all", [False, True])
def test_hot_rows_stay_local_and_cold_rows_go_with_the_fused_table(local_only_all):
    """Hot rows train on the worker, every cold row goes through the fused table's one lookup
    (and one PS request), a table whose rows are all local sends nothing, and the result is the
    plain per-table step's: same losses, rows, slots and step counters."""
    per_table, state = _per_table("maml", "top", "adam", True)
    hot = _hot_set(local_only_all)
    for mode in ("per_table", "per_ps"):
        model, dense_opt, emb_opt, meta = _setup(True, mode, bp_v2=True)
        rows = model.embeddings.use_hot(HotRows(model.tables, hot, LocalSync(), "adam", 0.05,
                                                {"item": 100, "city": 100, "tags": 300}))
        step = TrainStep(model, meta, dense_opt, emb_opt, LocalSync())
        rows.load(emb_opt)
        assert not rows.prefetched  # cold rows are read with the fused table's, not one step ahead
        ids = [x[:2] for x in feature_ids(BATCHES[0], model.cat_names, model.multi_names)]
        joined = together(model.tables, ids, True, model.embeddings.requests)
        assert sorted(joined) == ([] if local_only_all else [0, 2])  # city (1) sends nothing
        assert len(step.shadows) == (0 if local_only_all else 1)
        losses = [float(step.step(BATCHES[i % 3])["loss"]) for i in range(5)]
        rows.write_back(emb_opt)
        np.testing.assert_allclose(losses, per_table, rtol=1e-5)
        got = _state(model)
        assert got["steps"] == {"item": 5, "city": 5, "tags": 5}  # the one shared counter, once a step
        _assert_same(got, state, atol=1e-5, extra=hot.ids)  # hot ids never in a batch are written back too
