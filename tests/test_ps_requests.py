"""``model.ps_requests: per_ps`` (embedding/ps_requests.py): one request per PS is the same step
as TFRA's per-table lookups and applies, table for table, shard for shard, slot for slot."""
import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.loader import config_from_dict
from gmeta_tf.config.schema import ConfigError, MetaConfig, ModelConfig, TrainConfig
from gmeta_tf.embedding.collection import Embeddings
from gmeta_tf.embedding.naming import local_namespace
from gmeta_tf.embedding.optimizers import TableOptimizers
from gmeta_tf.embedding.ps_requests import PsRequests, UnmatchedApplyError, resolve
from gmeta_tf.embedding.table import EmbeddingTable
from gmeta_tf.embedding.table_files import export_variable
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync

pytestmark = pytest.mark.fast


def _state(embeddings) -> dict:
    """Every table's and slot table's rows, sorted by id, and the step counters."""
    out = {}
    for key, var in embeddings._files().items():
        keys, values = export_variable(var)
        order = np.argsort(keys)
        out[key] = (keys[order], values[order])
    out["steps"] = {k: int(v.numpy()) for k, v in embeddings.step_counters().items()}
    return out


def _assert_same(a: dict, b: dict, atol=1e-6):
    assert a.keys() == b.keys()
    assert a.pop("steps") == b.pop("steps")
    for key in a:
        np.testing.assert_array_equal(a[key][0], b[key][0], err_msg=key)
        assert len(a[key][0]) > 0, key
        np.testing.assert_allclose(a[key][1], b[key][1], atol=atol, rtol=1e-5, err_msg=key)


def _train(mode, algo, adapt, opt, bp_v2, steps=5):
    schema = tiny_schema("click")
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, ps_requests=mode,
                             fuse_tables=False), schema, bp_v2=bp_v2)  # fused: tests/test_fused_tables.py
    meta = MetaConfig(algo=algo, inner_steps=1, inner_lr=0.1, adapt=adapt)
    train = TrainConfig(learning_rate=0.02, embedding_learning_rate=0.05, embedding_optimizer=opt)
    step = TrainStep(model, meta, *make_optimizers(train), LocalSync())
    # batches 0, 1, 2, 0, 1: later steps find rows (and slots) that earlier steps inserted
    losses = [float(step.step(random_batch(schema, T=4, S=5, Q=3, seed=i % 3))["loss"]) for i in range(steps)]
    return losses, model


@pytest.mark.parametrize("algo,adapt,opt,bp_v2", [
    ("maml", "top", "adam", False),
    ("maml", "top", "adam", True),  # distributed mode's tables: the apply adds deltas
    ("fomaml", "dense+embedding", "adam", False),
    ("erm", "top", "adagrad", True),
])
def test_per_ps_trains_exactly_as_per_table(algo, adapt, opt, bp_v2):
    per_table, m1 = _train("per_table", algo, adapt, opt, bp_v2)
    per_ps, m2 = _train("per_ps", algo, adapt, opt, bp_v2)
    assert m1.embeddings.requests is None
    assert [t.name for t in m2.embeddings.requests.tables] == m2.table_names  # every table went per PS
    np.testing.assert_allclose(per_ps, per_table, rtol=1e-6)
    assert per_ps[3] < per_ps[0]  # batch 0 again, after training on it
    _assert_same(_state(m1.embeddings), _state(m2.embeddings))


def _embeddings(mode, ns):
    """Two tables of other widths, each cut into 3 shards on one device: three (table, shard)
    members per request, two requests (one per width)."""
    tables = [EmbeddingTable(name, dim, ["/CPU:0"] * 3, ns, 0.05, seed=i, bp_v2=True)
              for i, (name, dim) in enumerate([("a", 4), ("b", 2)])]
    emb = Embeddings(tables, ["a", "b"], [], ps_requests=mode)
    emb.build_slots(TableOptimizers("adam", 0.1))
    return emb


def _sharded_steps(emb, batches):
    weights = [tf.constant(np.linspace(-1, 1, d * 3), tf.float32)[:d] for d in (4, 2)]

    @tf.function
    def step(batch):
        rows = emb.trainable()
        with tf.GradientTape() as tape:
            sparse = emb.lookup(batch, trainable=True, per_task=False)
            loss = tf.add_n([tf.reduce_sum(tf.square(tf.gather(f.rows, f.support_pos) @ w[:, None] - 1.0))
                             for f, w in zip(sparse.features, weights)])
        emb.apply(rows, tape.gradient(loss, rows.shadows))
        return loss

    return [float(step(b)) for b in batches]


