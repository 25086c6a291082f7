"""PS round trips per step (bench/ps_rpcs.py): counted on real PS processes, they follow the
per-table formula, so fewer table shards on the PS mean fewer RPCs; with ``model.ps_requests:
per_ps`` a fixed few per PS request, and the same tables after the same steps. Fused tables
(``model.fuse_tables``) make the PS's hash-table ops a function of its fused tables, not of
the number of features."""
import numpy as np
import pytest
from tensorflow.core.framework import graph_pb2, types_pb2

from bench.features import widen
from bench.ps_rpcs import count_rpcs, expected_hash_ops, expected_rpcs
from gmeta_tf.plan.placement_file import ColumnSplit, write_placement

W = "/job:worker/replica:0/task:0/device:CPU:0"
PS = "/job:ps/replica:0/task:{}/device:CPU:0"


def _recv(g, name, src, dst, tensor):
    n = g.node.add(name=name, op="_Recv", device=dst)
    n.attr["send_device"].s = src.encode()
    n.attr["recv_device"].s = dst.encode()
    n.attr["tensor_name"].s = tensor.encode()
    return n


def _send(g, name, src, dst, tensor, inp):
    n = g.node.add(name=name, op="_Send", device=src, input=[inp])
    n.attr["send_device"].s = src.encode()
    n.attr["recv_device"].s = dst.encode()
    n.attr["tensor_name"].s = tensor.encode()


@pytest.mark.fast
def test_count_rpcs_reads_partition_graphs():
    worker, ps0 = graph_pb2.GraphDef(), graph_pb2.GraphDef()
    # keys to the PS for a find, the rows back; the apply's insert keys; a local edge (not an RPC)
    _recv(ps0, "keys", W, PS.format(0), "e1")
    ps0.node.add(name="None_lookup_table_find/TFRA>Find", op="TFRA>CuckooHashTableFind", device=PS.format(0),
                 input=["keys"])
    _send(ps0, "rows/_1", PS.format(0), W, "e2", "None_lookup_table_find/TFRA>Find")
    _recv(worker, "rows/_2", PS.format(0), W, "e2").attr["tensor_type"].type = types_pb2.DT_BFLOAT16
    _recv(ps0, "ikeys", W, PS.format(0), "e3")
    ps0.node.add(name="fwd", op="Identity", device=PS.format(0), input=["ikeys"])
    ps0.node.add(name="Adam_3/None_lookup_table_insert", op="TFRA>CuckooHashTableInsert", device=PS.format(0),
                 input=["^fwd"])
    _recv(worker, "local", W, W, "e4")
    got = count_rpcs([worker, ps0])
    assert got["ps_component_calls_per_step"] == 1
    assert (got["ps_lookup_transfers_per_step"], got["ps_apply_transfers_per_step"]) == (2, 1)
    assert got["ps_rpcs_per_step"] == 4
    assert (got["ps_lookup_hash_ops_per_step"], got["ps_apply_hash_ops_per_step"]) == (1, 1)
    assert got["ps_transfer_dtypes"] == {"apply": {"DT_INVALID": 1}, "lookup": {"DT_BFLOAT16": 1, "DT_INVALID": 1}}


@pytest.mark.fast
def test_formula():
    assert expected_rpcs([2] * 7, 2, "missing", 2) == 214
    assert expected_rpcs([2] * 7, 2, "all", 2) == 228
    assert expected_rpcs([1] * 7, 2, "missing", 1) == 121
    assert expected_rpcs([2] * 7, 1, "missing", 2) == 158
    assert expected_rpcs([], 2, "missing", 2, requests=2) == 14  # per_ps: 7 tables of one width on 2 PS
    assert expected_rpcs([2], 2, "missing", 2, recorded=2) == 38  # the 7 fused into one, TFRA's path
    assert expected_hash_ops([2] * 7, 2, [False] * 7) == 84
    assert expected_hash_ops([2], 2, [True]) == expected_hash_ops([2], 2, [True]) == 14  # 7 or 14 tables fused


