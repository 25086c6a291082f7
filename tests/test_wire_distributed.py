"""``cluster.wire_dtype: bfloat16`` with real processes: a PS (``gmeta ps serve``) and Horovod
ranks over Gloo, on loopback. What crosses to the PS is read from the step's partition graphs
(``bench/ps_rpcs.py``); two workers train the tiny model with the hot split on (both hot-row
exchanges in use) and must learn and stay identical. The casts themselves, in one process:
tests/test_wire.py."""
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from cluster_helpers import LAUNCH_ID_ENV, processes_with_env, rank_summaries, run_gmeta

from gmeta_tf.data.id_profile import profile_ids, write_profile

pytestmark = pytest.mark.integration  # real PS processes and horovodrun

# tests/faults/fault_helpers.py's TINY_SETS (a step of milliseconds), checkpointing once.
TINY = ["data.tasks_per_batch=8", "data.support=8", "data.query=4", "data.shuffle_buffer=64",
        "model.embedding_dim=8", "model.bottom_mlp=[8]", "model.top_mlp=[16]"]
STEPS = 60
# bfloat16 keeps 8 significant bits: one crossing is off by at most 2^-8 of the value, two by 2^-7
ONCE = 2.0 ** -8
TWICE = (1 + ONCE) ** 2 - 1


# Two Horovod ranks, no PS: the dense mean and both hot-row exchanges through the real collectives,
# each rank writing what it got.
_RANK = """
import gmeta_tf, json, sys
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
from gmeta_tf.embedding.hot.sync import HotGradSync
from gmeta_tf.embedding.wire import Wire
from gmeta_tf.train.dense_sync import HorovodSync

hvd.init()
r = hvd.rank()
rng = np.random.default_rng(10 + r)
grads = [tf.constant(rng.uniform(0.5, 2.0, size=s) * 1e-6, tf.float32) for s in [(33, 7), (5,), ()]]
slots = tf.constant([[3, 7, 49, 7], [0, 7, 20, 3]][r], tf.int64)  # 7 twice: summed before the exchange
rows = tf.constant(rng.uniform(0.5, 2.0, size=(4, 4)).astype(np.float32))
out = {"grads": [g.numpy().tolist() for g in grads], "slots": slots.numpy().tolist(), "rows": rows.numpy().tolist()}
for dtype in ("float32", "bfloat16"):
    sync = HorovodSync(hvd, Wire(dtype))
    got = {"mean": [m.numpy().tolist() for m in tf.function(sync.allreduce)(grads)]}
    hot = HotGradSync(sync, {"t": 50}, {"t": 4}, {"t": 4.0})
    for mode in ("dense", "sparse"):
        hot.modes = {"t": mode}
        s, g = tf.function(lambda: hot.aggregate(["t"], [tf.IndexedSlices(rows, slots, [50, 4])])[0])()
        order = np.argsort(s.numpy())
        got[mode] = [s.numpy()[order].tolist(), g.numpy()[order].tolist()]
    out[dtype] = got
# int8 dense gradients (cluster.dense_compression), the stop vote beside them: two steps, rank 0 voting in the 2nd
sync = HorovodSync(hvd, Wire("bfloat16"), dense_compression="int8")
mean = tf.function(lambda v: sync.allreduce_dense(grads, exact=[v]))
out["int8"] = [[m.numpy().tolist() for m in mean(tf.constant(float(r == 0 and t == 1)))] for t in range(2)]
open(sys.argv[1] + f"/rank{r}.json", "w").write(json.dumps(out))
"""


