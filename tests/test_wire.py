"""Wire precision (``cluster.wire_dtype``, gmeta_tf/embedding/wire.py) in one process: the casts,
the ids that ride beside values, the dense gradients' mean on the wire, the PS request's lookup
and gradient paths, and the hot exchange's choice by expected bytes. The real collectives and
PS processes: tests/test_wire_distributed.py."""
import threading

import numpy as np
import pytest
import tensorflow as tf
from synthetic_batch import random_batch, tiny_schema

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.schema import ClusterConfig, ConfigError, MetaConfig, ModelConfig, TrainConfig, wire_dtype_for
from gmeta_tf.embedding.collection import Embeddings
from gmeta_tf.embedding.hot.sync import choose_mode, dense_cost, sparse_cost
from gmeta_tf.embedding.naming import local_namespace
from gmeta_tf.embedding.optimizers import TableOptimizers, row_update
from gmeta_tf.embedding.table import EmbeddingTable
from gmeta_tf.embedding.table_files import export_variable
from gmeta_tf.embedding.wire import Wire, WireDtypeError
from gmeta_tf.meta.meta_step import TrainStep
from gmeta_tf.meta.optimizers import make_optimizers
from gmeta_tf.model.dlrm import DLRM
from gmeta_tf.train.dense_sync import LocalSync, mean_on_wire
from gmeta_tf.train.int8_wire import BLOCK, Residuals, dequantize, mean_int8, quantize

BF16 = Wire("bfloat16")
# bfloat16 keeps 8 significant bits: round to nearest is off by at most 2^-8 of the value; a
# value rounded twice (the dense mean: each rank's gradient, then the owner's mean) by 2^-7.
BF16_REL = 2.0 ** -8
BF16_TWICE = (1 + BF16_REL) ** 2 - 1


def _rel(got, want) -> np.ndarray:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.abs(got - want) / np.abs(want)


def _bf16(x) -> np.ndarray:
    return tf.cast(tf.cast(tf.constant(x, tf.float32), tf.bfloat16), tf.float32).numpy()


# -- the key and the casts ----------------------------------------------------------------------
def test_wire_dtype_is_a_checked_config_key():
    assert load_config(None).cluster.wire_dtype == "auto"
    assert load_config("configs/quickstart.yaml").cluster.wire_dtype == "auto"
    assert load_config(None, ["cluster.wire_dtype=float32"]).cluster.wire_dtype == "float32"
    with pytest.raises(ConfigError, match="cluster.wire_dtype"):
        load_config(None, ["cluster.wire_dtype=float16"])
    with pytest.raises(WireDtypeError):
        Wire("float16")


def test_auto_sends_bfloat16_only_over_links_known_to_be_slow():
    """``auto`` (the default): bfloat16 where ``cluster.link_rate`` is 100 Mbit/s or slower, float32
    where the link is faster or unknown (loopback, a cluster that did not say): there the casts
    cost more than the bytes they save (docs/network.md)."""
    def wire(*sets):
        return load_config(None, list(sets)).cluster.wire

    assert wire() == "float32"
    assert wire("cluster.link_rate=1gbit") == "float32"
    assert wire("cluster.link_rate=100mbit") == wire("cluster.link_rate=5mbit") == "bfloat16"
    assert wire("cluster.link_rate=5mbit", "cluster.wire_dtype=float32") == "float32"
    assert wire("cluster.link_rate=10gbit", "cluster.wire_dtype=bfloat16") == "bfloat16"
    assert wire_dtype_for("auto", None) == "float32" and wire_dtype_for("auto", 10**8) == "bfloat16"
    assert wire_dtype_for("auto", 10**8 + 1) == "float32"