@pytest.mark.integration
def test_rpcs_per_step_on_real_ps_follow_the_tables(prepared_2500, tmp_path):
    from bench.ps_rpcs import measure

    placement = tmp_path / "placement.yaml"
    # 8 TFRA tables, 10 table shards (the quickstart's default: 7 tables, 14 shards)
    write_placement(str(placement), {"item_id": [0, 1], "item_tags": ColumnSplit([[1], [0]]), "user_city": [1],
                                     "hour": [1], "item_category": [0], "user_segment": [0]}, header="test")
    one_ps = tmp_path / "one_ps.yaml"  # every table whole on PS 0: 7 shards
    write_placement(str(one_ps), {n: [0] for n in ["item_id", "item_tags", "user_city", "hour", "item_category",
                                                   "user_segment", "device"]}, header="test")
    wide = widen(str(prepared_2500), 2, str(tmp_path / "x2"))  # every feature twice: 14 tables
    # the default: fused tables (auto), one request per PS (auto); float32 on the wire, so that each
    # way to the PS can be compared to 1e-5 (TFRA's per-table path is float32 whatever the default)
    fused = ["data.tasks_per_batch=8", "cluster.wire_dtype=float32"]
    sets = [*fused, "model.fuse_tables=false"]  # one TFRA table per feature
    per_table = [*sets, "model.ps_requests=per_table"]  # TFRA's lookups and applies, table by table
    adagrad = "train.embedding_optimizer=adagrad"
    runs = measure(str(prepared_2500), 2, {
        "per_table": per_table,
        "placed": [*per_table, f"cluster.placement={placement}"],
        "one_ps": [*per_table, f"cluster.placement={one_ps}"],
        "all": [*sets, "model.init_rows=all"],  # TFRA's initializer: per table, whatever ps_requests says
        "per_ps": sets,
        "per_ps_placed": [*sets, f"cluster.placement={placement}"],
        "fused": fused,
        "fused_x2": [*fused, f"data.path={wide}"],
        "per_table_adagrad": [*per_table, adagrad],
        "fused_tfra_adagrad": [*fused, "model.ps_requests=per_table", adagrad],  # TFRA's apply on the fused table
    }, timeout_s=600)  # one worker process for every run
    for name, r in runs.items():
        assert r["ps_rpcs_per_step"] == r["ps_rpcs_formula"], (name, r)
        assert r["ps_hash_ops_per_step"] == r["ps_hash_ops_formula"], (name, r)
        assert r["ps_component_calls_per_step"] == r["ps_control_transfers_per_step"] == r["ps_holding_tables"]
    assert runs["per_table"]["shards"] == [2] * 7 and runs["per_table"]["ps_rpcs_per_step"] == 214
    # per table and shard: 3 lookup transfers, 12 apply transfers (Adam, bp_v2)
    assert runs["per_table"]["ps_lookup_transfers_per_step"] == 3 * 14
    assert runs["per_table"]["ps_apply_transfers_per_step"] == 12 * 14
    assert sorted(runs["placed"]["shards"]) == [1] * 6 + [2] * 2
    assert runs["one_ps"]["shards"] == [1] * 7 and runs["one_ps"]["ps_holding_tables"] == 1
    assert (runs["one_ps"]["ps_rpcs_per_step"] < runs["placed"]["ps_rpcs_per_step"]
            < runs["per_table"]["ps_rpcs_per_step"])
    assert runs["all"]["ps_rpcs_per_step"] == 214 + 14  # TFRA's lookup: one more edge per table shard
    # per_ps: one request per PS (one row width): ids + sizes out, rows back; gradients + step counters out
    per_ps = runs["per_ps"]
    assert per_ps["ps_requests"] == 2 and per_ps["per_table_shards"] == []
    assert per_ps["ps_rpcs_per_step"] == 14
    assert (per_ps["ps_lookup_transfers_per_step"], per_ps["ps_apply_transfers_per_step"]) == (6, 4)
    # the column-split item_tags stays on TFRA's path (two 1-shard blocks); the 6 plain tables
    # make one request on each PS
    placed = runs["per_ps_placed"]
    assert placed["per_table_shards"] == [1, 1] and placed["ps_requests"] == 2
    assert placed["ps_rpcs_per_step"] < runs["placed"]["ps_rpcs_per_step"]
    # fused: one TFRA table for the 7 (14) features on 2 PS; the same 14 RPCs and 14 hash-table ops
    # a step whatever the number of features; 84 with one table each
    assert runs["fused"]["shards"] == runs["fused_x2"]["shards"] == [2]
    assert (runs["fused"]["logical_tables"], runs["fused_x2"]["logical_tables"]) == (7, 14)
    assert runs["fused"]["ps_hash_ops_per_step"] == runs["fused_x2"]["ps_hash_ops_per_step"] == 14
    assert runs["per_ps"]["ps_hash_ops_per_step"] == 84
    assert runs["fused"]["ps_rpcs_per_step"] == runs["fused_x2"]["ps_rpcs_per_step"] == 14
    assert runs["fused_tfra_adagrad"]["ps_hash_ops_per_step"] == 2 * (2 + 2 + 1)
    # the same tables, slot tables and rows after 4 steps, whichever way the step reached the PS
    for a, b in (("per_table", "per_ps"), ("placed", "per_ps_placed"), ("per_table", "fused"),
                 ("per_table_adagrad", "fused_tfra_adagrad")):
        fa, fb = runs[a]["tables_after_steps"], runs[b]["tables_after_steps"]
        assert fa.keys() == fb.keys() and len(fa) == (8 if a == "placed" else 7) * (2 if "adagrad" in a else 3)
        for key in fa:
            assert fa[key][:2] == fb[key][:2], key  # same ids
            np.testing.assert_allclose(fa[key][2:], fb[key][2:], rtol=1e-5, atol=1e-6, err_msg=key)