def test_real_collectives_carry_the_wire_and_every_rank_gets_the_same(tmp_path):
    horovodrun = Path(sys.executable).with_name("horovodrun")
    r = subprocess.run([str(horovodrun), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-c", _RANK,
                        str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for dtype in ("float32", "bfloat16", "int8"):
        assert ranks[0][dtype] == ranks[1][dtype], dtype  # identical replicas, bit for bit (JSON floats round-trip)
    assert [step[-1] for step in ranks[0]["int8"]] == [0.0, 0.5]  # the vote exact, no residue the next step
    rel = lambda got, want: np.max(np.abs(np.subtract(got, want)) / np.abs(want))  # noqa: E731
    for k in range(3):
        want = (np.asarray(ranks[0]["grads"][k], np.float64) + np.asarray(ranks[1]["grads"][k], np.float64)) / 2
        assert rel(ranks[0]["float32"]["mean"][k], want) <= 1e-6
        assert rel(ranks[0]["bfloat16"]["mean"][k], want) <= TWICE
        assert np.any(np.asarray(ranks[0]["bfloat16"]["mean"][k]) != np.asarray(ranks[0]["float32"]["mean"][k]))
        # int8 blocks: each of two roundings within half a step of the largest value (all in one block here)
        big = max(np.abs(np.asarray(r["grads"][i], np.float64)).max() for r in ranks for i in range(3))
        assert np.max(np.abs(np.subtract(ranks[0]["int8"][0][k], want))) <= big / 127
    # hot rows: the union of both ranks' slots (exact), each with the mean of its gradients
    want = {}
    for rank in ranks:
        for s, row in zip(rank["slots"], rank["rows"]):
            want[s] = want.get(s, 0.0) + np.asarray(row, np.float64) / 2
    # rounded once on the way to a sparse gather, twice through the dense mean (``mean_on_wire``)
    tolerance = {("float32", "dense"): 1e-6, ("float32", "sparse"): 1e-6,
                 ("bfloat16", "dense"): TWICE, ("bfloat16", "sparse"): ONCE + 1e-6}
    for (dtype, mode), tol in tolerance.items():
        slots, rows = ranks[0][dtype][mode]
        assert slots == sorted(want), (dtype, mode)
        assert rel(rows, [want[s] for s in slots]) <= tol, (dtype, mode)
    assert ranks[0]["float32"]["dense"] == ranks[0]["float32"]["sparse"]  # two ranks: the same sums
    assert ranks[0]["bfloat16"]["dense"][1] != ranks[0]["float32"]["dense"][1]  # it did round


def test_ps_request_rows_and_gradients_cross_as_bfloat16(prepared_2500):
    from bench.ps_rpcs import measure

    runs = measure(str(prepared_2500), 1, {"float32": [*TINY, "cluster.wire_dtype=float32"],
                                          "bfloat16": [*TINY, "cluster.wire_dtype=bfloat16"]},
                   timeout_s=400)
    f32, b16 = runs["float32"]["ps_transfer_dtypes"], runs["bfloat16"]["ps_transfer_dtypes"]
    # one request: ids (int64) and sizes (int32) out, rows back; gradients and step counters out
    assert runs["bfloat16"]["ps_requests"] == 1 and runs["bfloat16"]["per_table_shards"] == []
    assert f32["lookup"] == {"DT_FLOAT": 1, "DT_INT32": 1, "DT_INT64": 1}
    assert f32["apply"] == {"DT_FLOAT": 1, "DT_INT64": 1}
    assert b16["lookup"] == {"DT_BFLOAT16": 1, "DT_INT32": 1, "DT_INT64": 1}
    assert b16["apply"] == {"DT_BFLOAT16": 1, "DT_INT64": 1}
    assert runs["bfloat16"]["ps_rpcs_per_step"] == runs["float32"]["ps_rpcs_per_step"]
    # the same rows trained (ids exact); values a few roundings apart
    fa, fb = runs["float32"]["tables_after_steps"], runs["bfloat16"]["tables_after_steps"]
    assert fa.keys() == fb.keys() and fa
    for key in fa:
        assert fa[key][:2] == fb[key][:2], key


def test_two_workers_on_a_bfloat16_wire_with_int8_dense_gradients_learn_and_stay_identical(prepared_2500, tmp_path):
    """The PS and hot-row paths in bfloat16, the dense gradients as int8 with error feedback
    (``cluster.dense_compression``): every lossy path of the wire at once."""
    profile = tmp_path / "profile"
    profile.mkdir()
    write_profile(profile, profile_ids(prepared_2500), {"sample": 1.0})
    run, launch_id = tmp_path / "run", uuid.uuid4().hex
    args = ["launch", "local", "--workers", "2", "--ps", "1", "--timeout", "400",
            "--config", "configs/quickstart.yaml", "--data", str(prepared_2500), "--out", str(run),
            "--steps", str(STEPS), "--set", "train.log_every=1", "--set", f"train.checkpoint_every={STEPS}",
            "--set", "cluster.wire_dtype=bfloat16", "--set", "cluster.dense_compression=int8",
            "--set", "hot.budget=64KiB",
            "--set", f"hot.profile={profile / 'id_profile.npz'}"]
    for s in TINY:
        args += ["--set", s]
    r = run_gmeta(args, timeout=480, env={LAUNCH_ID_ENV: launch_id})
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert processes_with_env(LAUNCH_ID_ENV, launch_id) == []  # no orphans
    log = r.stdout
    assert "wire bfloat16" in log and "dense gradients int8" in log
    exchange = next(line for line in log.splitlines() if "hot gradient exchange:" in line)
    assert " dense" in exchange and " sparse" in exchange, exchange  # both, each in bfloat16

    ranks = rank_summaries(run)
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["dense_digest"] == ranks[1]["dense_digest"]  # the dense mean: the owners' bits everywhere
    assert ranks[0]["hot_digest"] == ranks[1]["hot_digest"]  # hot rows: the same exchanged gradients
    # it learns: the last 20 steps' losses (rank 0's batches) below the untrained first step's
    losses = [h["loss"] for h in json.loads((run / "train_summary.json").read_text())["history"]]
    assert len(losses) == STEPS and all(np.isfinite(losses))
    assert np.mean(losses[-20:]) < losses[0], losses