def test_no_code_builds_a_wire_from_the_setting_itself():
    """``cluster.wire_dtype`` may say ``auto``, which only ``wire_dtype_for`` (or ``cluster.wire``)
    turns into a dtype; ``Wire("auto")`` raises. Stop 50 found four benches doing it (the
    ``sharding_network`` section died in its calibration)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    raw = re.compile(r"Wire\([^()]*\.wire_dtype\)")
    found = [f"{p.relative_to(root)}:{i}" for d in ("gmeta_tf", "bench", "launch", "ps", "examples")
             for p in sorted((root / d).rglob("*.py")) for i, line in enumerate(p.read_text().splitlines(), 1)
             if raw.search(line)]
    assert found == []


def test_float32_wire_adds_nothing():
    x = tf.constant([[1.0, 2.0]])
    assert Wire().send(x) is x and Wire().receive(x) is x and Wire().value_bytes == 4
    assert LocalSync.wire == Wire()  # one process: nothing crosses a link


def test_bfloat16_round_trip_is_within_its_rounding_and_keeps_small_gradients():
    rng = np.random.default_rng(0)
    # rows (~0.05) down to meta-gradients far below float16's smallest normal (6e-5)
    x = (rng.normal(size=2000) * 10.0 ** rng.uniform(-12, 0, size=2000)).astype(np.float32)
    sent = BF16.send(tf.constant(x))
    assert sent.dtype == tf.bfloat16 and BF16.value_bytes == 2
    back = BF16.receive(sent).numpy()
    assert back.dtype == np.float32
    assert np.max(_rel(back, x)) <= BF16_REL
    assert np.mean(back != x) > 0.9  # it rounded
    assert np.all(back != 0)  # nothing flushed to zero (float16 flushes about a third of these)
    assert np.mean(tf.cast(tf.cast(x, tf.float16), tf.float32).numpy() == 0) > 0.3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ids_packed_beside_values_arrive_exact(dtype):
    wire = Wire(dtype)
    ids = tf.constant([0, 1, 255, 256, 65535, 65536, (1 << 24) + 1, (1 << 31) - 1], tf.int64)
    values = tf.constant(np.random.default_rng(1).normal(size=(8, 3)), tf.float32)
    packed = wire.pack(values, ids)
    assert packed.dtype == wire.tf_dtype and packed.shape == (8, 3 + 4 // wire.value_bytes)
    got_values, got_ids = wire.unpack(packed, 3)
    np.testing.assert_array_equal(got_ids.numpy(), ids.numpy())
    assert got_values.dtype == tf.float32
    if wire.exact:
        np.testing.assert_array_equal(got_values.numpy(), values.numpy())
    else:
        assert np.max(_rel(got_values, values)) <= BF16_REL


# -- the dense gradients' mean ----------------------------------------------------------------
class _Ranks:
    """``n`` ranks' all-to-all and all-gather in one process (threads meeting at a barrier): the
    collectives' contract, to test the arithmetic around them. Horovod's own run in
    tests/test_wire_distributed.py."""

    def __init__(self, n: int):
        self.n, self.barrier, self.box, self.dtypes = n, threading.Barrier(n), [None] * n, set()

    def _exchange(self, rank, x, combine):
        self.box[rank] = x.numpy()
        self.dtypes.add(x.dtype)
        self.barrier.wait()
        out = combine(rank)
        self.barrier.wait()
        return tf.constant(out)

    def alltoall(self, rank):
        return lambda x: self._exchange(rank, x, lambda r: np.stack([b[r] for b in self.box]))

    def allgather(self, rank):
        return lambda x: self._exchange(rank, x, lambda r: np.concatenate(self.box))


def _on_ranks(n: int, run_rank):
    """``run_rank(r, ranks)`` on ``n`` simulated ranks (threads meeting in ``_Ranks``'
    collectives); their results in rank order, any rank's exception re-raised here."""
    ranks, out, errors = _Ranks(n), [None] * n, []

    def run(r):
        try:
            out[r] = run_rank(r, ranks)
        except Exception as e:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(e)
            ranks.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return ranks, out


def _means_on_wire(n: int, grads, size_of):
    """``mean_on_wire`` on ``n`` simulated ranks (threads), each told the ring's size by ``size_of(n)``."""
    return _on_ranks(n, lambda r, ranks: [
        t.numpy() for t in mean_on_wire([tf.constant(g) for g in grads[r]], size_of(n), BF16,
                                        ranks.alltoall(r), ranks.allgather(r))])


def test_mean_on_wire_reads_the_size_when_it_runs_as_it_would_when_traced():
    """An elastic ring's size is a tensor read when the step runs (``HorovodSync.elastic``): the
    same bits as the size known at trace time, for a ring of 3 and the ring of 2 it shrinks to."""
    rng = np.random.default_rng(5)
    shapes = [(4, 5), (7,), ()]
    for n in (3, 2):
        grads = [[(rng.uniform(0.5, 2.0, size=s) * 1e-6).astype(np.float32) for s in shapes] for _ in range(n)]
        _, static = _means_on_wire(n, grads, lambda k: k)
        _, dynamic = _means_on_wire(n, grads, lambda k: tf.constant(k, tf.int32))
        for a, b in zip(static[0], dynamic[0]):
            assert a.shape == b.shape and a.tobytes() == b.tobytes()


