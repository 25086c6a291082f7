"""The network term (plan/network.py), ``gmeta plan --network``, ``cluster.link_rate`` and
``model.hot_split: auto`` (embedding/hot/auto.py): bytes over a link rate, and the verdicts they give."""
import numpy as np
import pytest

from gmeta_tf.config.loader import load_config
from gmeta_tf.config.rates import bit_rate
from gmeta_tf.config.schema import ConfigError, PrepareConfig
from gmeta_tf.data.id_profile import TableProfile
from gmeta_tf.embedding.hot.auto import SPLIT_OVERHEAD, decide, expected_distinct, ps_payload
from gmeta_tf.plan.cost_model import load_cost_model, shard_terms
from gmeta_tf.plan.network import (
    BUSIER_DIRECTION,
    Link,
    NetworkCostModel,
    per_table_factor,
    row_payload_bytes,
    with_network,
)
from gmeta_tf.plan.spec import N_SKEW_BINS, Shard

SKEW = (1.0,) + (0.0,) * (N_SKEW_BINS - 1)


@pytest.mark.fast
def test_link_time_is_bytes_over_rate_and_free_on_loopback():
    assert Link(8 * 10**6, wire_overhead=1.0).ms(10**6) == pytest.approx(1000.0)  # 1 MB at 8 Mbit/s: 1 s
    assert Link(10**9, wire_overhead=1.5).ms(10**6) == pytest.approx(12.0)
    assert Link(None).ms(10**9) == 0.0
    assert Link(None, delay_s=0.001).ms(0, round_trips=3) == pytest.approx(6.0)  # 3 RTTs of 2 x 1 ms
    assert row_payload_bytes(16) == 2 * (16 * 4 + 8)  # read + write, value and key; no optimizer slots


@pytest.mark.fast
def test_network_cost_model_adds_each_ps_link_time_to_the_cpu_cost():
    base = load_cost_model(None)
    assert with_network(base, None) is base  # loopback: the calibrated model unchanged
    net = with_network(base, 100 * 10**6)
    assert isinstance(net, NetworkCostModel)
    shards = [Shard("a", "table", 0, 1, 50_000, 16, 1.0, SKEW),
              Shard("b", "table", 0, 1, 1_000, 32, 2.0, (0.5, 0.5) + (0.0,) * (N_SKEW_BINS - 2))]
    sps = 2 * 16 * 32
    payload = sum(row_payload_bytes(s.dim) * shard_terms(s.rows, s.dim, s.pooling, s.skew, sps)[1] for s in shards)
    want = base.ps_cost(shards, sps) + 1000 * payload * net.link.wire_overhead * 8 / 10**8
    assert net.ps_cost(shards, sps) == pytest.approx(want, rel=1e-9)
    assert net.ps_costs([shards, [], shards[:1]], sps)[1] == 0.0
    assert net.ps_costs([shards], sps)[0] == pytest.approx(want, rel=1e-9)
    # ten times slower a link, ten times the network part
    slow = with_network(base, 10 * 10**6)
    assert slow.ps_cost(shards, sps) - base.ps_cost(shards, sps) == pytest.approx(
        10 * (want - base.ps_cost(shards, sps)), rel=1e-9)


@pytest.mark.fast
def test_each_worker_sends_its_own_ids_and_column_blocks_carry_their_slots():
    base = load_cost_model(None)
    hot = (0.0,) * (N_SKEW_BINS - 4) + (0.2, 0.3, 0.3, 0.2)  # a few ids read very often
    whole = Shard("a", "table", 0, 1, 5_000, 16, 4.0, hot)
    block = Shard("a", "column", 0, 2, 5_000, 8, 4.0, hot)
    net = with_network(base, 10**8, workers=4, optimizer_slots=2)
    per_worker = shard_terms(whole.rows, whole.dim, whole.pooling, whole.skew, 512)[1]
    assert net.payloads([[whole]], 4 * 512) == pytest.approx([4 * per_worker * row_payload_bytes(16)])
    # four workers' requests carry more rows than the union of their ids (one worker's 2,048 samples)
    assert net.payloads([[whole]], 4 * 512)[0] > with_network(base, 10**8).payloads([[whole]], 4 * 512)[0]
    # a column block is on TFRA's per-table path: the row and its two Adam slots, read and written
    assert per_table_factor(2) == pytest.approx(567.2 / 155.9) and per_table_factor(1) < per_table_factor(2)
    assert net.payloads([[block]], 4 * 512) == pytest.approx(
        [4 * per_worker * row_payload_bytes(8) * per_table_factor(2)])
    # four workers: the busier direction of each full-duplex link (half the payload) is its time;
    # one worker: its lookup's rows and its apply's gradients cross one after the other
    assert BUSIER_DIRECTION == 0.5
    assert net.ps_cost([block], 4 * 512) == pytest.approx(
        base.ps_cost([block], 4 * 512) + net.link.ms(0.5 * net.payloads([[block]], 4 * 512)[0]))
    one = with_network(base, 10**8, workers=1)
    assert one.ps_cost([whole], 512) == pytest.approx(
        base.ps_cost([whole], 512) + one.link.ms(one.payloads([[whole]], 512)[0]))


