"""Column-split tables: exactly the whole table's lookups and gradients, trained and checkpointed."""
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.schema import MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.embedding.column_split import ColumnSplitTable
from gmeta_tf.embedding.naming import local_namespace
from gmeta_tf.embedding.table import EmbeddingTable
from gmeta_tf.errors import UserError
from gmeta_tf.meta.meta_step import TrainStep, maml_loss
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.plan.placement_file import ColumnSplit
from gmeta_tf.train.checkpoint import CheckpointManager
from gmeta_tf.train.dense_sync import LocalSync

D = 8
MODEL = ModelConfig(embedding_dim=D, bottom_mlp=[6], top_mlp=[8], seed=1)
SPLIT = {"item": ColumnSplit([[0], [1]]), "tags": ColumnSplit([[0], [1], [0], [1]])}


def _fill(model, batch, seed=0):
    """The same values for every id in both models: a split table gets its column slices."""
    for table, name in zip(model.tables, model.table_names):
        part = "cat" if name in model.cat_names else "multi"
        ids = np.unique(np.concatenate([batch[w][part][name].numpy().ravel() for w in ("support", "query")]))
        ids = ids[ids >= 0]
        vals = np.random.default_rng(seed + len(ids)).normal(scale=0.3, size=(len(ids), D)).astype(np.float32)
        blocks = table.parts if isinstance(table, ColumnSplitTable) else [table]
        w = D // len(blocks)
        for i, b in enumerate(blocks):
            b.variable.upsert(tf.constant(ids), tf.constant(vals[:, i * w:(i + 1) * w]))