def test_mean_on_wire_averages_in_float32_and_gives_every_rank_the_same_bits():
    n, rng = 3, np.random.default_rng(2)
    shapes = [(4, 5), (7,), ()]  # 28 values: not a multiple of the ranks, so the slices are padded
    grads = [[(rng.uniform(0.5, 2.0, size=s) * 1e-6).astype(np.float32) for s in shapes] for _ in range(n)]
    ranks, out = _means_on_wire(n, grads, lambda k: k)
    assert ranks.dtypes == {tf.int16}  # bfloat16 bits: 2 bytes a value on the wire
    for r in range(1, n):
        for a, b in zip(out[0], out[r]):
            assert a.tobytes() == b.tobytes()  # identical replicas
    for k, shape in enumerate(shapes):
        want = np.mean([np.asarray(grads[r][k], np.float64) for r in range(n)], axis=0)
        assert out[0][k].shape == shape and out[0][k].dtype == np.float32
        assert np.max(_rel(out[0][k], want)) <= BF16_TWICE


def test_horovod_reductions_take_no_bfloat16_and_the_wire_moves_int16():
    """Why ``dense_sync`` does not hand Horovod a bfloat16 compressor (its module docstring):
    Horovod 0.28.1 refuses the dtype where the reduction op is built. What it sends instead, in
    the traced graph: all-to-all and all-gather of 16-bit payloads, half the float32 bytes."""
    import horovod.tensorflow as hvd
    from horovod.tensorflow.mpi_ops import MPI_LIB
    from tensorflow.python.framework import op_def_registry

    def takes(op):
        attr = next(a for a in op_def_registry.get(op).attr if a.name == "T")
        return {tf.dtypes.as_dtype(t) for t in attr.allowed_values.list.type}

    for op in ("HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodReducescatter"):
        assert tf.bfloat16 not in takes(op) and tf.float16 in takes(op), op
    assert {tf.int16} <= takes("HorovodAlltoall") & takes("HorovodAllgather") & takes("HorovodGroupedAllgather")
    with pytest.raises(TypeError, match="bfloat16 not in list of allowed values"):
        tf.function(lambda x: MPI_LIB.horovod_allreduce(x, reduce_op=1, prescale_factor=1.0, postscale_factor=1.0)
                    ).get_concrete_function(tf.TensorSpec([4], tf.bfloat16))

    def step(a, b):
        return mean_on_wire([a, b], 2, BF16, hvd.alltoall, hvd.allgather)

    graph = tf.function(step).get_concrete_function(tf.TensorSpec([10, 3], tf.float32),
                                                    tf.TensorSpec([5], tf.float32)).graph
    sent = {op.type: op.inputs[0] for op in graph.get_operations() if op.type.startswith("Horovod")}
    assert sorted(sent) == ["HorovodAllgather", "HorovodAlltoall"]
    assert sent["HorovodAlltoall"].dtype == tf.int16 and sent["HorovodAlltoall"].shape == (2, 18)  # 35 values
    assert sent["HorovodAllgather"].dtype == tf.int16 and sent["HorovodAllgather"].shape == (1, 18)


# -- the PS request's lookup and gradient paths (local tables standing in for a PS) ---------
def _requests(wire: Wire):
    """Two tables of other widths, 3 shards each: a request per width, several shards in each."""
    ns = local_namespace()
    tables = [EmbeddingTable(name, dim, ["/CPU:0"] * 3, ns, 0.05, seed=i, bp_v2=True)
              for i, (name, dim) in enumerate([("a", 4), ("b", 2)])]
    emb = Embeddings(tables, ["a", "b"], [], ps_requests="per_ps")
    emb.use_wire(wire)
    emb.build_slots(TableOptimizers("adam", 0.1))
    return tables, emb.requests


IDS = [tf.constant([3, 17, 5, 1 << 40, 9, 2], tf.int64), tf.constant([7, 11, 2**33 + 1], tf.int64)]


