"""PS round trips per step (bench/ps_rpcs.py): counted on real PS processes, they follow the
per-table formula, so fewer table shards on the PS mean fewer RPCs."""
import pytest
from tensorflow.core.framework import graph_pb2

from bench.ps_rpcs import count_rpcs, expected_rpcs
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
    _recv(worker, "rows/_2", PS.format(0), W, "e2")
    _recv(ps0, "ikeys", W, PS.format(0), "e3")
    ps0.node.add(name="fwd", op="Identity", device=PS.format(0), input=["ikeys"])
    ps0.node.add(name="Adam_3/None_lookup_table_insert", op="TFRA>CuckooHashTableInsert", device=PS.format(0),
                 input=["^fwd"])
    _recv(worker, "local", W, W, "e4")
    got = count_rpcs([worker, ps0])
    assert got["ps_component_calls_per_step"] == 1
    assert (got["ps_lookup_transfers_per_step"], got["ps_apply_transfers_per_step"]) == (2, 1)
    assert got["ps_rpcs_per_step"] == 4


@pytest.mark.fast
def test_formula():
    assert expected_rpcs([2] * 7, 2, "missing", 2) == 214
    assert expected_rpcs([2] * 7, 2, "all", 2) == 228
    assert expected_rpcs([1] * 7, 2, "missing", 1) == 121
    assert expected_rpcs([2] * 7, 1, "missing", 2) == 158


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
    sets = ["data.tasks_per_batch=8"]
    runs = measure(str(prepared_2500), 2, {
        "default": sets,
        "placed": [*sets, f"cluster.placement={placement}"],
        "one_ps": [*sets, f"cluster.placement={one_ps}"],
        "all": [*sets, "model.init_rows=all"],
    }, timeout_s=400)
    for name, r in runs.items():
        assert r["ps_rpcs_per_step"] == r["ps_rpcs_formula"], (name, r)
        assert r["ps_component_calls_per_step"] == r["ps_control_transfers_per_step"] == r["ps_holding_tables"]
    assert runs["default"]["shards"] == [2] * 7 and runs["default"]["ps_rpcs_per_step"] == 214
    # per table and shard: 3 lookup transfers, 12 apply transfers (Adam, bp_v2)
    assert runs["default"]["ps_lookup_transfers_per_step"] == 3 * 14
    assert runs["default"]["ps_apply_transfers_per_step"] == 12 * 14
    assert sorted(runs["placed"]["shards"]) == [1] * 6 + [2] * 2
    assert runs["one_ps"]["shards"] == [1] * 7 and runs["one_ps"]["ps_holding_tables"] == 1
    assert (runs["one_ps"]["ps_rpcs_per_step"] < runs["placed"]["ps_rpcs_per_step"]
            < runs["default"]["ps_rpcs_per_step"])
    assert runs["all"]["ps_rpcs_per_step"] == 214 + 14  # TFRA's lookup: one more edge per table shard