@pytest.mark.fast
def test_link_rate_config_and_hot_split_values_are_checked():
    assert bit_rate("1gbit") == 10**9 and bit_rate("100mbit") == 10**8 and bit_rate("12.5mbps") is None
    assert load_config(None, ["cluster.link_rate=20mbit"]).cluster.link_rate_bit_s == 20 * 10**6
    assert load_config(None, []).cluster.link_rate_bit_s is None
    with pytest.raises(ConfigError, match="cluster.link_rate.*100mbps"):
        load_config(None, ["cluster.link_rate=100mbps"])
    assert load_config(None, ["model.hot_split=auto"]).model.hot_split == "auto"
    assert load_config(None, []).model.hot_split is True
    with pytest.raises(ConfigError, match="model.hot_split.*'sometimes'"):
        load_config(None, ["model.hot_split=sometimes"])


def _profile(name, counts, lookups):
    counts = np.asarray(counts, dtype=np.int64)
    return TableProfile(name=name, method="exact", ids=np.arange(len(counts), dtype=np.int64), counts=counts,
                        lookups=lookups, distinct=len(counts), complete=bool(counts.sum() == lookups))


@pytest.mark.fast
def test_expected_distinct_and_payload_count_only_the_rows_that_travel():
    assert expected_distinct(np.array([10]), 10, 5.0) == pytest.approx(1 - np.exp(-5.0))  # one id, always hit
    assert expected_distinct(np.array([]), 10, 7.0) == pytest.approx(7.0)  # all tail: every lookup distinct
    # 100 equally likely ids, 100 draws: 100 (1 - e^-1) distinct
    assert expected_distinct(np.ones(100), 100, 100.0) == pytest.approx(100 * (1 - np.exp(-1.0)))
    profiles = {"a": _profile("a", [50, 30, 20], 100), "b": _profile("b", [90, 10], 100)}
    dims = {"a": 8, "b": 4}
    bounds = {"a": 20, "b": 10}
    off = ps_payload(profiles, dims, bounds)
    want = (expected_distinct(np.array([50, 30, 20]), 100, 20) * row_payload_bytes(8)
            + expected_distinct(np.array([90, 10]), 100, 10) * row_payload_bytes(4))
    assert off == pytest.approx(want)
    hot = {"a": np.array([0]), "b": np.array([0, 1])}
    on = ps_payload(profiles, dims, bounds, hot, {"b": True})  # b wholly local: no PS request
    assert on == pytest.approx(expected_distinct(np.array([30, 20]), 100, 20, tail=0.0) * row_payload_bytes(8))
    # a profile that saw only its top id (a sketch): the unprofiled half of the lookups is cold
    # and all distinct, and making the top id hot does not move its share to that tail
    top = {"c": _profile("c", [50], 100)}
    assert ps_payload(top, {"c": 8}, {"c": 10}, {"c": np.array([0])}) == pytest.approx(5 * row_payload_bytes(8))


@pytest.mark.fast
def test_auto_turns_the_split_off_on_loopback_and_on_where_bytes_dominate():
    # loopback: bytes are free, only the split's own overhead is left
    d = decide(500_000, 20_000, 40_000, Link(None), workers=2, ps=2, compute_ms=60.0)
    assert not d.on and d.step_ms_on == pytest.approx(60.0 * (1 + SPLIT_OVERHEAD)) and d.step_ms_off == 60.0
    assert "off (no link rate" in d.format(None)
    # 20 Mbit/s: 500 kB a step is ~0.1 s each way, far above the overhead
    d = decide(500_000, 20_000, 40_000, Link(20 * 10**6), workers=2, ps=2, compute_ms=60.0)
    assert d.on and d.step_ms_on < d.step_ms_off
    assert d.format("20mbit").startswith("hot split auto: on (link 20mbit;")
    # a split that saves nothing on the wire (its all-reduce eats the saving) stays off
    assert not decide(500_000, 400_000, 200_000, Link(20 * 10**6), workers=2, ps=2, compute_ms=60.0).on
    # a fast link: 500 kB at 10 Gbit/s is 0.5 ms, below 10% of a 60 ms step
    assert not decide(500_000, 20_000, 40_000, Link(10 * 10**9), workers=2, ps=2, compute_ms=60.0).on
    # a fast worker (GPU: 1 ms a step) makes the same 10 Gbit/s link worth the split (0.2 ms of
    # PS bytes off, 0.04 ms on, against 0.1 ms of the split's CPU)
    assert decide(500_000, 20_000, 40_000, Link(10 * 10**9), workers=2, ps=2, compute_ms=1.0).on