def test_ps_rows_and_row_gradients_cross_in_the_wire_dtype_and_the_ps_keeps_float32():
    looked, received, state, sent_grads = {}, {}, {}, {}
    for dtype in ("float32", "bfloat16"):
        tables, requests = _requests(Wire(dtype))
        seen = []
        update = requests._update
        requests._update = lambda req, grads, steps, update=update, seen=seen: (seen.append(grads),
                                                                                update(req, grads, steps))[1]
        looked[dtype] = [r.numpy() for r in requests.find(tables, IDS)]
        ps_rows = [req.rows for req in requests._requests]
        assert all(r.dtype == tf.float32 for r in ps_rows)  # what the PS keeps for the update
        grads = [tf.constant(np.random.default_rng(3 + i).normal(size=(len(i_), t.dim)) * 1e-3, tf.float32)
                 for i, (t, i_) in enumerate(zip(tables, IDS))]
        sent_grads[dtype] = grads
        assert requests.apply(list(zip(grads, [t.shadow for t in tables]))) == []
        received[dtype] = [g.numpy() for g in seen]
        state[dtype] = {k: export_variable(v) for t in tables
                        for k, v in {t.name: t.variable, **{f"{t.name}.{s}": st for s, st in
                                                           t.slot_tables(requests.optimizers.for_shadow(t.shadow)).items()}}.items()}
        state[dtype]["ps_rows"] = [r.numpy() for r in ps_rows]
    # lookup: the same rows up to bfloat16 rounding, in the same order (ids exact)
    for a, b in zip(looked["float32"], looked["bfloat16"]):
        assert a.shape == b.shape and np.max(_rel(b, a)) <= BF16_REL and np.any(a != b)
        np.testing.assert_array_equal(b, _bf16(a))
    # the PS's own rows are float32 and the same in both runs: nothing it keeps was rounded
    for a, b in zip(state["float32"].pop("ps_rows"), state["bfloat16"].pop("ps_rows")):
        np.testing.assert_array_equal(a, b)
    # gradient: arrives on the PS in float32, rounded once on the way
    for a, b in zip(received["float32"], received["bfloat16"]):
        assert a.dtype == b.dtype == np.float32 and np.max(_rel(b, a)) <= BF16_REL and np.any(a != b)
        np.testing.assert_array_equal(b, _bf16(a))
    # after the apply: the same ids, and the bfloat16 run's rows are float32 math on the rounded
    # gradient; its slots are not bfloat16 values (the optimizer state stayed float32)
    for key in state["float32"]:
        (k32, _), (k16, v16) = state["float32"][key], state["bfloat16"][key]
        np.testing.assert_array_equal(np.sort(k32), np.sort(k16))
        assert sorted(k16.tolist()) == sorted(IDS[0].numpy().tolist() if key.startswith("a") else IDS[1].numpy().tolist())
        if key.endswith(".v"):
            assert np.mean(_bf16(v16) != v16) > 0.9
    grads16 = [_bf16(g) for g in sent_grads["bfloat16"]]
    rows = looked["float32"]  # the PS's rows (the float32 run received them unrounded)
    for t, ids, row, g in zip(("a", "b"), IDS, rows, grads16):
        want, _ = row_update("adam", 0.1, tf.constant(row), {"m": tf.zeros_like(row), "v": tf.zeros_like(row)},
                             tf.constant(g), tf.zeros([len(row), 1], tf.int64))
        keys, values = state["bfloat16"][t]
        got = values[np.argsort(keys)][np.argsort(np.argsort(ids.numpy()))]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-7)