def test_halves_look_up_exactly_the_whole_table():
    ns = local_namespace("colsplit")
    whole = EmbeddingTable("emb", D, ["/CPU:0"], ns, 0.05, seed=0)
    split = ColumnSplitTable("emb", D, [[0], [1]], 0, ns, 0.05, seed=0)
    assert [p.name for p in split.parts] == ["emb.c0of2", "emb.c1of2"] and all(p.dim == D // 2 for p in split.parts)
    keys = np.arange(0, 40, 3, dtype=np.int64)
    vals = np.random.default_rng(0).normal(size=(len(keys), D)).astype(np.float32)
    whole.variable.upsert(tf.constant(keys), tf.constant(vals))
    for i, p in enumerate(split.parts):
        p.variable.upsert(tf.constant(keys), tf.constant(vals[:, i * 4:(i + 1) * 4]))
    s_ids = tf.constant([[0, 3, -1], [9, 9, 39]], tf.int64)
    q_ids = tf.constant([[[3, 6], [-1, -1]]], tf.int64)
    for trainable in (False, True):
        a = whole.lookup_unique([s_ids, q_ids], trainable=trainable)
        b = split.lookup_unique([s_ids, q_ids], trainable=trainable)
        np.testing.assert_array_equal(a.index.numpy(), b.index.numpy())
        np.testing.assert_array_equal(a.rows.numpy(), b.rows.numpy())
        assert np.all(b.rows.numpy()[b.index.numpy()[2]] == 0)  # the pad id (-1) gets a zero row
        np.testing.assert_array_equal(b.rows.numpy()[b.index.numpy()[0]], vals[0])  # id 0


def test_model_with_split_tables_has_the_same_loss_and_gradients():
    schema = tiny_schema("click")
    batch = random_batch(schema, T=4, seed=3, pad_tasks=1)
    model = replace(MODEL, fuse_tables=False)  # gradients per TFRA table, whole against blocks
    m_whole, m_split = DLRM(model, schema), DLRM(model, schema, placement=SPLIT)
    assert [t.name for t in m_split.storage_tables()] == [
        "item.c0of2", "item.c1of2", "city", "tags.c0of4", "tags.c1of4", "tags.c2of4", "tags.c3of4"]
    for m in (m_whole, m_split):
        _fill(m, batch)
    for name, var in m_whole.dense_variables.items():
        np.testing.assert_array_equal(var.numpy(), m_split.dense_variables[name].numpy())
    meta = MetaConfig(algo="maml", inner_steps=1, inner_lr=0.3, adapt="dense+embedding")
    out = []
    for m in (m_whole, m_split):
        vs = list(m.dense_variables.values()) + m.trainable_shadows()
        with tf.GradientTape() as tape:
            loss = maml_loss(m, meta, batch)
        grads = tape.gradient(loss, vs, unconnected_gradients="zero")
        out.append((float(loss), [tf.convert_to_tensor(g).numpy() for g in grads], m))
    (l_w, g_w, _), (l_s, g_s, _) = out
    assert l_w == pytest.approx(l_s, rel=1e-6)
    n_dense = len(m_whole.dense_variables)
    for a, b in zip(g_w[:n_dense], g_s[:n_dense]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    emb_w = dict(zip([t.name for t in m_whole.storage_tables()], g_w[n_dense:]))
    emb_s = dict(zip([t.name for t in m_split.storage_tables()], g_s[n_dense:]))
    np.testing.assert_allclose(emb_w["item"], np.concatenate([emb_s["item.c0of2"], emb_s["item.c1of2"]], axis=1),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(emb_w["tags"], np.concatenate([emb_s[f"tags.c{i}of4"] for i in range(4)], axis=1),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(emb_w["city"], emb_s["city"], rtol=1e-5, atol=1e-6)
    assert np.abs(emb_s["item.c1of2"]).sum() > 0  # gradients reach every block


def test_split_tables_train_and_checkpoint_every_block_and_slot(tmp_path):
    schema = tiny_schema("click")
    batches = [random_batch(schema, T=4, seed=s) for s in range(3)]

    def setup():
        model = DLRM(MODEL, schema, placement=SPLIT)
        dense_opt, emb_opt = make_optimizers(TrainConfig())
        step = TrainStep(model, MetaConfig(algo="maml", adapt="dense+embedding"), dense_opt, emb_opt, LocalSync())
        return model, step, CheckpointManager(tmp_path / "ck", model, dense_opt, emb_opt)

    model, step, ckpt = setup()
    for b in batches:
        step.step(b)
    sizes = {t.name: t.size() for t in model.storage_tables()}
    assert all(v > 0 for v in sizes.values()), sizes
    assert sizes["item.c0of2"] == sizes["item.c1of2"]
    path = ckpt.save(3)
    rows = json.loads(Path(path, "meta.json").read_text())["rows"]
    for block in ("item.c0of2", "item.c1of2", "tags.c3of4"):
        assert rows[block] == sizes[block] and rows[f"{block}.m"] == sizes[block] and rows[f"{block}.v"] == sizes[block]

    model2, _, ckpt2 = setup()
    assert ckpt2.restore() == 3
    for a, b in zip(model.storage_tables(), model2.storage_tables()):
        k1, v1 = a.export()
        k2, v2 = b.export()
        o1, o2 = np.argsort(k1), np.argsort(k2)
        np.testing.assert_array_equal(k1[o1], k2[o2])
        np.testing.assert_array_equal(v1[o1], v2[o2])


def test_dim_not_divisible_is_a_clear_error():
    with pytest.raises(UserError, match="'item' has dim 8, which cannot be cut into 3"):
        DLRM(MODEL, tiny_schema("click"), placement={"item": ColumnSplit([[0], [1], [0]])})


def test_restore_re_cuts_tables_saved_under_another_split(tmp_path):
    """Whole <-> blocks, and 2 -> 4 blocks: a re-planned run and evaluation read the checkpoint."""
    schema = tiny_schema("click")
    batches = [random_batch(schema, T=4, seed=s) for s in range(2)]

    def setup(placement):
        model = DLRM(MODEL, schema, placement=placement)
        dense_opt, emb_opt = make_optimizers(TrainConfig())
        step = TrainStep(model, MetaConfig(algo="fomaml"), dense_opt, emb_opt, LocalSync())
        return model, step, emb_opt, CheckpointManager(tmp_path / "ck", model, dense_opt, emb_opt)

    model, step, _, ckpt = setup(SPLIT)
    for b in batches:
        step.step(b)
    ckpt.save(2)
    ids = [batches[0]["support"]["cat"]["item"], batches[1]["query"]["multi"]["tags"]]

    def rows(m, name):
        t = m.tables[m.table_names.index(name)]
        x = t.lookup_unique([i for i in ids], trainable=False)
        return tf.gather(x.rows, x.index).numpy()

    for placement in (None, {"item": ColumnSplit([[0], [1], [0], [1]]), "tags": ColumnSplit([[0], [1]])}):
        other, _, emb_opt, ck = setup(placement)
        assert ck.restore() == 2
        counters = {k: int(v.numpy()) for k, v in emb_opt.iterations().items()}
        assert set(counters.values()) == {2}, counters  # Adam's step count, every block included
        for name in ("item", "tags", "city"):
            np.testing.assert_array_equal(rows(other, name), rows(model, name))
            assert np.abs(rows(other, name)).sum() > 0
        if placement is None:  # Adam's moments were joined too
            whole = other.tables[other.table_names.index("item")]
            m_slot = whole.slot_variables(emb_opt.for_shadow(whole.shadow))[0]
            k, v = m_slot.export()
            keys, vals = k.numpy(), v.numpy()
            blocks = model.tables[model.table_names.index("item")].parts
            for i, b in enumerate(blocks):
                bk, bv = b.slot_variables(step.emb_opt.for_shadow(b.shadow))[0].export()
                o1, o2 = np.argsort(keys), np.argsort(bk.numpy())
                np.testing.assert_array_equal(vals[o1][:, i * 4:(i + 1) * 4], bv.numpy()[o2])


def test_placement_naming_an_unknown_table_is_refused():
    from gmeta_tf.errors import ClusterError

    with pytest.raises(ClusterError, match=r"names table\(s\) \['itme'\] that the data does not have"):
        DLRM(MODEL, tiny_schema("click"), placement={"itme": [0]})
