"""``model.init_rows: missing``: find first, draw deterministic initial rows for the missing ids only."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.loader import config_from_dict
from gmeta_tf.config.schema import ConfigError, MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.embedding.initial_rows import initial_rows, table_key
from gmeta_tf.embedding.naming import local_namespace
from gmeta_tf.embedding.optimizers import TableOptimizers
from gmeta_tf.embedding.table import EmbeddingTable
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync

CPU = ["/CPU:0"]


def _table(mode="missing", devices=CPU, seed=3, name="item", dim=4):
    return EmbeddingTable(name, dim, devices, local_namespace("init"), 0.05, seed=seed, init_rows=mode)


def _rows(table, ids):
    looked = table.lookup_unique([tf.constant(ids, tf.int64)])
    return tf.gather(looked.rows, looked.index).numpy()


def test_existing_rows_are_untouched_and_missing_ids_get_their_initial_row():
    table = _table(devices=CPU * 2)
    held = np.array([1, 2, 7], np.int64)
    vals = np.arange(12, dtype=np.float32).reshape(3, 4)
    table.variable.upsert(tf.constant(held), tf.constant(vals))
    ids = [7, 100, 1, 55, 2, 100]
    got = _rows(table, ids)
    np.testing.assert_array_equal(got[[2, 4, 0]], vals)  # 1, 2, 7: exactly as stored
    want = initial_rows(tf.constant([100, 55], tf.int64), table.row_key, 4, 0.05).numpy()
    np.testing.assert_array_equal(got[[1, 3]], want)
    np.testing.assert_array_equal(got[5], got[1])
    # a lookup inserts nothing, and the stored rows did not move
    assert table.size() == 3
    stored, exists = table.lookup_values(held)
    assert exists.all()
    np.testing.assert_array_equal(stored, vals)


def test_initial_rows_are_a_function_of_table_and_id():
    ids = [5, -3 + 2**40, 11, 12]
    a = _rows(_table(), ids)
    b = _rows(_table(), ids[::-1])[::-1]  # another table object, another namespace, another order
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, _rows(_table(seed=4), ids))  # another table's key: other rows
    assert not np.allclose(a, _rows(_table(name="user"), ids))
    assert len({tuple(r) for r in a}) == len(ids)


def test_initial_rows_are_the_same_in_another_process(tmp_path):
    ids = [3, 9, 2**33 + 1]
    here = _rows(_table(), ids)
    code = textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        from gmeta_tf.embedding.naming import local_namespace
        from gmeta_tf.embedding.table import EmbeddingTable
        t = EmbeddingTable("item", 4, ["/CPU:0"], local_namespace("other"), 0.05, seed=3)
        looked = t.lookup_unique([tf.constant({ids!r}, tf.int64)])
        np.save({str(tmp_path / "rows.npy")!r}, tf.gather(looked.rows, looked.index).numpy())
    """)
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, check=True)
    there = np.load(tmp_path / "rows.npy")
    np.testing.assert_array_equal(here, there)


def test_initial_rows_are_normal_with_the_tables_stddev():
    rows = initial_rows(tf.range(20000, dtype=tf.int64), table_key("x", 0), 16, 0.05).numpy()
    assert abs(rows.mean()) < 0.002
    assert abs(rows.std() - 0.05) < 0.002
    # neither rows nor columns are correlated
    assert abs(np.corrcoef(rows[:, 0], rows[:, 1])[0, 1]) < 0.03
    assert abs(np.corrcoef(rows[:-1, 0], rows[1:, 0])[0, 1]) < 0.03


def test_all_keeps_tfras_initializer():
    table = _table("all")
    assert table.variable.initializer is not None
    assert type(_table("missing").variable.initializer).__name__ == "Zeros"  # filled on the PS, no draw
    got = _rows(table, [4, 5])
    assert got.std() > 0  # random rows, drawn by TFRA
    with pytest.raises(ValueError, match="init_rows"):
        _table("some")


def test_apply_inserts_the_rows_the_lookup_gave():
    """The optimizer's apply upserts initial row - lr * grad: the row the step trained on."""
    table = _table()
    opt = TableOptimizers("adagrad", 0.1)
    opt.build({table.name: table.shadow})
    ids = tf.constant([8, 9], tf.int64)
    with tf.GradientTape() as tape:
        looked = table.lookup_unique([ids])
        loss = tf.reduce_sum(looked.rows * 0.0)
    grads = tape.gradient(loss, [table.shadow])
    before = initial_rows(ids, table.row_key, 4, 0.05).numpy()
    opt.apply_gradients(zip(grads, [table.shadow]))
    stored, exists = table.lookup_values(ids.numpy())
    assert exists.all()
    np.testing.assert_allclose(stored, before, atol=1e-7)


def _train(mode, steps=12):
    schema = tiny_schema("click")
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, init_rows=mode), schema)
    meta = MetaConfig(algo="maml", inner_steps=1, inner_lr=0.1, adapt="top")
    train = TrainConfig(learning_rate=0.02, embedding_learning_rate=0.05)
    step = TrainStep(model, meta, *make_optimizers(train), LocalSync())
    batch = random_batch(schema, T=4, S=5, Q=3, seed=0)
    losses = [float(step.step(batch)["loss"]) for _ in range(steps)]
    return losses


def test_training_still_reduces_the_loss():
    losses = _train("missing")
    assert losses[-1] < losses[0]


def test_config_key_is_validated():
    cfg = config_from_dict({"model": {"init_rows": "all"}})
    assert cfg.model.init_rows == "all"
    assert config_from_dict({}).model.init_rows == "missing"
    with pytest.raises(ConfigError, match="model.init_rows"):
        config_from_dict({"model": {"init_rows": "some"}})
    with pytest.raises(ConfigError, match="model.init_rows"):
        ModelConfig(init_rows="none")