# One lookup and apply of a PS request with the table on a second (virtual) CPU standing in for
# the PS: TensorFlow partitions the step by device exactly as it does for a remote PS, and the
# partition graphs say which device each cast runs on and the dtype of each tensor between them.
# A subprocess: logical devices must be made before TensorFlow starts, and this process's has.
_PLACEMENT = """
import gmeta_tf, json, sys
import tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
from tensorflow.python.eager import context
from gmeta_tf.embedding.collection import Embeddings
from gmeta_tf.embedding.naming import local_namespace
from gmeta_tf.embedding.optimizers import TableOptimizers
from gmeta_tf.embedding.table import EmbeddingTable
from gmeta_tf.embedding.wire import Wire

ps = "/job:localhost/replica:0/task:0/device:CPU:1"
where = lambda d: "ps" if d.endswith("CPU:1") else "worker"
dt = lambda e: tf.dtypes.as_dtype(e).name
for dtype in sys.argv[1:]:
    table = EmbeddingTable("a", 4, [ps] * 2, local_namespace(), 0.05, seed=0, bp_v2=True)
    emb = Embeddings([table], ["a"], [], ps_requests="per_ps")
    emb.use_wire(Wire(dtype))
    emb.build_slots(TableOptimizers("adam", 0.1))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(emb.requests.find([table], [ids])[0]))
        emb.requests.apply([(tape.gradient(loss, table.shadow), table.shadow)])
        return loss

    ctx = context.context()
    ctx.enable_run_metadata()
    step(tf.constant([1, 2, 3, 5, 8], tf.int64))
    graphs = [g for f in ctx.export_run_metadata().function_graphs for g in f.partition_graphs]
    ctx.disable_run_metadata()
    out = {"sent": [], "casts": []}
    for n in (n for g in graphs for n in g.node):
        src, dst = n.attr["send_device"].s.decode(), n.attr["recv_device"].s.decode()
        if n.op == "_Recv" and src != dst:
            out["sent"].append([n.name.split("/")[0], where(src) + ">" + where(dst), dt(n.attr["tensor_type"].type)])
        if n.op == "Cast" and "bfloat16" in (dt(n.attr["SrcT"].type), dt(n.attr["DstT"].type)):
            out["casts"].append([n.name.split("/")[0], where(n.device), dt(n.attr["SrcT"].type) + ">" + dt(n.attr["DstT"].type)])
    print("PLACEMENT " + json.dumps({"wire": dtype, **{k: sorted(v) for k, v in out.items()}}))
"""


def _placement(*dtypes: str) -> dict:
    """``{wire dtype: {"sent": [[scope, direction, dtype]], "casts": [[scope, device, cast]]}}``."""
    import json
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _PLACEMENT, *dtypes], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    lines = [json.loads(x[len("PLACEMENT "):]) for x in r.stdout.splitlines() if x.startswith("PLACEMENT ")]
    assert r.returncode == 0 and len(lines) == len(dtypes), r.stdout[-2000:] + r.stderr[-3000:]
    return {line.pop("wire"): line for line in lines}


def test_casts_run_where_the_tensor_leaves_and_arrives():
    placed = _placement("bfloat16", "float32")
    got, exact = placed["bfloat16"], placed["float32"]
    # rows: narrowed on the PS, widened on the worker; gradients: the other way round
    assert got["casts"] == [["ps_request_apply", "ps", "bfloat16>float32"],
                            ["ps_request_apply", "worker", "float32>bfloat16"],
                            ["ps_request_lookup", "ps", "float32>bfloat16"],
                            ["ps_request_lookup", "worker", "bfloat16>float32"]]
    # what crosses: ids (int64) and sizes (int32) exact, rows and gradients in bfloat16; the
    # float32 left is the end-of-step control edge (a dummy scalar, GroupCrossDeviceControlEdges)
    assert got["sent"] == [["GroupCrossDeviceControlEdges_0", "ps>worker", "float32"],
                           ["ps_request_apply", "worker>ps", "bfloat16"],
                           ["ps_request_apply", "worker>ps", "int64"],
                           ["ps_request_lookup", "ps>worker", "bfloat16"],
                           ["ps_request_lookup", "worker>ps", "int32"],
                           ["ps_request_lookup", "worker>ps", "int64"]]
    assert exact["casts"] == []
    assert exact["sent"] == [s[:2] + ["float32" if s[2] == "bfloat16" else s[2]] for s in got["sent"]]


def _train(wire: Wire, steps=6):
    schema = tiny_schema("click")
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, ps_requests="per_ps"), schema,
                 bp_v2=True)
    model.embeddings.use_wire(wire)
    train = TrainConfig(learning_rate=0.02, embedding_learning_rate=0.05)
    step = TrainStep(model, MetaConfig(algo="maml", inner_steps=1, inner_lr=0.1, adapt="top"),
                     *make_optimizers(train), LocalSync())
    # batches 0, 1, 2, 0, 1, 2: the repeats find the rows earlier steps trained
    losses = [float(step.step(random_batch(schema, T=4, S=5, Q=3, seed=i % 3))["loss"]) for i in range(steps)]
    casts = [op for f in [step._compiled.get_concrete_function(random_batch(schema, T=4, S=5, Q=3, seed=0))]
             for g in [f.graph, *[fn.graph for fn in f.graph._functions.values() if hasattr(fn, "graph")]]
             for op in g.get_operations() if "bfloat16" in str(op.node_def).lower()]
    return losses, casts