def test_sharded_tables_of_two_widths_train_alike():
    rng = np.random.default_rng(0)

    def batch():
        ids = {n: tf.constant(rng.integers(-1, 40, size=(3, 6)), tf.int64) for n in "ab"}  # -1: pad
        return {"support": {"cat": ids, "multi": {}}, "query": {"cat": ids, "multi": {}}}

    batches = [batch() for _ in range(4)]
    ns = local_namespace("psr")
    per_table, per_ps = _embeddings("per_table", ns + "x"), _embeddings("per_ps", ns + "y")
    assert len(per_ps.requests.tables) == 2
    l1, l2 = _sharded_steps(per_table, batches), _sharded_steps(per_ps, batches)
    np.testing.assert_allclose(l2, l1, rtol=1e-6)
    assert l2[-1] < l2[0]
    sizes = [t.shard_sizes() for t in per_ps.storage()]
    assert all(min(s) > 0 for s in sizes), sizes  # every shard of both tables took rows
    _assert_same(_state(per_table), _state(per_ps))


def test_tables_off_the_request_path_keep_tfras():
    """Counted tables (TFRA's apply also counts their updates) and init_rows: all (TFRA's
    initializer) are looked up and applied per table, next to the served ones in one step."""
    schema = tiny_schema("click")
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, ps_requests="per_ps",
                             max_rows={"item": 1000}, fuse_tables=False), schema)
    step = TrainStep(model, MetaConfig(), *make_optimizers(TrainConfig()), LocalSync())
    assert sorted(t.name for t in model.embeddings.requests.tables) == ["city", "tags"]
    step.step(random_batch(schema, seed=0))
    counts = export_variable(model.embeddings.tables[0].frequency)[1]
    assert counts.size > 0 and (counts == 1).all()  # TFRA counted the item rows' first update
    steps = {k: int(v.numpy()) for k, v in model.embeddings.step_counters().items()}
    assert steps == {"item": 1, "city": 1, "tags": 1}
    m2 = DLRM(ModelConfig(embedding_dim=4, init_rows="all", ps_requests="per_ps"), schema)
    TrainStep(m2, MetaConfig(), *make_optimizers(TrainConfig()), LocalSync())
    assert m2.embeddings.requests.tables == []


def test_an_apply_must_follow_its_lookup():
    emb = _embeddings("per_ps", local_namespace("psr"))
    rows = emb.trainable()
    grads = [tf.zeros([0, t.dim]) for t in emb.storage()]
    with pytest.raises(UnmatchedApplyError):
        emb.apply(rows, grads)


def test_slot_tables_missing_beside_a_table_are_refused_naming_it():
    """The PS updates a table's slot rows where its rows are: slot tables not placed shard for
    shard with their table (TFRA places them so; simulated by moving the table's device list)
    are refused up front, naming the table."""
    emb = _embeddings("per_table", local_namespace("psr"))
    emb.tables[0].devices = ["/device:CPU:0"] * 3  # the slot tables stay on "/CPU:0"
    with pytest.raises(RuntimeError) as err:
        PsRequests(emb.tables, emb.optimizers)
    assert "table a" in str(err.value)


def test_auto_sends_requests_only_to_parameter_servers():
    """``auto`` (the default) takes the request path only where tables have PS shards: in one
    process there are no round trips to save (bench: level, 0.93-1.06x). With PS it is
    ``per_ps``, which tests/test_ps_rpcs.py measures at 14 RPCs a step on real PS processes."""
    local = _embeddings("auto", local_namespace("psr"))
    assert local.requests is None
    assert resolve("auto", local.tables) == "per_table"
    assert resolve("per_ps", local.tables) == "per_ps"


def test_config_key_is_validated():
    assert config_from_dict({}).model.ps_requests == "auto"
    assert config_from_dict({"model": {"ps_requests": "per_table"}}).model.ps_requests == "per_table"
    with pytest.raises(ConfigError, match="model.ps_requests"):
        config_from_dict({"model": {"ps_requests": "batched"}})
    with pytest.raises(ValueError):  # built without the config: the same three modes
        Embeddings([], [], [], ps_requests="batched")