def test_hot_split_false_and_auto_on_loopback_keep_the_plain_path(tmp_path):
    from synthetic_batch import tiny_schema

    from gmeta_tf.config.schema import ModelConfig
    from gmeta_tf.data.id_profile import write_profile
    from gmeta_tf.model.dlrm import DLRM
    from gmeta_tf.train.dense_sync import LocalSync

    schema = tiny_schema("click")
    model = DLRM(ModelConfig(embedding_dim=4, bottom_mlp=[6], top_mlp=[8], seed=1, fuse_tables=False), schema)
    # false: the budget is ignored and the (missing) profile never read
    cfg = load_config(None, ["hot.budget=1MiB", "model.hot_split=false", f"hot.profile={tmp_path / 'none.npz'}"])
    assert model.embeddings.add_hot_tier(cfg, LocalSync()) is None
    profiles = {n: _profile(n, [40, 30, 20, 10], 100) for n in model.table_names}
    write_profile(tmp_path, profiles, {"sample": 1.0})
    logs = []
    base = ["hot.budget=1MiB", f"hot.profile={tmp_path / 'id_profile.npz'}", "model.hot_split=auto"]
    assert model.embeddings.add_hot_tier(load_config(None, base), LocalSync(), log=logs.append) is None
    assert any(line.startswith("hot split auto: off (no link rate") for line in logs), logs
    logs.clear()
    rows = model.embeddings.add_hot_tier(load_config(None, [*base, "cluster.link_rate=10kbit"]), LocalSync(),
                                         log=logs.append)
    assert rows is not None and any(line.startswith("hot split auto: on (link 10kbit;") for line in logs), logs


def test_plan_cli_network_adds_link_time_and_names_it(synth_dir, tmp_path):
    from click.testing import CliRunner

    from gmeta_tf.cli.main import cli
    from gmeta_tf.data.prepare import prepare

    data = tmp_path / "prepared"
    prepare([str(synth_dir)], str(data), PrepareConfig(query=4, max_support=8, min_task_size=30, shards=2))
    costs = {}
    for net in (None, "rate=20mbit"):
        out = tmp_path / f"p-{net}.yaml"
        argv = ["plan", "--data", str(data), "--ps", "2", "--mem-per-ps", "64MiB", "--out", str(out),
                "--algo", "size-greedy"] + (["--network", net] if net else [])
        r = CliRunner().invoke(cli, argv)
        assert r.exit_code == 0, r.output
        costs[net] = float(r.output.split("max predicted cost ")[1].split()[0])
        assert (f"--network {net}" in out.read_text()) == bool(net)
    assert costs["rate=20mbit"] > costs[None] * 1.5, costs
    r = CliRunner().invoke(cli, ["plan", "--data", str(data), "--ps", "2", "--out", str(tmp_path / "x.yaml"),
                                 "--network", "rate=20mbps"])
    assert r.exit_code != 0 and "20mbps" in r.output


def test_the_link_term_counts_the_wire_s_value_bytes_but_a_column_block_s_float32():
    """bfloat16 on the wire (the default) halves a row's values, not its key; a column block goes
    TFRA's per-table path, float32 whatever the wire."""
    base = load_cost_model(None)
    whole = Shard("t", "table", 0, 1, 5000, 16, 2.0, (1.0,) + (0.0,) * (N_SKEW_BINS - 1))
    column = Shard("t", "column", 0, 2, 5000, 16, 2.0, whole.skew)
    f32 = with_network(base, 10**8, workers=2)
    b16 = with_network(base, 10**8, workers=2, value_bytes=2)
    ratio = b16.payloads([[whole]], 1024)[0] / f32.payloads([[whole]], 1024)[0]
    assert ratio == pytest.approx((16 * 2 + 8) / (16 * 4 + 8))
    assert b16.payloads([[column]], 1024) == f32.payloads([[column]], 1024)