def test_bfloat16_wire_learns_and_float32_adds_no_op():
    loss32, casts32 = _train(Wire())
    loss16, casts16 = _train(BF16)
    assert casts32 == []  # the float32 step is the step it was: no bfloat16 anywhere in its graph
    assert {op.type for op in casts16} == {"Cast"}  # rows and gradients, both ways
    assert loss16[3] < loss16[0] and loss16[4] < loss16[1]  # the same batches again, after training
    np.testing.assert_allclose(loss16, loss32, rtol=2e-2)  # a few roundings apart, not another model


# -- the hot exchange: dense or sparse by the bytes each moves ---------------------------------
def test_hot_exchange_costs_count_the_wire_bytes():
    # [K, dim + 1] ring all-reduce vs U rows of dim values and a 4-byte slot, gathered
    assert dense_cost(100, 16, 4) == 2 * 3 / 4 * 100 * 17 * 4
    assert dense_cost(100, 16, 4, value_bytes=2) == 2 * 3 / 4 * 100 * 17 * 2
    assert sparse_cost(10, 16, 4) == 3 * 10 * (16 * 4 + 4)
    assert sparse_cost(10, 16, 4, value_bytes=2) == 3 * 10 * (16 * 2 + 4)
    assert choose_mode(24, 16, 24.0, 2) == "dense"  # every row touched: a tie, all-reduce
    assert choose_mode(24, 16, 23.0, 2) == "sparse"
    # bfloat16 halves the values, not the slots: a near-fully touched table goes dense
    assert choose_mode(24, 16, 23.0, 2, value_bytes=2) == "dense"
    assert choose_mode(24, 16, 1.0, 1) == "local"


class _FourRanks(LocalSync):
    size = 4


def test_hot_exchange_is_chosen_from_the_expected_touched_rows(tmp_path):
    """A small table a step barely touches (one busy id, the rest rare) is gathered: sizing it by
    the lookups a step could make (at least its rows) sent it to the dense all-reduce."""
    from gmeta_tf.data.id_profile import TableProfile, write_profile
    from gmeta_tf.embedding.hot.rows import expected_touched, touched_bounds

    schema = tiny_schema("click")  # item (50 ids), city (5), tags (20, multi-hot)
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, fuse_tables=False), schema)

    def profile(name, counts):
        counts = np.asarray(counts, np.int64)
        return TableProfile(name=name, method="exact", ids=np.arange(len(counts), dtype=np.int64), counts=counts,
                            lookups=int(counts.sum()), distinct=len(counts), complete=True)

    skewed = [1_000_000] + [1] * 49  # a step touches item 0 and, expected, ~0.1 of the others
    write_profile(tmp_path, {"item": profile("item", skewed), "city": profile("city", [10] * 5),
                             "tags": profile("tags", [10] * 20)}, {"sample": 1.0})
    cfg = load_config(None, ["hot.budget=1MiB", f"hot.profile={tmp_path / 'id_profile.npz'}",
                             "hot.prefetch=false", f"data.path={tmp_path / 'no-data'}"])
    rows = model.embeddings.add_hot_tier(cfg, _FourRanks(), log=lambda m: None)
    sync = rows.grad_sync
    bounds = touched_bounds(["item", "city"], ["tags"], cfg.data)
    assert bounds["item"] >= 50  # what the choice used to size the exchange by
    touched = expected_touched(cfg, {t: profile(t, c) for t, c in
                                     [("item", skewed), ("city", [10] * 5), ("tags", [10] * 20)]},
                               rows.hot_set.ids, bounds)
    assert touched["item"] < 3 and touched["city"] == pytest.approx(5, abs=1e-6)
    assert choose_mode(50, 4, bounds["item"], 4) == "dense"  # the old choice
    assert sync.modes == {"item": "sparse", "city": "dense", "tags": "dense"}


