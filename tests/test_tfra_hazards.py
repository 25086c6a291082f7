"""Regression tests for the TFRA hazards in docs/architecture.md that can be shown in one process.

If a TFRA upgrade changes the private behaviour ``embedding/naming.py`` relies on, these fail first.
(The cross-process ones — PS tables shared by workers, concurrent creation — are in
``test_distributed.py`` with real PS processes.)
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.schema import MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.embedding.naming import local_namespace, shared_table_name
from gmeta_tf.embedding.table import EmbeddingTable
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync

CPU = ["/CPU:0"]


def test_table_resources_are_named_after_the_table_not_a_counter():
    ns = local_namespace()
    t = EmbeddingTable("item", 4, CPU * 2, ns, 0.05, 0)
    names = [tbl._shared_name for tbl in t.variable.tables]
    assert names == [shared_table_name(ns, f"{ns}-item_mht_{i}of2") for i in (1, 2)]


def test_same_name_means_same_table_whatever_the_creation_order():
    """Two 'workers' that create tables in different orders still bind each name to one resource."""
    ns = local_namespace()
    a_item = EmbeddingTable("item", 4, CPU, ns, 0.05, 0)
    EmbeddingTable("extra", 4, CPU, ns, 0.05, 0)
    b_extra = EmbeddingTable("extra", 4, CPU, ns, 0.05, 0)  # the other worker: opposite order
    b_item = EmbeddingTable("item", 4, CPU, ns, 0.05, 0)
    a_item.variable.upsert(tf.constant([7], tf.int64), tf.constant([[1.0, 2.0, 3.0, 4.0]]))
    vals, exists = b_item.lookup_values(np.array([7]))
    assert exists.tolist() == [True] and vals.tolist() == [[1.0, 2.0, 3.0, 4.0]]
    assert b_extra.size() == 0  # …and never through another variable's resource


def test_models_in_one_process_do_not_share_tables_or_optimizer_slots():
    """TFRA keeps slot tables in a process-global store keyed by name: namespaces keep them apart."""
    schema = tiny_schema()
    batch = random_batch(schema, T=3, seed=1)
    steps = []
    for _ in range(2):
        model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[4], top_mlp=[4]), schema)
        d, e = make_optimizers(TrainConfig())
        steps.append((model, e, TrainStep(model, MetaConfig(), d, e, LocalSync())))
    m0, e0, s0 = steps[0]
    s0.step(batch)
    m1, e1, _ = steps[1]
    assert all(t.size() == 0 for t in m1.tables)
    for t in m1.tables:
        assert all(int(s.size()) == 0 for s in t.slot_variables(e1.for_shadow(t.shadow)))
    assert all(int(s.size()) > 0 for s in m0.tables[0].slot_variables(e0.for_shadow(m0.tables[0].shadow)))


def test_one_lookup_per_step_gives_exact_row_gradients():
    """Support and query share ids (and differ in count): gradients must land on the right rows."""
    ns = local_namespace()
    table = EmbeddingTable("item", 3, CPU, ns, 0.05, 0)
    support = tf.constant([[1, 2, 2, -1]], tf.int64)
    query = tf.constant([[2, 5]], tf.int64)
    ids = np.array([1, 2, 5])
    init = np.arange(9, dtype=np.float32).reshape(3, 3) / 10
    table.variable.upsert(tf.constant(ids), tf.constant(init))
    ws, wq = tf.constant([1.0, 2.0, 3.0, 4.0]), tf.constant([5.0, 6.0])
    with tf.GradientTape() as tape:
        looked = table.lookup_unique([support, query])
        e = tf.gather(looked.rows, looked.index)
        w = tf.concat([ws, wq], 0)[:, None] * tf.constant([[1.0, 10.0, 100.0]])
        loss = tf.reduce_sum(e * w)
    grad = tape.gradient(loss, table.shadow)
    got = dict(zip(table.shadow.ids.numpy().tolist(), tf.convert_to_tensor(grad).numpy().tolist()))
    scale = np.array([1.0, 10.0, 100.0])
    expected = {1: 1.0 * scale, 2: (2.0 + 3.0 + 5.0) * scale, 5: 6.0 * scale}  # pad id 4.0 dropped
    assert sorted(got) == [1, 2, 5]
    for k, v in expected.items():
        np.testing.assert_allclose(got[k], v)


def test_every_tables_adam_moments_follow_the_recurrence():
    """m ← β1·m + (1-β1)·g for the rows a step touches, in every table, step after step.

    The optimizer state a checkpoint saves and a restore relies on is only right if every
    table's slots are updated exactly once per step (``embedding/optimizers.py``).
    """
    schema = tiny_schema()
    # TFRA's per-table optimizers (a fused table's slots equal these: tests/test_fused_tables.py)
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[4], top_mlp=[4], fuse_tables=False), schema)
    d, e = make_optimizers(TrainConfig())
    step = TrainStep(model, MetaConfig(adapt="dense+embedding"), d, e, LocalSync())

    def moments(table):
        m, _ = table.slot_variables(e.for_shadow(table.shadow))
        keys, vals = m.export()
        return dict(zip(keys.numpy().tolist(), vals.numpy()))

    for seed in range(3):
        batch = random_batch(schema, T=3, seed=seed)
        before = [moments(t) for t in model.tables]
        _, _, grads = step.gradients(batch)
        ids = [t.shadow.ids.numpy().tolist() for t in model.tables]
        step.step(batch)
        for table, m0, g, keys in zip(model.tables, before, grads, ids):
            m1 = moments(table)
            g = tf.convert_to_tensor(g).numpy()
            for k, row in zip(keys, g):
                expected = 0.9 * m0.get(k, np.zeros(4)) + 0.1 * row
                np.testing.assert_allclose(m1[k], expected, rtol=1e-4, atol=1e-7)


_TFRA_STATE = """
import json, sys
{setup}
from tensorflow_recommenders_addons.dynamic_embedding.python.keras import models
from tensorflow_recommenders_addons.dynamic_embedding.python.ops import tf_save_restore_patch as patch
print(json.dumps({{"keras3": "keras" in sys.modules, "sklearn": "sklearn" in sys.modules,
                  "patch": repr(patch.keras_saved_model_save), "models": repr(models.keras_saved_model_save),
                  "de": hasattr(sys.modules["tensorflow_recommenders_addons"], "dynamic_embedding")}}))
"""


def _tfra_state(setup: str) -> dict:
    r = subprocess.run([sys.executable, "-c", _TFRA_STATE.format(setup=setup)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.integration  # two fresh Python processes import TensorFlow and TFRA (~10 s): not the unit loop
def test_tfra_is_imported_without_keras3_and_ends_in_the_same_state():
    """TFRA 0.8.1 looks for the Keras 2 module ``keras.saving.saved_model``; Keras 3 has none, so a
    plain import loads all of Keras 3 (and scikit-learn) to fail (1.1 s of CPU in each PS and rank).
    Through gmeta_tf/embedding/tfra.py the same lookup fails at once: TFRA's patches end the same
    (none applied), and Keras 3 is never imported."""
    plain = _tfra_state("import gmeta_tf\nimport tensorflow_recommenders_addons.dynamic_embedding")
    ours = _tfra_state("from gmeta_tf.embedding.tfra import de")
    assert plain["keras3"] and plain["sklearn"], plain  # the hazard: still there in TFRA 0.8.1?
    assert not ours["keras3"] and not ours["sklearn"], ours
    assert ours["patch"] == plain["patch"] == "None" and ours["models"] == plain["models"] == "None"
    assert ours["de"] and plain["de"]