# -- int8 dense gradients with error feedback (cluster.dense_compression) -----------------------
def test_dense_compression_is_a_checked_config_key_and_refused_with_an_elastic_ring():
    assert ClusterConfig().dense_compression == "none"
    assert ClusterConfig(dense_compression="int8").dense_compression == "int8"
    with pytest.raises(ConfigError, match="cluster.dense_compression"):
        ClusterConfig(dense_compression="int4")
    with pytest.raises(ConfigError, match="cluster.dense_compression"):
        ClusterConfig(dense_compression="int8", elastic=True)


def test_int8_round_trip_is_within_half_a_step_of_each_blocks_largest_value():
    rng = np.random.default_rng(3)
    w = 3 * BLOCK
    x = (rng.standard_normal((2, w)) * np.repeat([[1e-6, 1.0, 0.0]], BLOCK, axis=1)).astype(np.float32)
    x[1, :BLOCK] *= 1e4  # blocks of very different sizes: each keeps its own scale
    packed = quantize(tf.constant(x))
    assert packed.dtype == tf.int8 and packed.shape == (2, w + 3 * 4)  # 1 byte a value + 4 a block
    got = dequantize(packed, w).numpy()
    half_step = np.repeat(np.abs(x).reshape(2, 3, BLOCK).max(axis=2) / 254, BLOCK, axis=1)
    assert np.all(np.abs(got - x) <= half_step * (1 + 1e-5))
    assert np.all(got[:, 2 * BLOCK:] == 0)  # an all-zero block stays zero
    assert np.any(got != x)  # it did round


def _int8_means(n: int, steps):
    """``mean_int8`` on ``n`` simulated ranks (threads), ``steps[t][r]`` = rank r's (grads, vote) at
    step t, each rank keeping its residuals across steps as a worker does: ``out[t][r]``."""
    def run_rank(r, ranks):
        residuals, got = Residuals(), []
        for grads, vote in (step[r] for step in steps):
            means, votes = mean_int8([tf.constant(g) for g in grads], n, residuals, ranks.alltoall(r),
                                     ranks.allgather(r), exact=[tf.constant(vote, tf.float32)])
            got.append(([m.numpy() for m in means], votes[0].numpy()))
        return got

    ranks, per_rank = _on_ranks(n, run_rank)
    return ranks, [[per_rank[r][t] for r in range(n)] for t in range(len(steps))]


def test_int8_mean_gives_every_rank_the_same_bits_and_the_vote_exact():
    n, rng = 3, np.random.default_rng(4)
    shapes = [(40, 5), (7,), ()]  # 208 values: padded to whole blocks and whole slices
    steps = [[([(rng.standard_normal(s) * 1e-3).astype(np.float32) for s in shapes], float(r == 0 and t == 1))
              for r in range(n)] for t in range(3)]
    ranks, out = _int8_means(n, steps)
    assert ranks.dtypes == {tf.int8}
    for t in range(3):
        for r in range(1, n):
            for a, b in zip(out[t][0][0], out[t][r][0]):
                assert a.tobytes() == b.tobytes()  # identical replicas
        # the vote arrives exact, and no rounding residue leaks into the next step's
        assert [out[t][r][1] for r in range(n)] == [np.float32(1 / 3) if t == 1 else 0.0] * n
    for k, shape in enumerate(shapes):  # the first step: two roundings of at most half a step each
        want = np.mean([steps[0][r][0][k] for r in range(n)], axis=0)
        assert out[0][0][0][k].shape == shape and out[0][0][0][k].dtype == np.float32
        big = max(np.abs(steps[0][r][0][i]).max() for r in range(n) for i in range(len(shapes)))
        assert np.max(np.abs(out[0][0][0][k] - want)) <= big / 127


def test_int8_error_feedback_delivers_what_rounding_dropped_on_later_steps():
    """A value under half a step beside its block's largest rounds to 0 every step on its own; with
    error feedback its sum over the steps arrives within one rounding of the true sum."""
    n, steps = 2, 60
    g = np.full(BLOCK, 1e-3, np.float32)
    g[0] = 1.0  # step 1/127: 1e-3 alone would round to 0
    ranks, out = _int8_means(n, [[([g], 0.0) for _ in range(n)]] * steps)
    sent = np.sum([out[t][0][0][0] for t in range(steps)], axis=0)
    assert abs(sent[1] - steps * 1e-3) <= 2 / 127  # 0.06 true; without the feedback 0
    assert abs(sent[0] - steps) <= 2 / 127
    assert out[0][0][0][0][1] == 0.0  # the first step alone did round it away
